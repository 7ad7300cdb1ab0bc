"""The MySQL/MariaDB dialect against the machine's MariaDB: what only this dialect has.

Both load paths (LOAD DATA LOCAL and multi-row INSERT) and the TSV escaping, exact round trips of values
PostgreSQL cannot hold (NUL in text), MariaDB's error codes and their classification, XA RECOVER parsing
and naming, detached sessions, storage engines, reflected types and DDL.  The tests drive the executor
and driver pieces directly (branch.write_partition, Coordinator), as a Spark job would, without Spark.
Every test checks exact row sets, and the autouse leak check fails a test that leaves a branch of its
sinks prepared.

The Spark-level behaviour common to both dialects (atomicity, task retries, driver crashes, idempotent
reruns, foreign transactions, type round trips, lock waits on a killed driver's branches, streaming
crashes) runs on MariaDB through the ``db`` fixture: tests/test_spark_writer.py, test_crash.py,
test_types.py and test_stream_crash.py.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pymysql
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.schema import CreateTable

from tests.targets import (
    mariadb_connect,
    mariadb_make_foreign_prepared,
    mariadb_prepared_gids,
    mariadb_recover,
    mariadb_rollback_xa,
    mariadb_rows,
    mariadb_wait_detached,
)
from xasink.dialects import dialect_for
from xasink.dialects.mysql import (
    BranchBusyError,
    MySQLDialect,
    encode_tsv,
    foreign_gid,
    owner_lock,
    parse_foreign_gid,
    parse_recover_row,
    text_column,
    xid_literal,
)
from xasink.dialects.values import ErrorKind, TargetPlan
from xasink.errors import BranchError, ConnectError, PreflightError
from xasink.journal.layout import journal_metadata, parts_table
from xasink.options import WriteOptions, parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import FORMAT_ID, Xid, new_run_nonce
from xasink.results import BranchOutcome
from xasink.support.faults import InjectedFault
from xasink.write_modes.schema import plan_target

ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- helpers


def jdbc(url: str) -> str:
    """The fixture's URL in the JDBC spelling a Spark user would write."""
    return re.sub(r"^mysql\+pymysql://[^@]*@", "jdbc:mariadb://", url)


def options(url: str, table: str, sink: str | None = None, **extra: Any) -> WriteOptions:
    raw = {"url": jdbc(url), "user": "root", "password": "", "dbtable": table, "sinkId": sink or _sink(), **extra}
    return parse_options(raw)


def _sink() -> str:
    return f"my{uuid.uuid4().hex[:10]}"


def sql(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        cur.execute(statement, params or None)
        return list(cur.fetchall())


def plan_for(opts: WriteOptions, schema: pa.Schema) -> TargetPlan:
    coordinator = Coordinator(opts)
    try:
        coordinator.preflight(4)
        with coordinator.dialect.connect() as conn:
            return plan_target(coordinator.dialect, conn, opts, schema)
    finally:
        coordinator.close()


def write_parts(
    opts: WriteOptions,
    plan: TargetPlan,
    parts: Sequence[Sequence[pa.RecordBatch]],
    batch_id: int = 0,
    run: str | None = None,
    first_task: int = 0,
) -> list[BranchOutcome]:
    run = run or new_run_nonce()
    return [
        write_partition(
            opts, plan, batch_id=batch_id, partition=p, task_attempt_id=first_task + p, run=run, batches=batches
        )
        for p, batches in enumerate(parts)
    ]


def commit(opts: WriteOptions, batch_id: int, outcomes: Sequence[BranchOutcome | None]) -> Any:
    coordinator = Coordinator(opts)
    try:
        return coordinator.commit(batch_id, outcomes)
    finally:
        coordinator.close()


def recover(opts: WriteOptions, **kw: Any) -> Any:
    coordinator = Coordinator(opts)
    try:
        return coordinator.recover(**kw)
    finally:
        coordinator.close()


ID_VAL = pa.schema([("id", pa.int64()), ("val", pa.string())])


def id_val(rows: Sequence[tuple[int, str | None]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"id": i, "val": v} for i, v in rows], schema=ID_VAL)


def keyed_table(url: str, name: str) -> None:
    sql(url, f"CREATE TABLE `{name}` (id BIGINT PRIMARY KEY, val VARCHAR(20)) ENGINE=InnoDB")


@pytest.fixture
def table(fresh_table_name: str) -> str:
    return fresh_table_name


# --------------------------------------------------------------------------- protocol


