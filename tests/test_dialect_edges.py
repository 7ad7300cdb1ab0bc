"""Dialect edges of issue 15 (items 9-11) against the real servers: finishing a branch whose owner is still
disconnecting (MariaDB), the server's durability settings, literals and control-connection timeouts."""

from __future__ import annotations

import contextlib
import socket
import uuid

import pyarrow as pa
import pymysql
import pytest

from tests.targets import mariadb_connect, mariadb_recover
from xasink.dialects.mysql import MySQLBranch, MySQLDialect, xid_literal
from xasink.dialects.values import TargetPlan
from xasink.errors import ConcurrentWriterError
from xasink.options import parse_options
from xasink.protocol.xid import FORMAT_ID, Xid, new_run_nonce

ID = pa.schema([("id", pa.int64())])


def _mariadb_dialect(url: str) -> MySQLDialect:
    opts = parse_options({"url": url, "dbtable": "unused", "sinkId": "edges"})
    dialect = MySQLDialect(opts.url)
    return dialect


def _roll_back_listed(url: str, xids: list[Xid]) -> None:
    listed = set(mariadb_recover(url))
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        for xid in xids:
            if (FORMAT_ID, xid.gtrid.encode(), xid.bqual.encode()) in listed:
                cur.execute(f"XA ROLLBACK {xid_literal(xid)}")


@pytest.mark.parametrize("verb", ["ROLLBACK", "COMMIT"])
def test_finishing_a_branch_whose_owner_was_just_killed_leaves_no_hidden_prepared_transaction(
    mariadb_url: str, fresh_table_name: str, verb: str
) -> None:
    """Item 9: an executor killed right after XA PREPARE, its branch finished at once by the driver.

    On MariaDB 10.11 an XA ROLLBACK (or COMMIT) that lands while the owner's disconnect is in flight answers
    OK, yet the transaction stays prepared, is gone from XA RECOVER and keeps its row locks until the server
    restarts.  Measured before the fix (ROLLBACK, 1500 rounds): 94 left prepared (XAER_NOTA, "left for the
    next sweep") and 3 answered OK yet stayed locked and unlisted.  Every round must end with the row's lock
    free, the row present exactly when committed, and nothing listed.
    """
    table = fresh_table_name
    rounds = 300
    with mariadb_connect(mariadb_url) as admin, admin.cursor() as cur:
        cur.execute(f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY) ENGINE=InnoDB")
    dialect = _mariadb_dialect(mariadb_url)
    plan = TargetPlan(None, table, ID, ("id",))
    run = new_run_nonce()
    bad: list[tuple[int, str]] = []
    xids: list[Xid] = []
    try:
        with (
            mariadb_connect(mariadb_url) as killer,
            killer.cursor() as kcur,
            mariadb_connect(mariadb_url) as probe,
            probe.cursor() as pcur,
            dialect.connect(autocommit=True) as ctl,
        ):
            pcur.execute("SET SESSION innodb_lock_wait_timeout = 1")
            for i in range(rounds):
                xid = Xid(uuid.uuid4().hex[:10], "edges", 0, i, f"1-{run}")
                xids.append(xid)
                branch = dialect.open_branch(xid, plan)
                assert isinstance(branch, MySQLBranch)
                branch.load(iter([pa.RecordBatch.from_pylist([{"id": i}], schema=ID)]))
                branch.cursor.execute(f"XA END {xid_literal(xid)}")
                branch.cursor.execute(f"XA PREPARE {xid_literal(xid)}")
                # the executor dies right after PREPARE: its session killed, its connection closed (COM_QUIT),
                # or its process gone (the socket closed without a word: the server reads end-of-file)
                if i % 3 == 0:
                    kcur.execute(f"KILL {branch.connection_id}")
                elif i % 3 == 1:
                    branch.conn.close()
                else:
                    branch.conn._sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
                    branch.conn._sock.close()  # type: ignore[union-attr]
                if verb == "ROLLBACK":
                    dialect.rollback_prepared(ctl, xid)
                else:
                    dialect.commit_prepared(ctl, xid)
                key = (FORMAT_ID, xid.gtrid.encode(), xid.bqual.encode())
                if key in mariadb_recover(mariadb_url):
                    bad.append((i, "still listed"))
                    continue
                try:
                    pcur.execute(f"SELECT COUNT(*) FROM `{table}` WHERE id = %s FOR UPDATE", (i,))
                    found = pcur.fetchone()[0]  # type: ignore[index]
                    pcur.execute("COMMIT")
                except pymysql.err.OperationalError as exc:
                    bad.append((i, f"row still locked, branch unlisted ({exc.args[0]})"))
                    continue
                if found != (1 if verb == "COMMIT" else 0):
                    bad.append((i, f"{found} rows"))
    finally:
        _roll_back_listed(mariadb_url, xids)  # whatever the verb left prepared (before the fix)
    dialect.dispose()
    assert bad == [], f"{len(bad)} of {rounds}: {bad}"


