"""A multi-target transaction's driver SIGKILLed at each protocol step, then recovered from each side.

tests/tx_crash_driver.py runs ``xasink.transaction`` over two PostgreSQL tables and one MariaDB table in
its own Spark driver; a fault point kills the whole driver (its Python, the JVM, the workers).  The test
checks the kill landed where meant (prepared, decided, partly committed), that a recovery of a database
without the log (no ``journal_url``) shows the branches as another log's and touches none, then recovers
each database against the one log: every table then holds exactly all of its rows (decided) or exactly
none (undecided), and nothing of the sink is prepared on either server.
"""

from __future__ import annotations

import signal
import threading
import uuid
from pathlib import Path

import pytest

from tests.cluster import wait_for
from tests.harness import expected, run_driver, three_tables
from tests.targets import Target
from xasink.ops import survey as admin
from xasink.ops.status import status as xasink_status
from xasink.protocol import judgement
from xasink.protocol.xid import Xid

pytestmark = [pytest.mark.crash, pytest.mark.mariadb, pytest.mark.usefixtures("driver_cds")]

DRIVER = Path(__file__).resolve().parent / "tx_crash_driver.py"
BATCH = 11


def table_rows(t: Target, table: str) -> list[tuple[object, ...]]:
    return t.rows(table) if t.table_exists(table) else []


@pytest.mark.parametrize(
    ("point", "journal"),
    [
        ("tx.after_write:p=0", "pg"),  # the first write prepared, the others not written: nothing commits
        # every write prepared, no decision: nothing commits
        pytest.param("tx.after_write:p=2", "maria", marks=pytest.mark.core),
        ("driver.after_decide", "pg"),  # decided, nothing committed: everything commits
        # decided, the first database partly committed
        pytest.param("driver.after_first_commit", "maria", marks=pytest.mark.core),
    ],
)
def test_killed_transaction_is_all_or_nothing_after_recovery_of_each_database(
    pg: Target, maria: Target, tmp_path: Path, point: str, journal: str
) -> None:
    orders, lines, events = three_tables(pg, maria)
    sink = f"txc{uuid.uuid4().hex[:8]}"
    log = tmp_path / "driver.log"
    code = run_driver(
        DRIVER, [pg.url, maria.url, orders, lines, events, sink, str(BATCH), journal], f"{point}:kill", log
    )
    assert code == -signal.SIGKILL, log.read_text(errors="replace")[-3000:]
    decided = point.startswith("driver.")
    log_db, other_db = (pg, maria) if journal == "pg" else (maria, pg)

    # what the kill left: prepared branches, not (all) visible
    prepared = {t.id: [Xid.parse(g) for g in t.prepared(sink)] for t in (pg, maria)}
    if point == "tx.after_write:p=0":
        assert len(prepared["pg"]) == 2 and prepared["mariadb"] == []
    elif point != "driver.after_first_commit":
        assert len(prepared["pg"]) == 4 and len(prepared["mariadb"]) == 2
    assert table_rows(maria, events) == []  # the MariaDB write is never the first committed
    log_ids = {x.log_id for xs in prepared.values() for x in xs if x is not None}
    assert len(log_ids) == 1  # every branch, in either database, names the one log

    # the other database without the log: its branches are another log's, shown and never touched
    before = sorted(other_db.prepared(sink))
    report = admin.recover(other_db.url, sink_id=sink, older_than_s=0)
    assert sorted(other_db.prepared(sink)) == before
    for e in report.entries:
        if e.sink_id == sink:
            assert e.log_id in log_ids and e.action in (judgement.IGNORE_OTHER_LOG, judgement.IGNORE_UNKNOWN_SINK), e

    # recovery from the log's side, then from the other database's side against the log
    admin.recover(log_db.url, sink_id=sink, older_than_s=0)
    other = admin.recover(other_db.url, sink_id=sink, older_than_s=0, journal_url=log_db.url)
    assert other.errors == [], other.errors

    if decided:
        assert table_rows(pg, orders) == expected(range(10))
        assert table_rows(pg, lines) == expected(range(100, 120))
        assert table_rows(maria, events) == expected(range(200, 205))
        (state,) = log_db.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink)
        assert state == ("committed",)  # every database's part finished: the batch is marked
        status = xasink_status(log_db.url, sink_id=sink)
        (recent,) = status.sinks[0].recent
        assert sorted(t["table"] for t in recent["targets"]) == sorted([orders, lines, events])
    else:
        assert table_rows(pg, orders) == [] and table_rows(pg, lines) == [] and table_rows(maria, events) == []
        assert log_db.execute("SELECT count(*) FROM xasink_batches WHERE sink_id = %s", sink) == [(0,)]
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []


def test_two_databases_recovered_at_once_mark_the_transaction_committed(
    pg: Target, maria: Target, tmp_path: Path
) -> None:
    """Recoveries of the two databases of one decided transaction, side by side: whichever marks its part
    last must see the other's mark and mark the batch committed, or it stays in doubt forever.

    The test holds the log's part rows locked until both recoveries have read the parts and wait (on those
    rows, or on the sink lock a serialized mark takes), then lets them go together.
    """
    orders, lines, events = three_tables(pg, maria)
    sink = f"txc{uuid.uuid4().hex[:8]}"
    log = tmp_path / "driver.log"
    code = run_driver(
        DRIVER, [pg.url, maria.url, orders, lines, events, sink, str(BATCH), "pg"], "driver.after_decide:kill", log
    )
    assert code == -signal.SIGKILL, log.read_text(errors="replace")[-3000:]
    assert pg.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink) == [("committing",)]

    errors: list[BaseException] = []

    def recover(url: str, journal_url: str | None) -> None:
        try:
            report = admin.recover(url, sink_id=sink, older_than_s=0, journal_url=journal_url)
            assert report.errors == [], report.errors
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    with pg.connect() as holder, holder.cursor() as cur:
        holder.autocommit = False
        cur.execute("SELECT 1 FROM xasink_parts WHERE sink_id = %s FOR UPDATE", (sink,))
        threads = [
            threading.Thread(target=recover, args=(pg.url, None)),
            threading.Thread(target=recover, args=(maria.url, pg.url)),
        ]
        for t in threads:
            t.start()
        # both read the parts and now wait to mark theirs
        wait_for(lambda: len(pg.lock_waiters()) == 2, 60, "both recoveries to wait on the held parts")
        holder.commit()
    for t in threads:
        t.join(120)
    assert errors == []
    assert table_rows(pg, orders) == expected(range(10)) and table_rows(pg, lines) == expected(range(100, 120))
    assert table_rows(maria, events) == expected(range(200, 205))
    assert pg.execute("SELECT committed FROM xasink_parts WHERE sink_id = %s", sink) == [(True,)] * 3
    assert pg.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink) == [("committed",)]
    assert xasink_status(pg.url, sink_id=sink).sinks[0].in_doubt_batches == []
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []
