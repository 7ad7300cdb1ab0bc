#!/bin/sh
# A Spark Python worker's interpreter (PYSPARK_PYTHON) without Spark's own pyspark.zip and py4j zip on
# PYTHONPATH: the installed PySpark, the same release byte-compiled at install, then imports in half the CPU.
# A Spark Connect server's foreachBatch worker must connect back within Spark's fixed 10 s; importing
# pyspark.sql.connect from the zip compiles it from source each time (2.2 s of CPU against 1.1 s here), which
# a loaded CI machine stretched past 10 s (tests/test_connect.py).
PYTHONPATH=$(printf '%s' "${PYTHONPATH:-}" | tr ':' '\n' | grep -v '/pyspark/python/lib/[^/]*\.zip$' | paste -sd: -)
export PYTHONPATH
exec "$XASINK_WORKER_PYTHON" "$@"
