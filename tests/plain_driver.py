"""A user's plain PySpark script, for tests/test_user_warnings.py to read its standard error.

    python tests/plain_driver.py URL FORMAT_TABLE WRITE_TABLE SINK

Writes ids 0..9 with ``df.write.format("xasink")`` into FORMAT_TABLE as batch 1 of SINK, runs that write again
(a rerun of a committed batch), then writes them with ``xasink.write`` into WRITE_TABLE, and prints the last's
``WriteResult.warnings`` as ``WARNINGS <json>`` on standard output.
Like a user's script it sets up no logging: whatever xasink has to say must reach standard error by itself.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main(argv: list[str]) -> int:
    url, format_table, write_table, sink = argv
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    import xasink
    from tests.jvm import driver_java_options, local_spark

    spark = local_spark("xasink-plain-driver", java_options=driver_java_options())
    xasink.register(spark)
    df = spark.range(0, 10, 1, 2).selectExpr("cast(id as int) as id", "concat('n', id) as name")
    writer = df.write.format("xasink").option("url", url).option("dbtable", format_table).mode("append")
    writer.option("sinkId", sink).option("batchId", 1).save()
    writer.option("sinkId", sink).option("batchId", 1).save()  # a rerun: nothing written, said so
    print("FORMAT DONE", flush=True)
    result = xasink.write(df, url, write_table)
    print("WARNINGS " + json.dumps(list(result.warnings)), flush=True)
    print("TIMINGS " + json.dumps(result.timings), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
