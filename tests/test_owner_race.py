"""MariaDB: a branch finished while its owner disconnects is finished for real (issue 37, item 6).

An XA COMMIT or XA ROLLBACK that lands while the branch's owner session is disconnecting answers OK, yet the
transaction stays prepared, unlisted by XA RECOVER, its rows invisible and locked, until the server restarts
(see xasink/dialects/mysql/owner.py).  Before the fix, an owner the wait had once given up on (still connected
after 5 s) was never waited for again, so the verb that came as it finally left raced with it.

Each test runs on a private server of its own (a branch left hidden would hold its locks on the shared one until
it restarts).  An owner that holds many user variables takes milliseconds instead of microseconds to let go of
its branch (the server frees them in that window), which makes the race certain instead of rare; the soak test
repeats the plain race: 50 owners leaving while their branches are finished, round after round.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pymysql
import pytest

from tests.harness import private_mariadb
from tests.targets import mariadb_connect, mariadb_recover
from xasink.dialects.mysql import BranchBusyError, MySQLBranch, MySQLDialect, xid_literal
from xasink.dialects.mysql.errors import HiddenBranchError
from xasink.dialects.mysql.innodb import TrxReader
from xasink.dialects.mysql.owner import Owner
from xasink.dialects.mysql.xa import owner_lock
from xasink.dialects.values import TargetPlan
from xasink.options import parse_options
from xasink.protocol.xid import FORMAT_ID, Xid, new_run_nonce
from xasink.support.embedded_mariadb import EmbeddedMariaDB

pytestmark = pytest.mark.mariadb

ID = pa.schema([("id", pa.int64())])
HELD_VARIABLES = 300_000  # an owner holding this many user variables takes ~20 ms to let go of its branch


@pytest.fixture(scope="module")
def private() -> Iterator[tuple[EmbeddedMariaDB, str]]:
    """A private MariaDB and the URL of a database on it."""
    with private_mariadb("race") as found:
        yield found


@pytest.fixture
def server(private: tuple[EmbeddedMariaDB, str]) -> str:
    return private[1]


def _dialect(url: str) -> MySQLDialect:
    return MySQLDialect(parse_options({"url": url, "dbtable": "unused", "sinkId": "race"}).url)


def _table(url: str) -> str:
    name = f"t_{uuid.uuid4().hex[:8]}"
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{name}` (id BIGINT PRIMARY KEY) ENGINE=InnoDB")
    return name


def _prepared_owners(dialect: MySQLDialect, table: str, ids: range, variables: int = 0) -> list[MySQLBranch]:
    """One prepared branch per id (its row), each owner session still connected."""
    plan = TargetPlan(None, table, ID, ("id",))
    run = new_run_nonce()
    owners = []
    for i in ids:
        branch = dialect.open_branch(Xid(uuid.uuid4().hex[:10], "race", 0, i, f"1-{run}"), plan)
        assert isinstance(branch, MySQLBranch)
        branch.load(iter([pa.RecordBatch.from_pylist([{"id": i}], schema=ID)]))
        for start in range(0, variables, 5000):
            branch.cursor.execute("SET " + ",".join(f"@v{j} = {j}" for j in range(start, start + 5000)))
        branch.cursor.execute(f"XA END {xid_literal(branch.xid)}")
        branch.cursor.execute(f"XA PREPARE {xid_literal(branch.xid)}")
        owners.append(branch)
    return owners


def _listed(url: str, xid: Xid) -> bool:
    return (FORMAT_ID, xid.gtrid.encode(), xid.bqual.encode()) in mariadb_recover(url)


def _finish(dialect: MySQLDialect, conn: object, url: str, xid: Xid, verb: str) -> None:
    """COMMIT or ROLLBACK the branch as the coordinator and a sweep do: again while its owner is still attached."""
    deadline = time.monotonic() + 180  # (a hang, not a timing: a loaded CI is slow)
    while True:
        try:
            if verb == "COMMIT":
                dialect.commit_prepared(conn, xid)  # type: ignore[arg-type]
                return
            dialect.rollback_prepared(conn, xid)  # type: ignore[arg-type]
            if not _listed(url, xid):  # (left for the next sweep while its owner is attached)
                return
        except BranchBusyError:
            pass
        assert time.monotonic() < deadline, f"{xid} not finished within 60 s"
        time.sleep(0.001)


def _give_up_on(dialect: MySQLDialect, conn: object, owners: list[MySQLBranch]) -> None:
    """An earlier pass that gave up waiting for every owner (each still connected): a commit round that ran out."""
    for branch in owners:
        with contextlib.suppress(BranchBusyError):
            dialect.await_owner(conn, branch.xid, timeout_s=0.0)  # type: ignore[arg-type]


def _hidden(url: str, table: str, owners: list[MySQLBranch], verb: str) -> list[int]:
    """The ids whose branch was finished with OK but did not take effect: unlisted, yet its row locked."""
    with mariadb_connect(url) as probe, probe.cursor() as cur:
        cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
        cur.execute(f"SELECT id FROM `{table}`")
        present = {int(r[0]) for r in cur.fetchall()}
        bad = []
        for branch in owners:
            i = branch.xid.partition
            assert not _listed(url, branch.xid), f"branch of {i} still listed"
            if (i in present) != (verb == "COMMIT"):
                bad.append(i)
                continue
            try:
                cur.execute(f"SELECT COUNT(*) FROM `{table}` WHERE id = %s FOR UPDATE", (i,))
                cur.execute("COMMIT")
            except pymysql.err.OperationalError as exc:
                assert exc.args[0] == 1205, exc
                bad.append(i)
        return bad


@pytest.mark.parametrize("verb", ["COMMIT", "ROLLBACK"])
def test_a_branch_finished_as_its_owner_leaves_is_finished_for_real(server: str, verb: str) -> None:
    """Owners the wait gave up on before (each still connected then) leave while their branches are finished.

    Before the fix every verb of such a branch skipped the wait and raced with the owner's exit: with an owner
    that takes ~20 ms to let go, XA COMMIT / ROLLBACK answered OK and the branch stayed prepared and hidden
    (its row invisible after a COMMIT, locked either way).  Now the owner is checked again and the verb waits
    until InnoDB has let go of the branch: every row is there (COMMIT) or not (ROLLBACK), and none is locked.
    """
    dialect = _dialect(server)
    table = _table(server)
    owners = _prepared_owners(dialect, table, range(3), variables=HELD_VARIABLES)
    try:
        with dialect.connect(autocommit=True) as ctl:
            _give_up_on(dialect, ctl, owners)
            for branch in owners:
                branch.conn.close()  # the owner leaves ...
                _finish(dialect, ctl, server, branch.xid, verb)  # ... while its branch is finished
        assert _hidden(server, table, owners, verb) == []
    finally:
        dialect.dispose()


@pytest.mark.parametrize("source", ["status", "innodb_trx"])
def test_a_view_of_innodb_shows_a_prepared_branch_attached_then_detached(server: str, source: str) -> None:
    """What the owner waits read (SHOW ENGINE INNODB STATUS, else INNODB_TRX with a witness): a prepared branch
    is attached to its owner's session while it is connected, idle and (from the status) prepared; once the
    owner has left it is attached to no session, and once committed it is gone."""
    dialect = _dialect(server)
    table = _table(server)
    [branch] = _prepared_owners(dialect, table, range(1))
    reader = TrxReader(dialect.raw_connect, status=source == "status")  # (INNODB_TRX: the fallback)
    try:
        seen = reader.view(time.monotonic(), 5)
        assert seen is not None
        attached = [t for t in seen.rows if t.session == branch.connection_id]
        # its COMMAND may still read "Query" for a moment after the owner got XA PREPARE's OK (the server answers
        # before it marks the session idle): what counts is that it is not taken for an owner on its way out
        assert len(attached) == 1 and not attached[0].busy and attached[0].command in ("Sleep", "Query")
        assert (branch.connection_id, attached[0].id) not in seen.disconnecting()
        assert attached[0].prepared is (True if source == "status" else None)
        branch.conn.close()
        deadline = time.monotonic() + 10
        while True:
            view = reader.view(time.monotonic(), 5)
            assert view is not None
            if not view.of_session(branch.connection_id):
                break
            assert time.monotonic() < deadline, "the owner's transaction stayed attached"
            time.sleep(0.05)
        assert attached[0].id in view.transactions()  # prepared, detached
        with dialect.connect(autocommit=True) as conn:
            dialect.commit_prepared(conn, branch.xid)
        view = reader.view(time.monotonic(), 5)
        assert view is not None and attached[0].id not in view.transactions()
    finally:
        reader.close()
        dialect.dispose()


def test_a_verb_that_answered_ok_but_left_its_branch_hidden_is_caught(private: tuple[EmbeddedMariaDB, str]) -> None:
    """The check after the verb, where the owner's transaction was seen: a branch left hidden by a plain
    ``XA COMMIT`` sent again and again while its slow owner left (what xasink did before the fix) answers OK,
    yet its transaction is still in InnoDB: :class:`HiddenBranchError`, not "committed".  After a restart the
    branch is listed again (and rolled back here)."""
    server, url = private
    dialect = _dialect(url)
    table = _table(url)
    reader = TrxReader(dialect.raw_connect)
    try:
        for i in range(5):  # the plain verb lands in the owner's exit nearly always; a few tries to be sure
            [branch] = _prepared_owners(dialect, table, range(i, i + 1), variables=HELD_VARIABLES)
            seen = reader.view(time.monotonic(), 5)
            assert seen is not None
            owner = Owner(owner_lock(branch.xid), branch.connection_id, seen.of_session(branch.connection_id))
            with mariadb_connect(url) as raw, raw.cursor() as cur:
                branch.conn.close()
                while True:
                    try:
                        cur.execute(f"XA COMMIT {xid_literal(branch.xid)}")
                        break
                    except pymysql.err.OperationalError as exc:
                        assert exc.args[0] == 1397, exc  # XAER_NOTA: the owner has not let go yet
            if _hidden(url, table, [branch], "COMMIT"):
                break
        else:
            pytest.fail("no XA COMMIT left its branch hidden in five tries")
        with pytest.raises(HiddenBranchError, match="restart"):
            dialect.owners.finished(branch.xid, owner, "COMMIT", xid_literal(branch.xid))
        server.restart()
        assert _listed(url, branch.xid)
        with mariadb_connect(url) as conn, conn.cursor() as cur:
            cur.execute(f"XA ROLLBACK {xid_literal(branch.xid)}")
    finally:
        reader.close()
        dialect.dispose()


def _leave(branch: MySQLBranch, how: int, killer: pymysql.connections.Connection) -> None:
    """The owner's session ends: killed, closed (COM_QUIT), or its socket gone without a word."""
    if how == 0:
        with killer.cursor() as cur:
            cur.execute(f"KILL {branch.connection_id}")
    elif how == 1:
        branch.conn.close()
    else:
        branch.conn._sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
        branch.conn._sock.close()  # type: ignore[union-attr]