@pytest.mark.parametrize("local_infile", [True, False], ids=["load-data", "insert"])
def test_commit_makes_every_partition_visible_exactly_once(mariadb_url: str, table: str, local_infile: bool) -> None:
    keyed_table(mariadb_url, table)
    opts = options(mariadb_url, table, localInfile=str(local_infile).lower())
    plan = plan_for(opts, ID_VAL)
    parts = [[id_val([(1, "a"), (2, "b")]), id_val([(3, "c")])], [id_val([(10, "x")])], []]
    outcomes = write_parts(opts, plan, parts, batch_id=7)
    assert [o.rows for o in outcomes] == [3, 1, 0] and outcomes[2].gid is None
    assert mariadb_rows(mariadb_url, table) == []  # prepared, not visible
    assert len(mariadb_prepared_gids(mariadb_url, [opts.sink_id])) == 2
    result = commit(opts, 7, outcomes)
    assert (result.rows, result.branches, result.skipped) == (4, 2, False)
    assert mariadb_rows(mariadb_url, table) == [(1, "a"), (2, "b"), (3, "c"), (10, "x")]
    assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []
    # a replay of the decided batch writes nothing
    again = write_parts(opts, plan, [[id_val([(1, "a")])]], batch_id=7)
    assert again[0].skipped and again[0].gid is None
    assert commit(opts, 7, again).skipped
    assert mariadb_rows(mariadb_url, table) == [(1, "a"), (2, "b"), (3, "c"), (10, "x")]
    state = sql(mariadb_url, "SELECT state, `rows`, branches FROM xasink_batches WHERE sink_id = %s", opts.sink_id)
    assert state == [("committed", 4, 2)]


def test_abort_leaves_nothing(mariadb_url: str, table: str) -> None:
    keyed_table(mariadb_url, table)
    opts = options(mariadb_url, table)
    plan = plan_for(opts, ID_VAL)
    outcomes = write_parts(opts, plan, [[id_val([(1, "a")])], [id_val([(2, "b")])]], batch_id=3)
    assert len(mariadb_prepared_gids(mariadb_url, [opts.sink_id])) == 2
    with pytest.raises(Exception, match="did not report"):
        commit(opts, 3, [outcomes[0], None])  # a task failed: the batch aborts
    assert mariadb_rows(mariadb_url, table) == []
    assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []
    assert sql(mariadb_url, "SELECT COUNT(*) FROM xasink_batches WHERE sink_id = %s", opts.sink_id) == [(0,)]


def test_losing_attempt_is_swept(mariadb_url: str, table: str) -> None:
    """Two attempts of partition 0 prepared (a speculative copy); only the reported one commits."""
    sql(mariadb_url, f"CREATE TABLE `{table}` (id BIGINT, val VARCHAR(20)) ENGINE=InnoDB")  # no key: both can prepare
    opts = options(mariadb_url, table)
    plan = plan_for(opts, ID_VAL)
    run = new_run_nonce()
    rows = [(1, "a"), (2, "b")]
    loser = write_parts(opts, plan, [[id_val(rows)]], run=run, first_task=9)[0]
    winner = write_parts(opts, plan, [[id_val(rows)]], run=run, first_task=4)[0]  # lower id: the loser survives it
    assert loser.xid is not None and winner.xid is not None
    assert set(mariadb_prepared_gids(mariadb_url, [opts.sink_id])) == {loser.gid, winner.gid}
    commit(opts, 0, [winner])
    assert mariadb_rows(mariadb_url, table) == [(1, "a"), (2, "b")]  # once, not twice
    assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []


def test_recovery_finishes_decided_and_rolls_back_undecided(
    mariadb_url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed_table(mariadb_url, table)
    opts = options(mariadb_url, table)
    plan = plan_for(opts, ID_VAL)
    decided = write_parts(opts, plan, [[id_val([(1, "a")])], [id_val([(2, "b")])]], batch_id=1)
    monkeypatch.setenv("XASINK_FAULT", "driver.after_decide:raise")
    with pytest.raises(InjectedFault):
        commit(opts, 1, decided)  # the driver dies after the decision, before any commit
    monkeypatch.delenv("XASINK_FAULT")
    undecided = write_parts(opts, plan, [[id_val([(3, "c")])]], batch_id=2)  # never committed: a crashed batch
    assert len(mariadb_prepared_gids(mariadb_url, [opts.sink_id])) == 3
    assert mariadb_rows(mariadb_url, table) == []
    report = recover(opts)
    assert sorted(report.committed) == sorted(o.xid for o in decided if o.xid is not None)
    assert report.rolled_back == [undecided[0].xid]
    assert report.finished_batches == [1]
    assert mariadb_rows(mariadb_url, table) == [(1, "a"), (2, "b")]
    assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []
    assert not recover(opts)  # idempotent


def test_foreign_xid_with_binary_parts_is_listed_by_a_name_that_parses_back(mariadb_url: str, table: str) -> None:
    """An XA xid is bytes: a foreign one that is not text is listed as foreign (hex), and recovery leaves it alone."""
    gtrid = f"foreign-x-{uuid.uuid4().hex[:6]}".encode()
    foreign = mariadb_make_foreign_prepared(mariadb_url, gtrid, b"\x00\xff", format_id=1)
    try:
        keyed_table(mariadb_url, table)
        opts = options(mariadb_url, table)
        plan = plan_for(opts, ID_VAL)
        abandoned = write_parts(opts, plan, [[id_val([(2, "b")])]], batch_id=1)
        report = recover(opts)
        assert report.rolled_back == [abandoned[0].xid]
        assert foreign in mariadb_recover(mariadb_url)
        dialect = dialect_for(opts.url)
        with dialect.connect() as conn:
            listed = {p.gid: p.xid for p in dialect.list_prepared(conn)}
        dialect.dispose()
        assert listed[foreign_gid(*foreign)] is None  # listed as foreign, by a name that parses back
        assert parse_foreign_gid(foreign_gid(*foreign)) == foreign
        assert mariadb_rows(mariadb_url, table) == []
    finally:
        mariadb_rollback_xa(mariadb_url, *foreign)
    assert foreign not in mariadb_recover(mariadb_url)


def test_a_branch_still_attached_to_its_writer_is_busy_not_unknown(mariadb_url: str) -> None:
    """XAER_NOTA while the owner is connected must not pass for 'committed earlier': it is transient."""
    opts = options(mariadb_url, "unused")
    dialect = MySQLDialect(opts.url)
    xid = Xid("0a0b0c0d0e", opts.sink_id, 0, 0, f"1-{new_run_nonce()}")
    sql(mariadb_url, "CREATE TABLE IF NOT EXISTS busy_scratch (x INT) ENGINE=InnoDB")
    with mariadb_connect(mariadb_url) as owner, owner.cursor() as cur:
        cur.execute("SELECT CONNECTION_ID()")
        owner_id = cur.fetchone()[0]  # type: ignore[index]
        cur.execute(f"XA START {xid_literal(xid)}")
        cur.execute("INSERT INTO busy_scratch VALUES (1)")
        cur.execute(f"XA END {xid_literal(xid)}")
        cur.execute(f"XA PREPARE {xid_literal(xid)}")
        with dialect.connect(autocommit=True) as conn:
            with pytest.raises(BranchBusyError) as busy:
                dialect.commit_prepared(conn, xid)
            assert dialect.classify(busy.value) == ErrorKind.TRANSIENT
            dialect.rollback_prepared(conn, xid)  # a sweep leaves it alone for now, without an error
            assert (FORMAT_ID, xid.gtrid.encode(), xid.bqual.encode()) in mariadb_recover(mariadb_url)
    mariadb_wait_detached(mariadb_url, owner_id)
    with dialect.connect(autocommit=True) as conn:
        dialect.rollback_prepared(conn, xid)
        with pytest.raises(sa.exc.DBAPIError) as gone:
            dialect.rollback_prepared(conn, xid)
        assert dialect.classify(gone.value) == ErrorKind.UNKNOWN_XID
    dialect.dispose()
    assert sql(mariadb_url, "SELECT COUNT(*) FROM busy_scratch") == [(0,)]


def test_a_session_given_up_on_is_still_waited_for_as_a_new_branch_owner(mariadb_url: str) -> None:
    """A session a wait gave up on is no pass for later verbs, neither as that branch's owner nor as another's.

    After a server restart session ids start again from 1: a new branch's owner may get the id of a session
    given up on before, and skipping it would send XA COMMIT while it still disconnects (an OK answer with
    the branch left prepared).  Here one live session plays both: given up on as the owner of one branch,
    then the owner of another: neither wait lets a verb through while that session holds the branch.
    """
    opts = options(mariadb_url, "unused")
    dialect = MySQLDialect(opts.url)
    run = new_run_nonce()
    first, second = (Xid("0a0b0c0d0e", opts.sink_id, b, 0, f"1-{run}") for b in (0, 1))
    try:
        with mariadb_connect(mariadb_url) as owner, owner.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, 0)", (owner_lock(first),))
            with dialect.connect(autocommit=True) as conn:
                with pytest.raises(BranchBusyError):
                    dialect.await_owner(conn, first, timeout_s=0.0)  # gives up on the owner at once
                with pytest.raises(BranchBusyError):  # given up on before: still no pass
                    dialect.await_owner(conn, first, timeout_s=0.0)
                cur.execute("SELECT RELEASE_LOCK(%s), GET_LOCK(%s, 0)", (owner_lock(first), owner_lock(second)))
                with pytest.raises(BranchBusyError):  # the new owner is waited for, not skipped
                    dialect.await_owner(conn, second, timeout_s=1.0)
    finally:
        dialect.dispose()


# --------------------------------------------------------------------------- exact round trip

