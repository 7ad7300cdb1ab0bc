"""The operator's commands never say all is well by mistake: each case of docs/monitoring.md and
docs/operations.md that the other CLI tests do not cover, through ``xasink status`` / ``xasink recover``.

A typo in ``--journal-prefix`` or ``--journal-schema``, a ``--url`` naming the wrong database, a ``--sink-id``
the log does not hold: status is UNKNOWN (exit 3) and recover exits 2 having changed nothing, even when
nothing is prepared (a cron line or a Nagios check with a typo must not stay green).  A server on which xasink
cannot write (PostgreSQL with ``max_prepared_transactions = 0``, MariaDB with ``read_only = ON``, each a
private server of the test's) is CRITICAL.  Each test runs on PostgreSQL and MariaDB (the ``db`` fixture of
tests/harness.py) and declares the docs' cases it covers (tests/doc_cases.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import targets
from tests.harness import SECRET, Db, cli, cli_db

db = cli_db  # PostgreSQL and MariaDB, with its own leak check


def cli_json(*args: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = cli(*args, "--json")
    doc = json.loads(out)
    assert doc["exit_code"] == code, out + err
    return code, doc, err


@pytest.mark.doc_case("status/no-log", "recover/no-log")
def test_no_decision_log_is_unknown_and_recover_changes_nothing(db: Db) -> None:
    """Nothing of the test is prepared: the old check said OK (exit 0) and recover exited 0 having done nothing."""
    sink = db.sink()
    sink.coordinator.commit(0, [sink.write(0, 0, range(3))])  # the log exists, under the writers' prefix
    before = db.snapshot()
    with db.backend.other_database() as elsewhere:
        typos = [
            ("--url", db.url, "--journal-prefix", "xasnk_"),  # a typo in the prefix
            ("--url", db.url, "--journal-schema", "nosuch"),  # a schema (MariaDB: database) that does not exist
            ("--url", elsewhere),  # the URL names the wrong database
        ]
        for args in typos:
            code, doc, _ = cli_json("status", *args)
            assert (code, doc["state"]) == (3, "UNKNOWN"), doc
            [error] = doc["errors"]
            assert "decision log" in error and "not found" in error and "--journal-prefix" in error, error
            assert [c["name"] for c in doc["checks"] if c["state"] == "UNKNOWN"] == ["errors"]
            code, out, err = cli("status", *args)
            assert code == 3 and "not found" in err and out.splitlines()[-1].startswith("XASINK UNKNOWN"), out + err

            for dry in ([], ["--dry-run"]):
                code, doc, err = cli_json("recover", *args, "--older-than", "0s", *dry)
                assert code == 2 and doc["acted"] is False, doc
                assert any("decision log" in e and "not found" in e for e in doc["errors"]), doc["errors"]
                code, out, err = cli("recover", *args, *dry)
                assert code == 2 and "not found" in err, out + err
            assert db.snapshot() == before
    # the right prefix, schema and database: all is well
    assert cli("status", "--url", db.url, "--sink-id", sink.sink_id)[0] == 0
    assert cli("recover", "--url", db.url, "--sink-id", sink.sink_id)[0] == 0


def test_with_no_log_no_branch_is_counted_as_this_logs(db: Db) -> None:
    """A branch of the real log left prepared: a URL or prefix naming no log showed it as "of this xasink log"
    and stale (status checks "stale: 1 stale"); with no log, every xasink branch is another log's."""
    sink = db.sink()
    branch = sink.write(1, 0, range(3))  # prepared, undecided, of the writers' log
    try:
        with db.backend.other_database() as elsewhere:
            for args in (("--url", db.url, "--journal-prefix", "xasnk_"), ("--url", elsewhere)):
                code, doc, _ = cli_json("status", *args, "--older-than", "0s")
                assert code == 3 and doc["sinks"] == [], doc
                # (PostgreSQL lists a database's own prepared transactions only: none in the other database)
                assert doc["other_log_prepared"] >= (1 if elsewhere not in args else 0), doc
                assert [c["name"] for c in doc["checks"] if c["state"] != "OK"] == ["errors"], doc["checks"]
                code, doc, _ = cli_json("recover", *args, "--older-than", "0s", "--dry-run")
                mine = [e for e in doc["entries"] if e["sink_id"] == sink.sink_id]
                assert code == 2 and {e["decision"] for e in mine} <= {"other-log"}, doc["entries"]
                assert not any(e["ours"] for e in doc["entries"]), doc["entries"]
                code, out, err = cli("recover", *args, "--older-than", "0s", "--dry-run")
                assert code == 2 and ": 0 of this xasink log," in out and " 0 of xasink older than" in out, out + err
    finally:
        sink.coordinator.abort(1, [branch])
    assert db.snapshot() == set()


