from common import *
from tests.modes_driver import batch_direct
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
setup()
t = "t_" + uuid.uuid4().hex[:6]
ex(f"CREATE TABLE `{t}` (id varchar(10) PRIMARY KEY, name varchar(20), seq bigint) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci")
s = sink()
cols = {"id": "string", "name": "string", "seq": "long", "deleted": "boolean"}
O = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
batch_direct(URL, t, s, 0, cols, [[("x", "x", 1, False)]], "append", **O)
names = [r[0] for r in ex("SELECT table_name FROM information_schema.tables WHERE table_schema=%s AND table_name LIKE 'xasink\\_%%' ORDER BY create_time DESC", DB)]
tb = [n for n in names if n.startswith("xasink_tb_")][:1]
ex(f"ALTER TABLE `{tb[0]}` CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
ex(f"INSERT INTO `{tb[0]}` VALUES ('ß', 5), ('ss', 6)")
for b in (1, 2):
    try:
        batch_direct(URL, t, s, b, cols, [[("y", "y", 7, False)]], "append", **O)
        print(f"batch {b} ok")
    except Exception as e:
        print(f"batch {b} error:", type(e).__name__, str(e)[:250])
print(sorted(ex(f"SELECT * FROM `{t}`")), ex(f"SELECT * FROM `{tb[0]}`"))