STRINGS = [
    "plain",
    "tab\there",
    "new\nline and\r\ncrlf",
    "back\\slash \\N \\t \\\\",
    "\\N",
    "NULL",
    "quotes ' \" ` ;",
    "naïve ünïcödé – 日本語 😀",
    "nul\x00byte",
    "",
    None,
    "\t\n\\",
]
BLOBS = [bytes(range(256)), b"", None, b"\x00", b"\\N", b"\t\n\r\\", bytes(range(255, -1, -1)), b"x" * 3, b"'", b"a"]
DOUBLES = [0.1, 1 / 3, -2.5e300, 1e-300, 123456789.123456789, None, 0.0, -0.0, 42.0, 7e22, 5e-324, 2.0**53]


def round_trip_batch() -> pa.RecordBatch:
    n = len(STRINGS)
    base = dt.datetime(2024, 2, 29, 23, 59, 59, 999999)
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array(range(n), pa.int64()),
            "s": pa.array(STRINGS, pa.string()),
            "b": pa.array(BLOBS + [b"end"] * (n - len(BLOBS)), pa.binary()),
            "d": pa.array(
                [decimal.Decimal("-12345678901234.123456"), decimal.Decimal("0.000001"), None]
                + [(decimal.Decimal(i) / 7).quantize(decimal.Decimal("0.000001")) for i in range(n - 3)],
                pa.decimal128(20, 6),
            ),
            "f": pa.array(DOUBLES, pa.float64()),
            "day": pa.array(
                [dt.date(1000, 1, 1), dt.date(9999, 12, 31), None] + [dt.date(2024, 1, i) for i in range(1, n - 2)]
            ),
            "ts": pa.array(
                [base, dt.datetime(1000, 1, 1), None]
                + [base - dt.timedelta(days=i, microseconds=i) for i in range(n - 3)],
                pa.timestamp("us"),
            ),
            "tsz": pa.array(
                [dt.datetime(2024, 6, 1, 12, 0, tzinfo=dt.timezone.utc), None]
                + [dt.datetime(2024, 6, 1, 12, 0, i, tzinfo=dt.timezone(dt.timedelta(hours=2))) for i in range(n - 2)],
                pa.timestamp("us", tz="UTC"),
            ),
            "flag": pa.array([True, False, None] * (n // 3), pa.bool_()),
            "tiny": pa.array([-128, 127, None] + list(range(n - 3)), pa.int8()),
        }
    )


def _expected_decimal(d: decimal.Decimal | None) -> decimal.Decimal | None:
    return None if d is None else d.quantize(decimal.Decimal("0.000001"))


@pytest.mark.parametrize("local_infile", [True, False], ids=["load-data", "insert"])
def test_values_round_trip_exactly(mariadb_url: str, table: str, local_infile: bool) -> None:
    """Values that stress the TSV escaping (NUL, backslash sequences, the text "\\N") through both load paths.

    tests/test_types.py checks every Spark type on both dialects through Spark; this is the escaping.
    """
    batch = round_trip_batch()
    opts = options(mariadb_url, table, localInfile=str(local_infile).lower(), batchsize="5")  # several statements
    plan = plan_for(opts, batch.schema)  # the table is created from the batch's schema
    commit(opts, 0, write_parts(opts, plan, [[batch.slice(0, 7), batch.slice(7)]]))
    got = mariadb_rows(mariadb_url, table, order_by="id")
    expected = []
    for r in batch.to_pylist():
        tsz = r["tsz"].astimezone(dt.timezone.utc).replace(tzinfo=None) if r["tsz"] else None  # UTC wall time
        flag = None if r["flag"] is None else int(r["flag"])
        row = (r["id"], r["s"], r["b"], _expected_decimal(r["d"]), r["f"], r["day"], r["ts"], tsz, flag, r["tiny"])
        expected.append(row)
    assert got == expected
    assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []
    ddl = sql(mariadb_url, f"SHOW CREATE TABLE `{table}`")[0][1].lower()
    for column_type in ("`s` longtext", "`b` longblob", "decimal(20,6)", "`f` double", "`day` date", "datetime(6)"):
        assert column_type in ddl
    assert "engine=innodb" in ddl and "tinyint(1)" in ddl


def test_tsv_encoding_escapes_exactly() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "i": pa.array([1, None], pa.int32()),
            "s": ["a\tb\\c\nd\re\x00", None],
            "b": pa.array([b"\x00\xff", None], pa.binary()),
            "t": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6), None], pa.timestamp("us", tz="UTC")),
            "f": [True, None],
        }
    )
    assert encode_tsv(batch).to_pybytes() == (
        b"1\ta\\tb\\\\c\\nd\\re\\0\t00FF\t2024-01-02 03:04:05.000006\t1\n\\N\t\\N\t\\N\t\\N\t\\N\n"
    )