@pytest.mark.soak
@pytest.mark.parametrize("verb", ["COMMIT", "ROLLBACK"])
@pytest.mark.parametrize("variables", [0, 20_000], ids=["plain", "slow-exit"])
def test_soak_owners_leaving_while_their_branches_are_finished(server: str, verb: str, variables: int) -> None:
    """Item 6's repetition: 50 owners, a pass that gives up on all of them, then each leaves while the verbs run
    (killed, closed or cut, staggered over ~50 ms).  Rounds: XASINK_OWNER_RACE_ROUNDS (default 20).  Before the
    fix: hidden branches in most runs (the count is in the failure); after: none."""
    import os

    rounds = int(os.environ.get("XASINK_OWNER_RACE_ROUNDS", "20"))
    dialect = _dialect(server)
    hidden: list[int] = []
    try:
        with mariadb_connect(server) as killer:
            for r in range(rounds):
                table = _table(server)
                owners = _prepared_owners(dialect, table, range(50), variables=variables)
                with dialect.connect(autocommit=True) as ctl:
                    _give_up_on(dialect, ctl, owners)

                    def leave_all(owners: list[MySQLBranch] = owners) -> None:
                        for j, branch in enumerate(owners):
                            time.sleep(random.random() * 0.002)
                            _leave(branch, j % 3, killer)

                    leaving = threading.Thread(target=leave_all)
                    leaving.start()
                    try:
                        for branch in owners:
                            _finish(dialect, ctl, server, branch.xid, verb)
                    finally:
                        leaving.join()
                hidden += [r * 1000 + i for i in _hidden(server, table, owners, verb)]
    finally:
        dialect.dispose()
    assert hidden == [], f"{len(hidden)} of {rounds * 50} branches hidden: {hidden}"
