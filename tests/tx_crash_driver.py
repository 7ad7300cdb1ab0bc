"""One multi-target ``xasink.transaction`` in a fresh local Spark driver, for tests/test_transaction_crash.py
to kill at a fault point.

    python tests/tx_crash_driver.py PG_URL MARIA_URL ORDERS LINES EVENTS SINK_ID BATCH_ID JOURNAL

Writes ids 0..9 into ORDERS and 100..119 into LINES (PostgreSQL) and 200..204 into EVENTS (MariaDB), two
partitions each, in one transaction whose decision log is in JOURNAL ("pg" or "maria").  The fault comes
from ``XASINK_FAULT``; the script puts its process group in ``XASINK_FAULT_PGID`` first, so a fault point
takes the whole driver down at once (this Python, the JVM, its workers), like a crashed machine.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main(argv: list[str]) -> int:
    if len(argv) != 8:
        print(__doc__, file=sys.stderr)
        return 2
    pg_url, maria_url, orders, lines, events, sink, batch, journal = argv
    from tests.jvm import driver_java_options, local_spark, start_killable_driver

    start_killable_driver()

    import xasink

    spark = local_spark("xasink-tx-crash-driver", java_options=driver_java_options())

    def frame(lo: int, hi: int):  # type: ignore[no-untyped-def]
        return spark.range(lo, hi, 1, 2).selectExpr("cast(id as int) as id", "concat('n', id) as name")

    try:
        journal_url = maria_url if journal == "maria" else pg_url
        with xasink.transaction(sink_id=sink, batch_id=int(batch), journal_url=journal_url) as tx:
            tx.write(frame(0, 10), pg_url, orders)
            tx.write(frame(100, 120), pg_url, lines)
            tx.write(frame(200, 205), maria_url, events)
        assert tx.result is not None
        print(json.dumps({"rows": tx.result.rows, "skipped": tx.result.skipped}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