# --------------------------------------------------------------------------- item 11: literals, control connections

NASTY = "o'k \\ \\n \\' %s %% ''"  # a backslash before n, before a quote, printf and doubled quotes


def _pg_scs_off(pg_url: str) -> str:
    """The PostgreSQL URL with standard_conforming_strings off, where a backslash in '...' escapes."""
    return pg_url + ("&" if "?" in pg_url else "?") + "options=-c%20standard_conforming_strings%3Doff"


def test_postgres_statements_without_parameters_quote_backslashes_and_quotes(pg_url: str) -> None:
    """Item 11: ROLLBACK PREPARED of a gid with backslashes and quotes names exactly that gid, whatever
    standard_conforming_strings says (before the fix: the backslash escaped, the gid 'did not exist')."""
    from tests.targets import make_foreign_prepared, prepared_gids
    from xasink.dialects.postgres import PostgresDialect

    gid = f"foreign {uuid.uuid4().hex[:6]} {NASTY}"
    make_foreign_prepared(pg_url, gid)
    try:
        for url in (pg_url, _pg_scs_off(pg_url)):  # listed the same by both; rolled back by the second
            dialect = PostgresDialect(parse_options({"url": url, "dbtable": "unused"}).url)
            with dialect.connect(autocommit=True) as conn:
                assert gid in {p.gid for p in dialect.list_prepared(conn)}
                if url != pg_url:
                    dialect.rollback_foreign(conn, gid)
            dialect.dispose()
        assert gid not in prepared_gids(pg_url)
    finally:
        if gid in prepared_gids(pg_url):
            from tests.targets import rollback_prepared

            rollback_prepared(pg_url, gid)


def test_mariadb_foreign_xid_with_backslashes_and_quotes_is_rolled_back(mariadb_url: str) -> None:
    """Item 11 on MariaDB: xids travel as hex literals, so any byte of a foreign xid is named exactly."""
    from tests.targets import mariadb_make_foreign_prepared
    from xasink.dialects.mysql import foreign_gid

    foreign = mariadb_make_foreign_prepared(mariadb_url, f"fx{uuid.uuid4().hex[:6]}{NASTY}".encode(), b"\\'")
    dialect = _mariadb_dialect(mariadb_url)
    with dialect.connect(autocommit=True) as conn:
        dialect.rollback_foreign(conn, foreign_gid(*foreign))
    dialect.dispose()
    assert foreign not in mariadb_recover(mariadb_url)


def _url(request: pytest.FixtureRequest, kind: str) -> str:
    return str(request.getfixturevalue("pg_url" if kind == "pg" else "mariadb_url"))


BOTH = [pytest.param("pg", id="pg"), pytest.param("mariadb", id="mariadb", marks=pytest.mark.mariadb)]


