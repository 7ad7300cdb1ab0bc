"""Shadow holding a decided batch in the old collation: applied right? and the following write?"""
from common import *
from tests.modes_driver import batch_direct
from xasink.protocol.xid import Xid
from xasink.write_modes.spec import shadow_name, tombstone_name
logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
setup()
coll = sys.argv[1] if len(sys.argv) > 1 else "utf8mb4_bin"
t = "t_" + uuid.uuid4().hex[:6]
ex(f"CREATE TABLE `{t}` (id varchar(10) PRIMARY KEY, name varchar(20), seq bigint) DEFAULT CHARSET=utf8mb4 COLLATE={coll}")
s = sink()
cols = {"id": "string", "name": "string", "seq": "long", "deleted": "boolean"}
O = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
batch_direct(URL, t, s, 0, cols, [[("a", "x", 1, False), ("b", None, 2, True)]], "append", **O)
sh = [r[0] for r in ex("SELECT table_name FROM information_schema.tables WHERE table_schema=%s AND table_name LIKE 'xasink\\_sh\\_%%'", DB)]
tb = [r[0] for r in ex("SELECT table_name FROM information_schema.tables WHERE table_schema=%s AND table_name LIKE 'xasink\\_tb\\_%%'", DB)]
# find ours by log/sink
from xasink.write_modes.spec import shadow_name
import tests.targets as T
for name in sh + tb:
    ex(f"ALTER TABLE `{name}` CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
# batch 1 decided and committed into the shadow, not applied
os.environ["XASINK_FAULT"] = "driver.after_commits:raise:b=1"
try:
    batch_direct(URL, t, s, 1, cols, [[("A", "big", 7, False)], [("c", "cc", 8, False)]], "append", **O)
except Exception as e:
    print("batch1 fault:", type(e).__name__, e)
del os.environ["XASINK_FAULT"]
print("shadow rows pending:", [ex(f"SELECT count(*) FROM `{n}`") for n in sh])
# batch 2: 'a' and 'A' changed again
try:
    batch_direct(URL, t, s, 2, cols, [[("a", "small", 9, False)], [("B", "bb", 9, False)]], "append", **O)
except Exception as e:
    print("batch2 error:", type(e).__name__, str(e)[:300])
print("rows after 2:", sorted(ex(f"SELECT * FROM `{t}`")))
print("collations:", ex("SELECT table_name, column_name, collation_name FROM information_schema.columns WHERE table_schema=%s AND table_name IN %s AND collation_name IS NOT NULL", DB, tuple(sh+tb)))
try:
    batch_direct(URL, t, s, 3, cols, [[("d", "dd", 10, False)]], "append", **O)
except Exception as e:
    print("batch3 error:", type(e).__name__, str(e)[:300])
print("rows after 3:", sorted(ex(f"SELECT * FROM `{t}`")))
print("collations:", ex("SELECT table_name, column_name, collation_name FROM information_schema.columns WHERE table_schema=%s AND table_name IN %s AND collation_name IS NOT NULL", DB, tuple(sh+tb)))
print("tomb:", [ex(f"SELECT * FROM `{n}`") for n in tb])
print("XA RECOVER:", [r for r in xa_recover() if b"rv-" in bytes(r[3]) ] if xa_recover() else [])
