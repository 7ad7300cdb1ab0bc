"""A user's script whose Spark Python workers run a Python without xasink, for tests/test_user_warnings.py.

    python tests/bare_python_driver.py URL TABLE WORKER_PYTHON

Writes ids 0..9 with ``xasink.write`` and with ``df.write.format("xasink")`` (inside ``xasink.spark_errors()``)
while ``PYSPARK_PYTHON`` names WORKER_PYTHON, and prints each write's exception as ``RAISED <json>``.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main(argv: list[str]) -> int:
    url, table, worker_python = argv
    os.environ["PYSPARK_PYTHON"] = worker_python  # what a user gets who never set it: a Python without xasink
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    import xasink
    from tests.jvm import driver_java_options, local_spark

    spark = local_spark("xasink-bare-python-driver", java_options=driver_java_options())
    xasink.register(spark)
    df = spark.range(0, 10, 1, 2).selectExpr("cast(id as int) as id", "concat('n', id) as name")

    def by_format() -> None:
        with xasink.spark_errors():
            df.write.format("xasink").option("url", url).option("dbtable", table).mode("append").save()

    for how, write in (("write", lambda: xasink.write(df, url, table)), ("format", by_format)):
        try:
            write()
            print("RAISED " + json.dumps([how, None, ""]), flush=True)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            print("RAISED " + json.dumps([how, type(exc).__name__, str(exc)]), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