@pytest.mark.doc_case("status/no-sink", "recover/no-sink")
def test_a_sink_the_log_does_not_hold_is_unknown(db: Db) -> None:
    sink = db.sink()
    sink.coordinator.commit(0, [sink.write(0, 0, range(3))])
    left = sink.write(1, 0, range(3, 6))  # a branch of the real sink, undecided
    missing = f"no-such-{uuid.uuid4().hex[:6]}"
    code, doc, _ = cli_json("status", "--url", db.url, "--sink-id", missing)
    assert (code, doc["state"], doc["sinks"]) == (3, "UNKNOWN", []), doc
    [error] = doc["errors"]
    assert f"sink {missing} is not in the decision log" in error and "--sink-id" in error, error
    code, out, err = cli("status", "--url", db.url, "--sink-id", missing)
    assert code == 3 and missing not in out.split("recent batches")[0].splitlines()[1:2], out
    assert f"sink {missing} is not in the decision log" in err

    for dry in (["--dry-run"], []):
        code, doc, _ = cli_json("recover", "--url", db.url, "--sink-id", missing, "--older-than", "0s", *dry)
        assert code == 2 and doc["acted"] is False and doc["entries"] == [], doc
        assert any(f"sink {missing} is not in the decision log" in e for e in doc["errors"])
    assert db.mine() == {left.gid}  # nothing was changed
    assert cli("status", "--url", db.url, "--sink-id", sink.sink_id)[0] == 0
    code, out, err = cli("recover", "--url", db.url, "--sink-id", sink.sink_id, "--older-than", "0s")
    assert code == 0 and db.mine() == set(), out + err


@pytest.mark.doc_case("status/cannot-write", "recover/cannot-write")
def test_a_server_xasink_cannot_write_on_is_critical(db: Db) -> None:
    """PostgreSQL with max_prepared_transactions = 0 (the default), MariaDB with read_only = ON: every write
    fails there; the old status said OK."""
    pg = db.backend.name == "postgresql"
    why = "max_prepared_transactions = 0" if pg else "read_only = ON"
    with db.backend.server_that_cannot_write() as url:
        code, doc, _ = cli_json("status", "--url", url)
        assert (code, doc["state"], doc["errors"]) == (2, "CRITICAL", []), doc
        [blocker] = doc["write_blockers"]
        assert why in blocker, blocker
        assert [(c["name"], c["state"]) for c in doc["checks"]] == [("server", "CRITICAL")]
        code, out, err = cli("status", "--url", url)
        assert code == 2 and why in err, out + err
        assert out.splitlines()[-1].startswith("XASINK CRITICAL - server: ") and why in out.splitlines()[-1]
        code, out, err = cli("status", "--url", url, "--prometheus")
        assert code == 2 and "xasink_writable{" in out and why in err
        assert [ln.rsplit(" ", 1)[1] for ln in out.splitlines() if ln.startswith("xasink_writable{")] == ["0"]

        code, doc, err = cli_json("recover", "--url", url)  # nothing can be prepared there: nothing to do
        assert (code, doc["errors"], doc["entries"]) == (0, [], []), doc
        assert len(doc["warnings"]) == 1 and why in doc["warnings"][0]
        code, out, err = cli("recover", "--url", url)
        assert code == 0 and "warning: xasink cannot write here" in err and why in err, out + err
    code, doc, _ = cli_json("status", "--url", db.url)  # the test server takes writes
    assert doc["write_blockers"] == [] and "server" not in [c["name"] for c in doc["checks"]]