@pytest.mark.parametrize("kind", BOTH)
def test_a_control_step_blocked_by_a_lock_times_out_as_transient(request: pytest.FixtureRequest, kind: str) -> None:
    """Item 11: the sink lock held by another session (a hung writer) makes the decision step fail after
    controlLockTimeout with an error classified transient (retried), instead of waiting forever."""
    import threading
    import time

    import sqlalchemy as sa

    from xasink.dialects.values import ErrorKind
    from xasink.protocol.coordinator import Coordinator

    url = _url(request, kind)
    sink = f"lk{uuid.uuid4().hex[:8]}"
    opts = parse_options({"url": url, "dbtable": "unused", "sinkId": sink, "controlLockTimeout": "2"})
    coordinator = Coordinator(opts)
    try:
        coordinator.preflight()
        journal = coordinator.journal
        with journal.locked(sink):
            pass  # the sink's row exists
        holder = coordinator.dialect.engine.connect()  # another session: its own settings do not matter
        tx = holder.begin()
        holder.execute(sa.select(journal.sinks).where(journal.sinks.c.sink_id == sink).with_for_update())
        release = threading.Timer(20, tx.rollback)  # before the fix the wait would never end
        release.start()
        try:
            t0 = time.monotonic()
            with pytest.raises(sa.exc.DBAPIError) as blocked:
                with journal.locked(sink):
                    pass
            waited = time.monotonic() - t0
        finally:
            release.cancel()
            tx.rollback()
            holder.close()
        assert 1.5 <= waited < 10
        assert coordinator.dialect.classify(blocked.value) == ErrorKind.TRANSIENT
    finally:
        coordinator.close()


@pytest.mark.parametrize("kind", BOTH)
def test_control_connections_keep_tcp_alive_and_bound_lock_waits(request: pytest.FixtureRequest, kind: str) -> None:
    """Item 11: a control connection has TCP keepalives on (a dead peer is noticed in about a minute) and its
    session's lock timeout is controlLockTimeout (default 60 s)."""
    import os
    import socket

    from xasink.dialects import dialect_for
    from xasink.dialects.keepalive import KEEPALIVE_IDLE_S

    url = _url(request, kind)
    for given, expected in ((None, 60), ("7", 7)):
        raw = {"url": url, "dbtable": "unused"} | ({"controlLockTimeout": given} if given else {})
        opts = parse_options(raw)
        dialect = dialect_for(opts.url, opts.branch_settings)
        with dialect.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            if kind == "pg":
                sock = socket.socket(fileno=os.dup(dbapi.fileno()))  # type: ignore[union-attr]
                shown = conn.exec_driver_sql("SELECT EXTRACT(EPOCH FROM current_setting('lock_timeout')::interval)")
                assert shown.scalar() == expected
            else:
                sock = dbapi._sock  # type: ignore[union-attr]
                row = conn.exec_driver_sql("SELECT @@innodb_lock_wait_timeout, @@lock_wait_timeout").one()
                assert tuple(row) == (expected, expected)
            try:
                assert sock.family in (socket.AF_INET, socket.AF_INET6)
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE_S
            finally:
                if kind == "pg":
                    sock.close()  # our duplicate of the descriptor
        dialect.dispose()


# --------------------------------------------------------------------------- item 10: durability of the server


def _write(url: str, table: str, sink: str, batch_id: int) -> None:
    """One batch of two rows through the protocol (preflight, a branch, decide, commit), as a job would."""
    from xasink.protocol.coordinator import Coordinator
    from xasink.protocol.partition_writer import write_partition
    from xasink.write_modes.schema import plan_target

    opts = parse_options({"url": url, "dbtable": table, "sinkId": sink, "batchId": str(batch_id)})
    coordinator = Coordinator(opts)
    try:
        coordinator.preflight(1)
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, opts, ID)
        batch = pa.RecordBatch.from_pylist([{"id": batch_id * 10}, {"id": batch_id * 10 + 1}], schema=ID)
        outcome = write_partition(
            opts, plan, batch_id=batch_id, partition=0, task_attempt_id=batch_id, run=new_run_nonce(), batches=[batch]
        )
        coordinator.commit(batch_id, [outcome])
    finally:
        coordinator.close()


def _table_ids(url: str, kind: str, table: str) -> list[int]:
    from tests.targets import mariadb_rows, rows

    return sorted(r[0] for r in (rows(url, table) if kind == "pg" else mariadb_rows(url, table)))


