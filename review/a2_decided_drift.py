from common import *
from sparklike import spark_like
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
setup()
coll = sys.argv[1] if len(sys.argv) > 1 else "utf8mb4_bin"
t = "t_" + uuid.uuid4().hex[:6]
ex(f"CREATE TABLE `{t}` (id varchar(10) PRIMARY KEY, name varchar(20), seq bigint) DEFAULT CHARSET=utf8mb4 COLLATE={coll}")
s = sink()
cols = {"id": "string", "name": "string", "seq": "long", "deleted": "boolean"}
O = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
spark_like(URL, t, s, 0, cols, [[("a", "x", 1, False), ("b", None, 2, True)]], "append", **O)
from xasink.write_modes.spec import shadow_name, tombstone_name
from tests.targets import mariadb_rows
# find this sink's tables: newest created
names = [r[0] for r in ex("SELECT table_name FROM information_schema.tables WHERE table_schema=%s AND table_name LIKE 'xasink\\_%%' ORDER BY create_time DESC", DB)]
import sqlalchemy as sa
sh = [n for n in names if n.startswith("xasink_sh_")][:1]
tb = [n for n in names if n.startswith("xasink_tb_")][:1]
for name in sh + tb:
    ex(f"ALTER TABLE `{name}` CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
os.environ["XASINK_FAULT"] = "driver.after_commits:raise:b=1"
try:
    spark_like(URL, t, s, 1, cols, [[("A", "big", 7, False)], [("c", "cc", 8, False)]], "append", **O)
except Exception as e:
    print("batch1 fault:", type(e).__name__)
del os.environ["XASINK_FAULT"]
for name in sh + tb:
    ex(f"ALTER TABLE `{name}` CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
print("pending in shadow:", ex(f"SELECT count(*) FROM `{sh[0]}`"))
for b, parts in [(2, [[("a", "small", 9, False)], [("A", "BIG", 9, False)]]), (3, [[("d", "dd", 10, False)], [("D", "DD", 10, False)]])]:
    try:
        spark_like(URL, t, s, b, cols, parts, "append", **O)
    except Exception as e:
        print(f"batch{b} error:", type(e).__name__, str(e)[:300])
    print(f"rows after {b}:", sorted(ex(f"SELECT * FROM `{t}`")))
    print("  collations:", ex("SELECT table_name, column_name, collation_name FROM information_schema.columns WHERE table_schema=%s AND table_name IN %s AND collation_name IS NOT NULL", DB, tuple(sh+tb)))
print("XA RECOVER:", xa_recover())
