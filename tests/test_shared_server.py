"""Two decision logs on one server (issue 15, item 4): each finishes only its own branches.

XA branches are server-wide on MariaDB, and ``pg_prepared_xacts`` spans every database of a PostgreSQL
cluster, so a staging and a production job (two table prefixes, schemas or databases) that use the same
sinkId see each other's branches.  Every branch carries the id of the log that owns it; only that log
commits or rolls it back.  The scenario that lost rows before log ids: writer A decides a batch and its
driver dies before committing; writer B (another log, the same sinkId and batch id, its own table)
writes, sweeping as it goes; then recovery of A must still find A's decided branches and commit them.
"""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest

from tests.harness import BATCH, PARTITIONS, N, expected, run_crash_driver
from tests.leaks import run_cli
from tests.procs import tail
from tests.targets import Target
from xasink.protocol.judgement import IGNORE_OTHER_LOG
from xasink.protocol.xid import Xid

pytestmark = pytest.mark.crash


def _prefix(tag: str) -> str:
    return f"xa_{tag}_{uuid.uuid4().hex[:6]}_"


def _ours(db: Target, sink: str) -> list[Xid]:
    return [x for x in (Xid.parse(g) for g in db.prepared(sink)) if x is not None]


def test_another_log_on_the_same_server_never_touches_a_decided_batch(db: Target, tmp_path: Path) -> None:
    table_a, table_b = db.new_table(), db.new_table()
    sink = f"shared-{uuid.uuid4().hex[:6]}"
    log_a, log_b = {"journalTablePrefix": _prefix("a")}, {"journalTablePrefix": _prefix("b")}

    # A decides and dies before any COMMIT: its branches are prepared and listed in A's decision
    code = run_crash_driver(
        db.url, table_a, sink, "driver.after_decide", tmp_path / "a.log", direct=True, options=log_a
    )
    assert code == -signal.SIGKILL, f"writer A was not killed after its decision:\n{tail(tmp_path / 'a.log')}"
    a_branches = _ours(db, sink)
    assert len(a_branches) == PARTITIONS and len({x.log_id for x in a_branches}) == 1
    assert db.rows(table_a) == []

    # B: the same sinkId and batch id in another log; its claim, its sweep and its commit must leave A's alone
    code = run_crash_driver(db.url, table_b, sink, "none", tmp_path / "b.log", direct=True, options=log_b)
    assert code == 0, tail(tmp_path / "b.log")
    assert db.rows(table_b) == expected(range(N))
    assert sorted(_ours(db, sink)) == sorted(a_branches)

    # B's recovery lists A's branches as another log's and leaves them prepared
    cli = run_cli("recover", "--url", db.url, "--journal-prefix", log_b["journalTablePrefix"], "--json")
    report = json.loads(cli.stdout)
    theirs = [e for e in report["entries"] if e["sink_id"] == sink]
    assert {e["gid"] for e in theirs} == {x.gid for x in a_branches}
    assert all(e["action"] == IGNORE_OTHER_LOG and not e["ours"] for e in theirs), theirs
    assert all(e["log_id"] == a_branches[0].log_id for e in theirs)
    assert sorted(_ours(db, sink)) == sorted(a_branches)

    # A's recovery commits A's decided batch: every row once, nothing prepared, B untouched
    cli = run_cli("recover", "--url", db.url, "--journal-prefix", log_a["journalTablePrefix"], "--json")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert json.loads(cli.stdout)["finished_batches"] == {sink: [BATCH]}
    assert db.rows(table_a) == expected(range(N))
    assert db.rows(table_b) == expected(range(N))
    assert _ours(db, sink) == []