def _server_setting(url: str, kind: str, setting: str, value: str | None) -> str:
    """Set a server-wide setting (None: only read it; PostgreSQL "DEFAULT": ALTER SYSTEM RESET); its value before."""
    import time

    from tests.targets import connect

    if kind == "pg":
        with connect(url) as conn, conn.cursor() as cur:
            cur.execute(f"SHOW {setting}")
            before = str(cur.fetchone()[0])  # type: ignore[index]
            if value is None:
                return before
            cur.execute(
                f"ALTER SYSTEM RESET {setting}" if value == "DEFAULT" else f"ALTER SYSTEM SET {setting} = {value}"
            )
            cur.execute("SELECT pg_reload_conf()")
        for _ in range(250):  # the postmaster re-reads its files, then signals the backends
            now = _server_setting(url, kind, setting, None)
            if value == "DEFAULT" or now == value:
                break
            time.sleep(0.02)
        else:
            raise AssertionError(f"{setting} is still {now}, not {value}")
        return before
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT @@GLOBAL.{setting}")
        before = str(cur.fetchone()[0])  # type: ignore[index]
        if value is not None:
            cur.execute(f"SET GLOBAL {setting} = {int(value)}")
        return before


RISKY = [
    pytest.param("pg", "fsync", "off", id="pg-fsync"),
    pytest.param("pg", "full_page_writes", "off", id="pg-full_page_writes"),
    pytest.param("mariadb", "innodb_flush_log_at_trx_commit", "2", id="mariadb", marks=pytest.mark.mariadb),
]
# the test cluster runs without them (speed, xasink.support.embedded); the shared MariaDB runs with them
DURABLE = {"pg": {"fsync": "on", "full_page_writes": "on"}, "mariadb": {}}


@pytest.mark.parametrize(("kind", "setting", "risky"), RISKY)
def test_a_server_that_can_lose_prepared_branches_is_warned_about_once_per_run(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture, kind: str, setting: str, risky: str
) -> None:
    """Item 10: two writes against a server whose setting lets a crash lose prepared branches: one warning
    naming the setting, its value and what to set; none once the setting is durable again."""
    import logging

    from xasink.dialects import base

    url = _url(request, kind)
    table = f"dur_{uuid.uuid4().hex[:8]}"
    sink = f"du{uuid.uuid4().hex[:8]}"
    base._DURABILITY_WARNED.clear()
    caplog.set_level(logging.WARNING, logger="xasink")
    try:
        for name, value in DURABLE[kind].items():
            _server_setting(url, kind, name, value)
        before = _server_setting(url, kind, setting, risky)
        try:  # on the shared MariaDB the window stays as short as two small writes
            _write(url, table, sink, 1)
            _write(url, table, sink, 2)
        finally:
            _server_setting(url, kind, setting, before)
        warned = [r.getMessage() for r in caplog.records if "server crash" in r.getMessage()]
        assert len(warned) == 1, warned
        assert f" {setting} = {risky}: " in warned[0] and f"Set {setting} = " in warned[0]
        assert _server_setting(url, kind, setting, None) == before
        base._DURABILITY_WARNED.clear()
        caplog.clear()
        _write(url, table, sink, 3)
        assert [r.getMessage() for r in caplog.records if "server crash" in r.getMessage()] == []
        assert _table_ids(url, kind, table) == [10, 11, 20, 21, 30, 31]
    finally:
        for name in DURABLE[kind]:
            _server_setting(url, kind, name, "DEFAULT")
        _drop(url, kind, table)