def test_tsv_csv_writer_path_is_byte_identical_to_the_joined_columns() -> None:
    """Arrow's CSV writer formats numbers, dates and wall times itself: exactly as text_column does; a batch
    with a double quote (which it refuses unquoted) goes the joined way, with the same bytes."""
    cols = {
        "i8": pa.array([1, -2, None], pa.int8()),
        "u64": pa.array([2**64 - 1, 0, None], pa.uint64()),
        "f64": pa.array([0.1, 1e300, -0.0]),
        "f32": pa.array([0.1, F32_MAX, None], pa.float32()),
        "dec": pa.array([decimal.Decimal("1.50"), decimal.Decimal("-0.01"), None], pa.decimal128(12, 2)),
        "d": pa.array([dt.date(2020, 1, 1), dt.date(1, 1, 1), None]),
        "ms": pa.array([0, -1, None], pa.timestamp("ms")),
        "ns": pa.array([1_000_000_000_123_456_789, 0, None], pa.timestamp("ns")),
        "tz": pa.array(
            [dt.datetime(2020, 1, 1, 1, 2, 3, 4), dt.datetime(9999, 12, 31), None], pa.timestamp("us", "UTC")
        ),
        "b": pa.array([True, False, None]),
        "bin": pa.array([b"\x00\xff", b"", None]),
    }
    for text in (["a\tb", "", None], ['say "hi"', "x", None]):
        batch = pa.RecordBatch.from_pydict({**cols, "s": pa.array(text)})
        fields = [text_column(c).to_pylist() for c in batch.columns]
        expected = "".join("\t".join(row) + "\n" for row in zip(*fields, strict=True)).encode()
        assert encode_tsv(batch).to_pybytes() == expected


@pytest.mark.parametrize("statement_bytes", [200, 64 << 20], ids=["statement-every-few-batches", "one-statement"])
def test_load_data_streams_every_batch_exactly_once(
    mariadb_url: str, table: str, statement_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows stream through a pipe into LOAD DATA statements of up to load_data_max_bytes each."""
    monkeypatch.setattr(MySQLDialect, "load_data_max_bytes", statement_bytes)
    keyed_table(mariadb_url, table)
    opts = options(mariadb_url, table)
    plan = plan_for(opts, ID_VAL)
    parts = [[id_val([(p * 1000 + b * 50 + i, f"v{i}") for i in range(50)]) for b in range(5)] for p in range(3)]
    outcomes = write_parts(opts, plan, parts)
    assert [o.rows for o in outcomes] == [250, 250, 250]
    commit(opts, 0, outcomes)
    expected = sorted((p * 1000 + b * 50 + i, f"v{i}") for p in range(3) for b in range(5) for i in range(50))
    assert mariadb_rows(mariadb_url, table) == expected
    assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []


@pytest.mark.parametrize("bad", ["nan", "duplicate"])
def test_a_bad_later_batch_fails_the_streamed_branch_and_leaves_nothing(mariadb_url: str, table: str, bad: str) -> None:
    """An error while a statement streams (the client's encoding, or the server's) ends the statement and
    fails the branch: nothing of the rows already streamed stays."""
    schema = pa.schema([("id", pa.int64()), ("f", pa.float64())])
    sql(mariadb_url, f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, f DOUBLE) ENGINE=InnoDB")
    opts = options(mariadb_url, table)
    plan = plan_for(opts, schema)
    good = pa.RecordBatch.from_pydict({"id": range(1000), "f": [0.5] * 1000}, schema=schema)
    later = {"nan": (5000, float("nan")), "duplicate": (7, 1.0)}[bad]
    wrong = pa.RecordBatch.from_pydict({"id": [later[0]], "f": [later[1]]}, schema=schema)
    with pytest.raises(BranchError, match={"nan": "NaN or infinite", "duplicate": "duplicate key"}[bad]):
        write_parts(opts, plan, [[good, good.slice(0, 0), wrong]])
    assert mariadb_rows(mariadb_url, table) == []
    assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("local_infile", [True, False], ids=["load-data", "insert"])
@pytest.mark.parametrize(
    ("rows", "ddl", "message"),
    [
        ([(1, "a"), (1, "b")], "id BIGINT PRIMARY KEY, val VARCHAR(20)", "duplicate key"),
        ([(1, None)], "id BIGINT PRIMARY KEY, val VARCHAR(20) NOT NULL", "NOT NULL column"),
        ([(1, "far too long")], "id BIGINT PRIMARY KEY, val VARCHAR(5)", "longer than its column"),
        ([(1, "ok🎉")], "id BIGINT PRIMARY KEY, val VARCHAR(20) CHARACTER SET utf8mb3", "make the column utf8mb4"),
        ([(1, "forty-two")], "id BIGINT PRIMARY KEY, val INT", "a string the column's type cannot read"),
        ([(1, "not a date")], "id BIGINT PRIMARY KEY, val DATETIME", "type cannot read"),
    ],
    ids=["duplicate", "not-null", "too-long", "4-byte-into-utf8mb3", "word-into-int", "word-into-datetime"],
)
def test_bad_rows_fail_the_branch_and_leave_nothing(
    mariadb_url: str, table: str, local_infile: bool, rows: list[tuple[int, str | None]], ddl: str, message: str
) -> None:
    """LOAD DATA LOCAL turns these errors into warnings and skips or alters rows: they must still fail."""
    sql(mariadb_url, f"CREATE TABLE `{table}` ({ddl}) ENGINE=InnoDB")
    opts = options(mariadb_url, table, localInfile=str(local_infile).lower())
    plan = plan_for(opts, ID_VAL)
    with pytest.raises(BranchError, match=message) as err:
        write_parts(opts, plan, [[id_val(rows)]])
    assert "nothing of this batch is visible" in str(err.value)
    assert mariadb_rows(mariadb_url, table) == []
    assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []


YEAR_10000_US = 253402300800 * 10**6  # 10000-01-01 00:00 UTC, past Python's datetime


@pytest.mark.parametrize("local_infile", [True, False], ids=["load-data", "insert"])
@pytest.mark.parametrize(
    ("column", "late"),
    [("TIMESTAMP(6) NULL", 2208988800 * 10**6), ("DATETIME(6)", YEAR_10000_US)],
    ids=["timestamp-2040", "datetime-10000"],
)
def test_a_timestamp_past_the_columns_range_is_told_the_range(
    mariadb_url: str, table: str, local_infile: bool, column: str, late: int
) -> None:
    """A TIMESTAMP column ends in 2038, a DATETIME in 9999: the error names the ranges and DATETIME, not "a number
    is out of range" or "widen the column type" (what the server's codes 1264 and 1265 alone would say; found by
    the values matrix and a new user's review)."""
    sql(mariadb_url, f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, ts {column}) ENGINE=InnoDB")
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", "UTC"))])
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1, 2]), pa.array([None, late], pa.timestamp("us", "UTC"))], schema=schema
    )
    opts = options(mariadb_url, table, localInfile=str(local_infile).lower())
    with pytest.raises(BranchError, match="TIMESTAMP column holds 1970-01-01 00:00:01 to 2038") as err:
        write_parts(opts, plan_for(opts, schema), [[batch]])
    said = str(err.value).lower()
    assert "nothing of this batch is visible" in said and "a number is" not in said and "widen" not in said
    assert mariadb_rows(mariadb_url, table) == []
    assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []


F32_MAX = float(np.finfo(np.float32).max)
FLOATS = [F32_MAX, -F32_MAX, float(np.finfo(np.float32).tiny), 1.401298464324817e-45, 0.10000000149011612, -1.5, None]


@pytest.mark.parametrize("local_infile", [True, False], ids=["load-data", "insert"])
def test_float32_extremes_round_trip_exactly(mariadb_url: str, table: str, local_infile: bool) -> None:
    """Spark's FloatType at its limits (Float.MaxValue, the smallest subnormal) lands as the same float32.

    LOAD DATA once sent a float32 as its shortest float32 text ("3.4028235e+38"), which MariaDB reads as
    a double above FLT_MAX: out of range, the whole batch refused.
    """
    schema = pa.schema([("id", pa.int64()), ("f", pa.float32())])
    batch = pa.RecordBatch.from_pydict({"id": range(len(FLOATS)), "f": FLOATS}, schema=schema)
    opts = options(mariadb_url, table, localInfile=str(local_infile).lower())
    plan = plan_for(opts, schema)
    assert sql(
        mariadb_url,
        f"SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
        f"AND TABLE_NAME = '{table}' AND COLUMN_NAME = 'f'",
    ) == [("float",)]
    commit(opts, 0, write_parts(opts, plan, [[batch]]))
    got = sql(mariadb_url, f"SELECT id, CAST(f AS DOUBLE) FROM `{table}` ORDER BY id")  # FLOAT's text shows 6 digits
    assert got == [(i, f) for i, f in enumerate(FLOATS)]
    assert mariadb_prepared_gids(mariadb_url, [opts.sink_id]) == []


def test_nan_is_refused_clearly(mariadb_url: str, table: str) -> None:
    schema = pa.schema([("id", pa.int64()), ("f", pa.float64())])
    opts = options(mariadb_url, table)
    plan = plan_for(opts, schema)
    batch = pa.RecordBatch.from_pydict({"id": [1, 2], "f": [1.0, float("nan")]}, schema=schema)
    with pytest.raises(BranchError, match="NaN or infinite"):
        write_parts(opts, plan, [[batch]])
    assert mariadb_rows(mariadb_url, table) == []


