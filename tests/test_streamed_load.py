"""MariaDB's streamed LOAD DATA LOCAL (xasink/dialects/mysql/stream.py) against a producer that pauses between
batches, as a Spark task does while it computes the next one: the statement stays open across the pause, so
the server's limits on one statement (``net_read_timeout``, 30 s by default; MariaDB's ``max_statement_time``)
must not cut it.  Loading a file, as before the stream, never made the server wait on the client."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from tests.targets import mariadb_connect, mariadb_prepared_gids, mariadb_rows
from xasink.dialects.mysql.dialect import MySQLDialect
from xasink.errors import BranchError
from xasink.options import parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import new_run_nonce
from xasink.write_modes.schema import plan_target

SCHEMA = pa.schema([("id", pa.int64()), ("val", pa.string())])
PAUSE_S = 3.0


def _batch(first: int, count: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": range(first, first + count), "val": ["v"] * count}, schema=SCHEMA)


def _slow_batches() -> Iterator[pa.RecordBatch]:
    yield _batch(0, 500)
    time.sleep(PAUSE_S)  # the next batch is still being computed
    yield _batch(500, 500)


@pytest.mark.parametrize(
    "limit",
    ["net_read_timeout = 1", "max_statement_time = 1"],
    ids=["net_read_timeout", "max_statement_time"],
)
def test_a_pause_between_batches_longer_than_the_servers_statement_limits_still_loads(
    mariadb_url: str, monkeypatch: pytest.MonkeyPatch, limit: str
) -> None:
    """Sessions that start with a short limit (the server's setting, or a DBA's): the branch loads every row."""
    original = MySQLDialect.connect_args

    def connect_args(self: MySQLDialect) -> dict[str, Any]:
        return {**original(self), "init_command": f"SET SESSION {limit}"}

    monkeypatch.setattr(MySQLDialect, "connect_args", connect_args)
    table = f"t_{uuid.uuid4().hex[:8]}"
    with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, val VARCHAR(20)) ENGINE=InnoDB")
    opts = parse_options(
        {"url": mariadb_url, "dbtable": table, "sinkId": f"sl{uuid.uuid4().hex[:10]}", "localInfile": "true"}
    )
    coordinator = Coordinator(opts)
    try:
        coordinator.preflight(1)
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, opts, SCHEMA)
        outcome = write_partition(
            opts, plan, batch_id=0, partition=0, task_attempt_id=0, run=new_run_nonce(), batches=_slow_batches()
        )
        assert outcome.rows == 1000
        assert coordinator.commit(0, [outcome]).rows == 1000
        assert mariadb_rows(mariadb_url, table) == [(i, "v") for i in range(1000)]
        assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []
    finally:
        coordinator.close()
        with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")


def test_a_connection_lost_mid_stream_is_named_as_such(mariadb_url: str) -> None:
    """The branch's connection killed while its LOAD DATA streams: the error says the connection was lost
    (not pymysql's own failure to write its end-of-data packet afterwards), nothing is visible or prepared."""
    table = f"t_{uuid.uuid4().hex[:8]}"
    with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, val VARCHAR(20)) ENGINE=InnoDB")
    opts = parse_options({"url": mariadb_url, "dbtable": table, "sinkId": f"sl{uuid.uuid4().hex[:10]}"})

    def killed_midway() -> Iterator[pa.RecordBatch]:
        yield _batch(0, 500)
        time.sleep(0.5)
        with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT id FROM information_schema.processlist WHERE info LIKE 'LOAD DATA%{table}%'")
            ids = [r[0] for r in cur.fetchall()]
            assert len(ids) == 1, ids
            cur.execute(f"KILL {ids[0]}")
        time.sleep(0.5)
        for k in range(1, 200):
            yield _batch(k * 500, 500)

    coordinator = Coordinator(opts)
    try:
        coordinator.preflight(1)
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, opts, SCHEMA)
        with pytest.raises(BranchError, match=r"Lost connection .*\[2013\]"):
            write_partition(
                opts, plan, batch_id=0, partition=0, task_attempt_id=0, run=new_run_nonce(), batches=killed_midway()
            )
        assert mariadb_rows(mariadb_url, table) == []
        assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []
    finally:
        coordinator.close()
        with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")
