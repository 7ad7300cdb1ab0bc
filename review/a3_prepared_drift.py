"""Drifted (empty) shadow while a decided batch's branches are still prepared (driver died after the decision,
under an earlier xasink that never mended): does the next write's plan hang on the DROP?"""
from common import *
from sparklike import spark_like
import xasink.write_modes.statements as st
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
setup()
t = "t_" + uuid.uuid4().hex[:6]
ex(f"CREATE TABLE `{t}` (id varchar(10) PRIMARY KEY, name varchar(20), seq bigint) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin")
s = sink()
cols = {"id": "string", "name": "string", "seq": "long", "deleted": "boolean"}
O = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
spark_like(URL, t, s, 0, cols, [[("a", "x", 1, False)]], "append", **O)
names = [r[0] for r in ex("SELECT table_name FROM information_schema.tables WHERE table_schema=%s AND table_name LIKE 'xasink\\_%%' ORDER BY create_time DESC", DB)]
sh = [n for n in names if n.startswith("xasink_sh_")][:1]
tb = [n for n in names if n.startswith("xasink_tb_")][:1]
for name in sh + tb:
    ex(f"ALTER TABLE `{name}` CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
real = st._collation_drift
st._collation_drift = lambda *a: []   # an earlier xasink: no mend
os.environ["XASINK_FAULT"] = "driver.after_decide:raise:b=1"
try:
    spark_like(URL, t, s, 1, cols, [[("A", "big", 7, False)], [("c", "cc", 8, False)]], "append", **O)
except Exception as e:
    print("batch1 fault:", type(e).__name__)
del os.environ["XASINK_FAULT"]
st._collation_drift = real
print("XA RECOVER:", xa_recover())
import time, threading; t0 = time.time()
if len(sys.argv) > 1 and sys.argv[1] == "race":
    from xasink.ops import survey
    def rec():
        time.sleep(3)
        r = survey.recover(URL, sink_id=s, older_than_s=0)
        print("recover:", r)
    th = threading.Thread(target=rec); th.start()
try:
    spark_like(URL, t, s, 2, cols, [[("a", "small", 9, False)], [("A", "BIG", 9, False)]], "append", **O)
except Exception as e:
    print("batch2 error:", type(e).__name__, str(e)[:300])
print("batch2 took", time.time() - t0)
print("rows:", sorted(ex(f"SELECT * FROM `{t}`")))
print("XA RECOVER:", xa_recover())