def test_upsert_merges_and_last_row_wins(mariadb_url: str, table: str) -> None:
    keyed_table(mariadb_url, table)
    sql(mariadb_url, f"INSERT INTO `{table}` VALUES (1, 'old'), (5, 'kept')")
    opts = options(mariadb_url, table, upsertKeyColumns="id")
    plan = plan_for(opts, ID_VAL)
    commit(opts, 0, write_parts(opts, plan, [[id_val([(1, "new"), (2, "first"), (2, "last")])]]))
    assert mariadb_rows(mariadb_url, table) == [(1, "new"), (2, "last"), (5, "kept")]


def test_wrong_password_is_a_clear_error_without_the_password(mariadb_url: str) -> None:
    opts = parse_options(
        {"url": jdbc(mariadb_url), "user": "root", "password": "s3cr3t-pw0rd", "dbtable": "t", "sinkId": "s"}
    )
    coordinator = Coordinator(opts)
    with pytest.raises(ConnectError) as err:
        coordinator.preflight()
    assert "authentication failed for user 'root'" in str(err.value)
    assert "s3cr3t" not in str(err.value)


def test_non_innodb_table_is_refused(mariadb_url: str, table: str) -> None:
    sql(mariadb_url, f"CREATE TABLE `{table}` (id BIGINT, val VARCHAR(20)) ENGINE=MyISAM")
    with pytest.raises(PreflightError, match="ENGINE=InnoDB"):
        plan_for(options(mariadb_url, table), ID_VAL)


def test_error_classification(mariadb_url: str) -> None:
    dialect = MySQLDialect(options(mariadb_url, "t").url)
    with dialect.connect(autocommit=True) as conn:
        with pytest.raises(sa.exc.DBAPIError) as unknown:
            conn.exec_driver_sql("XA COMMIT X'00',X'',1")
        assert dialect.classify(unknown.value) == ErrorKind.UNKNOWN_XID
        with pytest.raises(sa.exc.DBAPIError) as syntax:
            conn.exec_driver_sql("SELEC 1")
        assert dialect.classify(syntax.value) == ErrorKind.FATAL
    dialect.dispose()
    refused = MySQLDialect(options(mariadb_url, "t").url.set(port=1))
    with pytest.raises(pymysql.err.OperationalError) as lost:
        pymysql.connect(host="127.0.0.1", port=1, user="root", connect_timeout=2)
    assert lost.value.args[0] == 2003 and refused.classify(lost.value) == ErrorKind.TRANSIENT


# --------------------------------------------------------------------------- types and DDL


def test_reflected_types_map_to_arrow(mariadb_url: str, table: str) -> None:
    sql(
        mariadb_url,
        f"CREATE TABLE `{table}` (a TINYINT(1), b TINYINT UNSIGNED, c SMALLINT, d MEDIUMINT, e INT UNSIGNED, "
        "f BIGINT, g FLOAT, h DOUBLE, i DECIMAL(30,4), j VARCHAR(10), k TEXT, l ENUM('x','y'), m VARBINARY(4), "
        "n MEDIUMBLOB, o DATE, p DATETIME(3), q TIMESTAMP NULL, r YEAR, s JSON, t TIME) ENGINE=InnoDB",
    )
    dialect = MySQLDialect(options(mariadb_url, table).url)
    with dialect.connect() as conn:
        columns = {c["name"]: c for c in sa.inspect(conn).get_columns(table)}
    dialect.dispose()
    naive, aware = pa.timestamp("us"), pa.timestamp("us", tz="UTC")
    got = {name: dialect.arrow_type(col, pa.int64()) for name, col in columns.items()}
    assert got == {
        "a": pa.int8(),
        "b": pa.uint8(),
        "c": pa.int16(),
        "d": pa.int32(),
        "e": pa.uint32(),
        "f": pa.int64(),
        "g": pa.float32(),
        "h": pa.float64(),
        "i": pa.decimal128(30, 4),
        "j": pa.int64(),  # a number into text: its text, as the server stores the literal JDBC sends
        "k": pa.int64(),
        "l": pa.string(),
        "m": pa.binary(),
        "n": pa.binary(),
        "o": pa.date32(),
        "p": naive,
        "q": naive,
        "r": pa.int16(),
        "s": pa.int64(),  # (MariaDB's JSON is a LONGTEXT)
        "t": None,
    }
    assert dialect.arrow_type(columns["j"], pa.string()) == pa.string()
    assert dialect.arrow_type(columns["a"], pa.bool_()) == pa.bool_()  # BOOLEAN is TINYINT(1)
    # tz-aware data: written as its wall time in the session time zone, as Spark's JDBC writer (docs/types.md)
    assert dialect.arrow_type(columns["p"], aware) == naive
    assert dialect.arrow_type(columns["i"], pa.float64()) == pa.float64()  # a double's text: the server rounds it
    assert dialect.arrow_type(columns["h"], pa.decimal128(38, 18)) == pa.decimal128(38, 18)