def _drop(url: str, kind: str, table: str) -> None:
    from tests.targets import connect

    if kind == "pg":
        with connect(url) as conn, conn.cursor() as cur:
            cur.execute('DROP TABLE IF EXISTS "{}"'.format(table.replace('"', '""')))
    else:
        with mariadb_connect(url) as conn, conn.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS `{}`".format(table.replace("`", "``")))


@pytest.mark.parametrize("kind", BOTH)
def test_names_and_values_with_backslashes_and_quotes_are_written_exactly(
    request: pytest.FixtureRequest, kind: str
) -> None:
    """Item 11, end to end: a table whose name holds quotes and backslashes, values full of them, the journal in
    a schema-qualified log; on PostgreSQL with standard_conforming_strings off.  Exact rows, nothing prepared."""
    from tests.targets import mariadb_prepared_gids, prepared_gids
    from xasink.protocol.coordinator import Coordinator
    from xasink.protocol.partition_writer import write_partition
    from xasink.write_modes.schema import plan_target

    url = _url(request, kind)
    session_url = _pg_scs_off(url) if kind == "pg" else url
    table = f"q'uo\\te\"{uuid.uuid4().hex[:6]}"
    quoted = '"' + table.replace('"', '""') + '"' if kind == "pg" else "`" + table.replace("`", "``") + "`"
    sink = f"bs{uuid.uuid4().hex[:8]}"
    values = [NASTY, "\\", "'", "\\'", "''", "a\\\\b", "%s", "E'x'"]
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    opts = parse_options({"url": session_url, "dbtable": quoted, "sinkId": sink, "batchId": "1"})
    coordinator = Coordinator(opts)
    try:
        coordinator.preflight(1)
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, opts, schema)
        assert plan.table == table
        batch = pa.RecordBatch.from_pylist([{"id": i, "v": v} for i, v in enumerate(values)], schema=schema)
        outcome = write_partition(
            opts, plan, batch_id=1, partition=0, task_attempt_id=1, run=new_run_nonce(), batches=[batch]
        )
        coordinator.commit(1, [outcome])
        with coordinator.dialect.connect() as conn:
            import sqlalchemy as sa

            name = coordinator.dialect.engine.dialect.identifier_preparer.quote_identifier(table)
            got = conn.execute(sa.text(f"SELECT id, v FROM {name} ORDER BY id")).all()
        assert [tuple(r) for r in got] == list(enumerate(values))
        left = prepared_gids(url) if kind == "pg" else mariadb_prepared_gids(url, [sink])
        assert [g for g in left if sink in g] == []
    finally:
        coordinator.close()
        _drop(url, kind, table)


@pytest.mark.parametrize("url_options", [None, "-c synchronous_commit=off"])
def test_the_decision_commits_durably_whatever_the_session_default(pg_url: str, url_options: str | None) -> None:
    """Control sessions start with synchronous_commit on, so the decision's transaction needs no SET of its
    own; a URL whose options turn it off gets it back for that transaction (durable_commit)."""
    from urllib.parse import quote

    from xasink.dialects import dialect_for

    url = pg_url if url_options is None else f"{pg_url}?options={quote(url_options)}"
    opts = parse_options({"url": url, "dbtable": "unused", "sinkId": "edges"})
    dialect = dialect_for(opts.url, pool_size=1)
    try:
        with dialect.connect() as conn:
            default = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()
            conn.rollback()
            with conn.begin():
                dialect.durable_commit(conn)
                inside = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()
            with conn.begin():
                dialect.relaxed_commit(conn)
                relaxed = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()
            after = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()
            conn.rollback()
    finally:
        dialect.dispose()
    assert default == ("on" if url_options is None else "off")
    assert (inside, relaxed, after) == ("on", "off", default)


class _NotMade(Exception):
    """A step's own error over the database's, as the decision's DecisionNotMade is."""


