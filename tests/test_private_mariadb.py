"""MariaDB edges of issue 37 item 6 that need a server of the test's own: restarts (kill -9).

* A run that claimed its batch in the very second the server restarted is alive during the restart grace
  (MariaDB's uptime, clock and claim stamps are whole seconds: a strict ``<`` judged it dead).
* A branch whose session id is handed to another session after a restart still reports its xid.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from tests.harness import Sink, expected, private_mariadb
from tests.leaks import run_cli
from tests.targets import mariadb_connect, mariadb_recover, mariadb_rows
from xasink.dialects.mysql import MySQLDialect
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.judgement import WAIT
from xasink.support.embedded_mariadb import EmbeddedMariaDB

pytestmark = [pytest.mark.mariadb, pytest.mark.crash]


@pytest.fixture(scope="module")
def restartable() -> Iterator[tuple[EmbeddedMariaDB, str]]:
    """A private MariaDB to crash and restart, and the URL of a database on it."""
    with private_mariadb("restarts") as found:
        yield found


def _table(url: str) -> str:
    name = f"t_{uuid.uuid4().hex[:8]}"
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{name}` (id INT NOT NULL PRIMARY KEY, name TEXT) ENGINE=InnoDB")
    return name


def _early_in_a_second() -> None:
    """Return just after the wall clock turned a second: what follows within ~0.5 s stays in that second."""
    time.sleep(1.0 - time.time() % 1.0 + 0.01)


def _server_start(url: str) -> Any:
    """When the server started, as a claim would be stamped: its UTC clock less its uptime (whole seconds)."""
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT UTC_TIMESTAMP() - INTERVAL VARIABLE_VALUE SECOND FROM information_schema.GLOBAL_STATUS "
            "WHERE VARIABLE_NAME = 'UPTIME'"
        )
        return cur.fetchone()[0]  # type: ignore[index]


def _claimed_at(url: str, sink_id: str, batch_id: int) -> Any:
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT claimed_at FROM xasink_claims WHERE sink_id = %s AND batch_id = %s", (sink_id, batch_id))
        return cur.fetchone()[0]  # type: ignore[index]


def test_a_run_that_claimed_in_the_second_of_a_restart_is_alive(restartable: tuple[EmbeddedMariaDB, str]) -> None:
    """A live run claims its batch and prepares its branches; the server restarts (kill -9) within that second,
    before the run's keeper takes its guard again.  A cron'd ``xasink recover`` in the restart grace must leave
    the run's branches alone, and the run then commits its batch.  Before the fix (a strict ``<`` of whole
    seconds) recover judged the run dead, rolled its branches back, and the run was told ConcurrentWriterError.
    """
    server, url = restartable
    table = _table(url)
    sink = Sink(url, table, prefix="rs")
    guard = f"xasink:test:{uuid.uuid4().hex[:8]}"  # the run's guard: a keeper's session holds it until the crash
    for batch in (1, 2, 3):
        keeper = pymysql.connect(**{**_params(url), "autocommit": True})
        with keeper.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, 0)", (guard,))
        _early_in_a_second()
        outcomes = sink.prepare(batch, range(batch * 10, batch * 10 + 10), guard=guard)
        server.restart()
        with contextlib.suppress(pymysql.err.MySQLError):
            keeper.close()
        if _claimed_at(url, sink.sink_id, batch) == _server_start(url):
            break  # the claim and the restart fell in one second: the case under test
        Coordinator(sink.options).commit(batch, outcomes)  # not this time (a slow restart): once more
    else:
        pytest.fail("could not restart the server within the second of a claim in three tries")
    cli = run_cli("recover", "--url", url, "--sink-id", sink.sink_id, "--json")
    entries = [e for e in json.loads(cli.stdout)["entries"] if e["sink_id"] == sink.sink_id]
    assert entries and {e["action"] for e in entries} == {WAIT}, entries
    coordinator = Coordinator(sink.options)
    try:
        result = coordinator.commit(batch, outcomes)
    finally:
        coordinator.close()
    assert result.rows == 10 and not result.skipped
    ids = [i for b in range(1, batch + 1) for i in range(b * 10, b * 10 + 10)]
    assert sorted(mariadb_rows(url, table)) == expected(ids)
    assert [x for x in mariadb_recover(url) if sink.sink_id.encode() in x[1]] == []


def _params(url: str) -> dict[str, Any]:
    from tests.targets import mariadb_params

    return mariadb_params(url)


def test_a_branch_whose_session_id_is_taken_after_a_restart_still_reports(
    restartable: tuple[EmbeddedMariaDB, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server restarts right after a branch prepared, before the branch saw its session leave; after the
    restart (session ids start again from 1) another session gets the branch's id.  The branch is prepared
    and its owner gone, so it reports its xid and the batch commits.  Before the fix the branch waited 30 s
    for that other session and failed its task, "rolled back by the batch's abort" while still prepared (the
    abort did roll it back: a good branch thrown away after a 30 s stall)."""
    server, url = restartable
    table = _table(url)
    sink = Sink(url, table, prefix="ri")
    real = MySQLDialect.wait_detached
    squatters: list[pymysql.connections.Connection] = []

    def restart_first(self: MySQLDialect, connection_id: int, *args: Any, **kwargs: Any) -> None:
        server.restart()
        for _ in range(connection_id + 20):  # sessions until one has the branch's id; it stays connected
            conn = pymysql.connect(**{**_params(url), "autocommit": True})
            with conn.cursor() as cur:
                cur.execute("SELECT CONNECTION_ID()")
                got = int(cur.fetchone()[0])  # type: ignore[index]
            if got == connection_id:
                squatters.append(conn)
                break
            conn.close()
            if got > connection_id:
                break
        assert squatters, f"no session got id {connection_id} after the restart"
        real(self, connection_id, *args, **kwargs)

    monkeypatch.setattr(MySQLDialect, "wait_detached", restart_first)
    try:
        outcome = sink.write(1, 0, range(5))
    finally:
        monkeypatch.setattr(MySQLDialect, "wait_detached", real)
        for conn in squatters:
            conn.close()
    coordinator = Coordinator(sink.options)
    try:
        assert coordinator.commit(1, [outcome]).rows == 5
    finally:
        coordinator.close()
    assert sorted(mariadb_rows(url, table)) == expected(range(5))
    assert [x for x in mariadb_recover(url) if sink.sink_id.encode() in x[1]] == []