def test_create_table_column_types_use_mysql_names(mariadb_url: str, table: str) -> None:
    dialect = MySQLDialect(options(mariadb_url, table).url)
    compiled = {
        text: str(dialect.parse_type(text).compile(dialect=mysql.pymysql.dialect()))
        for text in ("BIGINT UNSIGNED", "DATETIME(3)", "VARCHAR(64)", "DECIMAL(12,2)", "tinyint(1)", "string", "bool")
    }
    assert compiled == {
        "BIGINT UNSIGNED": "BIGINT UNSIGNED",
        "DATETIME(3)": "DATETIME(3)",
        "VARCHAR(64)": "VARCHAR(64)",
        "DECIMAL(12,2)": "DECIMAL(12, 2)",
        "tinyint(1)": "TINYINT(1)",
        "string": "LONGTEXT",
        "bool": "BOOL",
    }
    with pytest.raises(PreflightError, match="unknown MySQL type"):
        dialect.parse_type("VARCHAR2(10)")
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("at", pa.timestamp("us"))])
    opts = options(mariadb_url, table, createTableColumnTypes="id BIGINT UNSIGNED, name VARCHAR(64), at DATETIME(3)")
    plan_for(opts, schema)
    ddl = sql(mariadb_url, f"SHOW CREATE TABLE `{table}`")[0][1].lower()
    assert "`id` bigint(20) unsigned" in ddl and "`name` varchar(64)" in ddl and "`at` datetime(3)" in ddl


def test_xa_recover_rows_parse() -> None:
    gtrid, bqual = b"xasink:s:1", b"0a0b0c0d0e:0:1-0a0b0c0d"
    assert parse_recover_row((FORMAT_ID, 10, 23, gtrid + bqual), False) == (FORMAT_ID, gtrid, bqual)
    assert parse_recover_row((FORMAT_ID, 10, 23, "0x" + (gtrid + bqual).hex()), True) == (FORMAT_ID, gtrid, bqual)
    assert parse_recover_row((1, 3, 0, "abc"), False) == (1, b"abc", b"")
    assert parse_recover_row((1, 3, 2, b"abc"), False) is None  # lengths disagree: not parsed, never touched
    assert Xid.from_xa(FORMAT_ID, gtrid, bqual) == Xid("0a0b0c0d0e", "s", 1, 0, "1-0a0b0c0d")
    assert parse_foreign_gid("xa:1:00ff:") == (1, b"\x00\xff", b"")
    assert parse_foreign_gid("xasink:s:1/0:1-0a0b0c0d") is None


def _ddl_blocks(path: Path) -> dict[str, set[str]]:
    """Table name -> normalized column/key lines of every CREATE TABLE in a .sql file."""
    text = re.sub(r"--[^\n]*", "", path.read_text())
    blocks = {}
    for m in re.finditer(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\)[^()]*;", text, re.S):
        blocks[m[1]] = {" ".join(line.strip().rstrip(",").split()) for line in m[2].splitlines() if line.strip()}
    return blocks


@pytest.mark.parametrize(
    ("dialect", "path"),
    [
        (mysql.pymysql.dialect(), "xasink/journal/sql/mysql.sql"),
        (postgresql.psycopg2.dialect(), "xasink/journal/sql/postgres.sql"),
    ],
    ids=["mysql", "postgres"],
)
def test_sql_files_match_the_journal_tables(dialect: sa.engine.Dialect, path: str) -> None:
    blocks = _ddl_blocks(ROOT / path)
    tables = (*journal_metadata(), parts_table(sa.MetaData()))
    assert set(blocks) == {t.name for t in tables}
    for t in tables:
        compiled = str(CreateTable(t).compile(dialect=dialect))
        body = compiled[compiled.index("(") + 1 : compiled.rindex(")")]
        want = {" ".join(line.strip().rstrip(",").split()) for line in body.splitlines() if line.strip()}
        assert blocks[t.name] == want, f"{path}: {t.name} differs from journal_metadata()"
        assert all(c.name in " ".join(blocks[t.name]) for c in t.columns)


def test_sql_file_runs_on_mariadb(mariadb_url: str) -> None:
    scratch = f"xasink_ddl_{uuid.uuid4().hex[:8]}"
    with mariadb_connect(mariadb_url, database=False) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{scratch}`")
        try:
            cur.execute(f"USE `{scratch}`")
            for statement in re.sub(r"--[^\n]*", "", (ROOT / "xasink/journal/sql/mysql.sql").read_text()).split(";"):
                if statement.strip():
                    cur.execute(statement)
            cur.execute(
                "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s ORDER BY 1",
                (scratch,),
            )
            want = (
                ("xasink_batches", "InnoDB"),
                ("xasink_claims", "InnoDB"),
                ("xasink_log", "InnoDB"),
                ("xasink_parts", "InnoDB"),
                ("xasink_sinks", "InnoDB"),
            )
            assert cur.fetchall() == want
        finally:
            cur.execute(f"DROP DATABASE `{scratch}`")