@pytest.mark.parametrize("shape", ["plain", "savepoint", "wrapped"])
@pytest.mark.parametrize("kind", BOTH)
def test_a_transaction_chosen_as_a_deadlocks_victim_runs_again_and_a_lock_wait_does_not(
    request: pytest.FixtureRequest, kind: str, shape: str
) -> None:
    """Three sinks claiming their first batches side by side on MariaDB: one claim was the victim of an InnoDB
    gap-lock deadlock, and its batch failed ("try restarting transaction").  Two transactions here take two
    rows in opposite orders, each through ``again_if_deadlocked``: the server rolls one back, which runs
    again and both commit.  So too when the deadlock comes inside a savepoint (MariaDB then raises 1305,
    "SAVEPOINT does not exist", over it: a claim that registers its sink found that) or is wrapped in the
    step's own error (a decision not made).  A lock wait past controlLockTimeout is no deadlock: one try."""
    import threading

    import sqlalchemy as sa

    from xasink.dialects import dialect_for
    from xasink.protocol.retry import again_if_deadlocked

    url = _url(request, kind)
    table = f"dl{uuid.uuid4().hex[:8]}"
    options = parse_options({"url": url, "dbtable": table, "controlLockTimeout": "2"})
    dialect = dialect_for(options.url, options.branch_settings)
    t = sa.table(table, sa.column("k"), sa.column("n"))
    try:
        with dialect.connect() as conn, conn.begin():
            conn.execute(sa.text(f"CREATE TABLE {table} (k INT PRIMARY KEY, n INT NOT NULL)"))
            conn.execute(t.insert(), [{"k": 1, "n": 0}, {"k": 2, "n": 0}])
        both_hold_one = threading.Barrier(2, timeout=30)
        tries: list[int] = []

        def bump(first: int, second: int) -> None:
            tries.append(first)
            try:
                with dialect.connect() as conn, conn.begin():
                    conn.execute(t.update().where(t.c.k == first).values(n=t.c.n + 1))
                    if tries.count(first) == 1:  # the first try of each: both hold a row, then want the other's
                        both_hold_one.wait()
                    with conn.begin_nested() if shape == "savepoint" else contextlib.nullcontext():
                        conn.execute(t.update().where(t.c.k == second).values(n=t.c.n + 1))
            except Exception as exc:
                if shape == "wrapped":
                    raise _NotMade(str(exc)) from exc
                raise

        errors: list[BaseException] = []

        def run(first: int, second: int) -> None:
            try:
                again_if_deadlocked(
                    dialect,
                    f"bumping {first} then {second}",
                    lambda: bump(first, second),
                    unwrap=(lambda exc: exc.__cause__ if isinstance(exc, _NotMade) else None)
                    if shape == "wrapped"
                    else None,
                )
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=pair) for pair in ((1, 2), (2, 1))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == [] and len(tries) == 3 and set(tries) == {1, 2}, (errors, tries)  # one ran again
        with dialect.connect() as conn:
            assert sorted(conn.execute(sa.select(t.c.k, t.c.n)).all()) == [(1, 2), (2, 2)]

        with dialect.connect() as holder, holder.begin():  # another session holds row 1: a lock wait, no deadlock
            holder.execute(t.update().where(t.c.k == 1).values(n=0))
            waits: list[int] = []

            def blocked() -> None:
                waits.append(1)
                with dialect.connect() as conn, conn.begin():
                    conn.execute(t.update().where(t.c.k == 1).values(n=9))

            with pytest.raises(sa.exc.DBAPIError) as info:
                again_if_deadlocked(dialect, "waiting for row 1", blocked)
        assert waits == [1] and not dialect.deadlocked(info.value)
    finally:
        dialect.dispose()
        _drop(url, kind, table)