@pytest.mark.doc_case("status/bad-argument", "recover/bad-argument", "error/OptionError")
def test_a_wrong_argument_is_unknown_to_status_and_an_error_to_recover(db: Db) -> None:
    for command, code_expected in (("status", 3), ("recover", 2)):
        for args in (["--older-than", "soon"], ["--older-than=-5m"]):
            code, doc, _ = cli_json(command, "--url", db.url, *args)
            assert (code, doc["error_class"]) == (code_expected, "OptionError"), doc
            assert "duration" in doc["error"]
            code, out, err = cli(command, "--url", db.url, *args)
            assert code == code_expected and err.startswith("error: ") and "duration" in err
    scheme = "postgresql" if db.backend.name == "postgresql" else "mysql"
    for command, code_expected in (("status", 3), ("recover", 2)):
        code, doc, _ = cli_json(command, "--url", f"{scheme}://u:S3cretPw@h:notaport/db")  # a port that is none
        assert (code, doc["error_class"]) == (code_expected, "OptionError") and "S3cretPw" not in json.dumps(doc)


@pytest.mark.mariadb
@pytest.mark.doc_case("status/unreadable-figure")
def test_a_threshold_on_lock_waits_the_user_cannot_read_is_unknown(mariadb_url: str) -> None:
    """MariaDB: reading the lock waits needs PROCESS.  Without it the report is read (a note says why the
    blocked sessions are missing); a threshold on them cannot be judged: UNKNOWN, never OK."""
    params = targets.mariadb_params(mariadb_url)
    user = f"xs_nop_{uuid.uuid4().hex[:6]}"
    with targets.mariadb_connect(mariadb_url, database=False) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER '{user}'@'{params['host']}' IDENTIFIED BY '{SECRET}'")
        cur.execute(f"GRANT SELECT ON `{params['database']}`.* TO '{user}'@'{params['host']}'")
    try:
        url = f"mysql://{user}:{SECRET}@{params['host']}:{params['port']}/{params['database']}"
        code, doc, err = cli_json("status", "--url", url, "--older-than", "1d")
        assert doc["blocked_sessions"] is None and any("PROCESS" in n or "denied" in n for n in doc["notes"])
        assert doc["state"] != "UNKNOWN", doc  # the figure is missing, the report is not
        code, doc, err = cli_json("status", "--url", url, "--older-than", "1d", "--crit-blocked", "0")
        assert (code, doc["state"]) == (3, "UNKNOWN"), doc
        assert [(c["name"], c["message"]) for c in doc["checks"] if c["state"] == "UNKNOWN"] == [
            ("blocked", "lock waits unreadable")
        ]
    finally:
        with targets.mariadb_connect(mariadb_url, database=False) as conn, conn.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'{params['host']}'")


def test_times_are_shown_alike_on_both_databases(db: Db) -> None:
    """``decided (UTC)`` and every time of the report in whole seconds: PostgreSQL showed microseconds,
    MariaDB (whose DATETIME keeps none) whole seconds."""
    sink = db.sink()
    sink.coordinator.commit(0, [sink.write(0, 0, range(3))])
    second = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"
    code, doc, _ = cli_json("status", "--url", db.url, "--sink-id", sink.sink_id)
    [s] = doc["sinks"]
    times = [doc["server_time_utc"], s["last_committed_at"], *(r["decided_at"] for r in s["recent"])]
    assert code == 0 and len(times) == 3 and all(re.fullmatch(second, t) for t in times), times
    code, out, _ = cli("status", "--url", db.url, "--sink-id", sink.sink_id)
    [row] = [ln for ln in out.splitlines() if ln.startswith("0 ") and "committed" in ln]
    assert re.search(rf"  {second}(\s|$)", row) and not re.search(rf"{second}\.\d", row), row


def test_a_reader_that_stops_early_changes_no_exit_code(db: Db) -> None:
    """``xasink status | head -n 1`` under ``pipefail``: the state's own exit code, and no BrokenPipeError on stderr
    (it printed one, and exit 3 UNKNOWN, for a log that was fine)."""
    sink = db.sink()
    sink.coordinator.commit(0, [sink.write(0, 0, range(3))])
    sink.write(1, 0, range(3, 6))  # an undecided branch: `--older-than 0s` makes the check say so (exit 1)
    for extra, want in (((), 0), (("--older-than", "0s"), 1)):
        args = ("status", "--url", db.url, "--sink-id", sink.sink_id, *extra)
        assert cli(*args)[0] == want
        script = 'set -o pipefail; "$0" "$@" | head -c 1 >/dev/null'
        proc = subprocess.run(
            ["bash", "-c", script, str(Path(sys.executable).with_name("xasink")), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (proc.returncode, proc.stderr) == (want, ""), proc.stderr
    assert cli("recover", "--url", db.url, "--sink-id", sink.sink_id, "--older-than", "0s")[0] == 0
    assert db.mine() == set()
