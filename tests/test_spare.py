"""The PostgreSQL branch connection made ahead of time (xasink/dialects/spare.py).

A worker's next branch starts on a spare session made in the background (a branch closes its own session
after PREPARE, so a spare is always fresh).  A spare the server dropped meanwhile must cost nothing but a
reconnect: the branch writes its rows exactly once.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.harness import TargetSink, expected
from tests.targets import Target
from xasink.dialects import shared_dialect
from xasink.dialects.postgres import PostgresDialect
from xasink.protocol.coordinator import Coordinator


@pytest.fixture
def sink(pg: Target) -> TargetSink:
    return TargetSink(pg, prefix="sp")


def _xasink_backends(pg: Target) -> list[tuple[int, str]]:
    return [
        (int(pid), str(state))
        for pid, state in pg.execute(
            "SELECT pid, state FROM pg_stat_activity WHERE application_name = 'xasink' "
            "AND datname = current_database() AND pid <> pg_backend_pid()"
        )
    ]


def test_a_spare_the_server_dropped_is_replaced_and_the_batch_is_written_once(sink: TargetSink, pg: Target) -> None:
    first = sink.prepare(1, range(0, 10), parts=1)  # leaves a spare behind for the next branch
    dialect = shared_dialect(sink.options.url, sink.options.branch_settings)
    assert isinstance(dialect, PostgresDialect), dialect
    assert dialect.spare is not None and dialect.spare._next is not None
    dialect.spare._next.result(30)  # the spare session is up
    idle = [pid for pid, state in _xasink_backends(pg) if state == "idle"]
    assert idle, "no idle spare session to drop"
    for pid in idle:  # the server drops the spare (and idle pooled control connections: they are pinged)
        pg.execute("SELECT pg_terminate_backend(%s)", pid)
    rows = pa.RecordBatch.from_pydict({"id": list(range(10, 20)), "name": [f"n{i}" for i in range(10, 20)]})
    second = sink.task(1, 1, [rows], attempt=99)
    coordinator = Coordinator(sink.options)
    try:
        coordinator.commit(1, [first[0], second])
    finally:
        coordinator.close()
    assert sink.rows() == expected(range(0, 20))
    assert sink.prepared() == []