@pytest.mark.parametrize("kind", BOTH)
def test_a_claim_locks_no_gap_another_sinks_claim_needs(request: pytest.FixtureRequest, kind: str) -> None:
    """The root of the claims' deadlocks: a run taking over a batch ran ``UPDATE ... run != me``, whose search
    of the (sink, batch) range locks the InnoDB gap where the next sink's claims go, so a claim of the sink
    beside it waited for (or deadlocked with) the first's transaction.  Now the holders are read plainly and
    superseded by their whole key: the neighbour's claim goes through while a first claim, or a take-over
    from an earlier run, is open; and the later run still supersedes the earlier."""
    from xasink.protocol.coordinator import Coordinator

    url = _url(request, kind)
    prefix = f"gp{uuid.uuid4().hex[:8]}"
    coordinators = {  # adjacent in the claims table's key order
        name: Coordinator(
            parse_options({"url": url, "dbtable": "unused", "sinkId": prefix + name, "controlLockTimeout": "2"})
        )
        for name in "abcd"
    }
    a, b, c, d = coordinators.values()
    try:
        a.preflight()
        for each in coordinators.values():
            with each.journal.locked(each.sink_id):
                pass  # every sink registered: the claims below touch only the claims table
        assert c.claim(1, "runc1") is True  # the batch of sink c that a later run takes over
        with a.journal.locked(a.sink_id) as held:  # sink a's first run claims batch 1 and stays open
            a.journal.take_over(held, a.sink_id, 1, "runa1")
            assert b.claim(1, "runb1") is True  # no wait for sink a's transaction (a lock wait: 2 s, then error)
        with c.journal.locked(c.sink_id) as held:  # a replay of sink c's batch 1 takes it over and stays open
            c.journal.take_over(held, c.sink_id, 1, "runc2")
            assert d.claim(1, "rund1") is True
        holders = {}
        with a.dialect.connect() as conn:
            for each in coordinators.values():
                holders[each.sink_id[-1]] = each.journal.holder(conn, each.sink_id, 1)
            states = c.journal.claim_states(conn, c.sink_id, {1})
        assert holders == {"a": "runa1", "b": "runb1", "c": "runc2", "d": "rund1"}
        assert {run: s.superseded for (_, run), s in states.items()} == {"runc1": True, "runc2": False}
        with pytest.raises(ConcurrentWriterError):
            c.claim(1, "runc1")  # the earlier run may not write on
    finally:
        for each in coordinators.values():
            each.close()


@pytest.mark.parametrize("kind", BOTH)
def test_a_part_being_recorded_locks_no_gap_another_transactions_part_needs(
    request: pytest.FixtureRequest, kind: str
) -> None:
    """A multi-target write records its prepared branches as a part (xasink/journal/parts.py).  Recording
    deleted the part's earlier record first, and that DELETE finding no row locks on InnoDB the gap where the
    next sink's parts go: two transactions recording parts at once deadlocked (scenario seed 30115, told a raw
    1213), and one held open made the other wait.  Now the neighbour's part goes in at once, and a part
    recorded again replaces its first record."""
    from xasink.journal.parts import Part, ensure_parts, read_parts, record_part
    from xasink.protocol.coordinator import Coordinator

    url = _url(request, kind)
    prefix = f"pp{uuid.uuid4().hex[:8]}"
    a, b = (
        Coordinator(parse_options({"url": url, "dbtable": "unused", "sinkId": prefix + n, "controlLockTimeout": "2"}))
        for n in "ab"
    )

    run = new_run_nonce()

    def part(sink: str, xids: int) -> Part:
        gids = tuple(Xid(a.journal.log_id(), sink, 1, i, f"{i}-{run}") for i in range(xids))
        return Part(sink, 1, run, 0, "server", "{}", gids, xids, 0, False)

    try:
        a.preflight()  # the log's tables
        ensure_parts(a.journal)
        with a.dialect.connect() as held, held.begin():  # sink a's part, its transaction left open
            record_part(held, a.journal, part(a.sink_id, 1))
            with b.dialect.connect() as conn, conn.begin():  # a lock wait: 2 s, then an error
                record_part(conn, b.journal, part(b.sink_id, 1))
        with a.dialect.connect() as conn, conn.begin():  # a retried commit of the same write
            record_part(conn, a.journal, part(a.sink_id, 2))
        with a.dialect.connect() as conn:
            recorded = {s: read_parts(conn, a.journal, s, 1) for s in (a.sink_id, b.sink_id)}
        assert {s: [len(p.xids) for p in parts] for s, parts in recorded.items()} == {a.sink_id: [2], b.sink_id: [1]}
    finally:
        with a.dialect.connect() as conn, conn.begin():
            conn.execute(a.journal.parts.delete().where(a.journal.parts.c.sink_id.in_([a.sink_id, b.sink_id])))
        a.close()
        b.close()
