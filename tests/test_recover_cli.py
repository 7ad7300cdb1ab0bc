"""The operator's tool: ``xasink recover`` / ``xasink status`` (xasink.ops.survey and xasink.ops.cli), without Spark.

Every test runs on PostgreSQL and on MariaDB (skipped when no MariaDB server is reachable, see
``mariadb_url`` in conftest).  The states a killed job leaves behind are built with the real protocol
pieces: ``write_partition`` prepares branches, ``Decider.decide`` records a decision without
committing, and a prepared branch of a decided batch that is not in its list is an orphan.  Each test
checks the exact rows of the target table, what is left prepared, and the exit code.

MariaDB's XA RECOVER gives no age: there a branch's age is its run's claim in the decision log (by the
server's clock), and a branch without one (no claim) counts as old.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

import xasink
from tests.harness import ADMIN_USER, PLAIN_USER, SECRET, BackendSink, Db, MariaDB, cli, cli_db, expected
from xasink.errors import BranchError, ConcurrentWriterError, OptionError
from xasink.ops import survey as admin
from xasink.options import parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.xid import Xid
from xasink.results import BranchOutcome

db = cli_db  # the fixture: PostgreSQL and MariaDB, with its own leak check (conftest.no_prepared_left skips it)

RACE_ROUNDS = 6


@dataclass
class Killed:
    """What a job killed mid-way leaves: gid -> (what the decision log says, the planned action)."""

    plan: dict[str, tuple[str, str]]
    decided_rows: list[tuple[int, str]]
    visible_rows: list[tuple[int, str]]


def killed_job(sink: BackendSink) -> Killed:
    b0 = [sink.write(0, 0, range(0, 5))]
    sink.coordinator.commit(0, list(b0))  # a batch that finished before the crash
    b1 = [sink.write(1, 0, range(10, 20)), sink.write(1, 1, range(20, 30))]
    orphan = sink.write(1, 2, range(100, 105))  # an attempt whose report never made it into the decision
    sink.decide(1, b1)
    assert b1[0].xid is not None
    sink.coordinator.group.commit([b1[0].xid])  # the killed driver got one COMMIT through
    b2 = [sink.write(2, 0, range(40, 50)), sink.write(2, 1, range(50, 60))]  # never decided
    plan = {gid(b1[1]): ("decided", "commit"), gid(orphan): ("orphan", "rollback-orphan")}
    plan.update({gid(o): ("undecided", "rollback") for o in b2})
    return Killed(plan, expected(range(0, 5), range(10, 30), tag="v"), expected(range(0, 5), range(10, 20), tag="v"))


def gid(outcome: BranchOutcome) -> str:
    assert outcome.gid is not None, "the partition had rows: it must have prepared a branch"
    return outcome.gid


def planned(report: admin.RecoverReport, sink: BackendSink) -> dict[str, tuple[str, str]]:
    return {e.gid: (e.decision, e.action) for e in report.entries if e.ours and e.sink_id == sink.sink_id}


# --------------------------------------------------------------------------- the CLI


def cli_json(*args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = cli(*args, "--json")
    doc = json.loads(out)
    assert doc["exit_code"] == code
    return code, doc


def table_rows(out: str, first_header: str) -> tuple[str, list[str]]:
    """The header line of the table that starts with ``first_header`` and the lines under it."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(first_header + " "))
    body = []
    for ln in lines[start + 1 :]:
        if not ln.strip():
            break
        body.append(ln)
    return lines[start], body


def column(header: str, line: str, name: str) -> str:
    """The cell of ``line`` under column ``name`` of an aligned table: checks the alignment too."""
    labels = list(re.finditer(r"\S+(?: \S+)*", header))  # columns are two or more spaces apart
    starts = [m.start() for m in labels]
    i = [m.group() for m in labels].index(name)
    end = starts[i + 1] if i + 1 < len(starts) else None
    assert line[starts[i] - 1 : starts[i]].strip() == "", f"column {name} misaligned in {line!r}"
    return line[starts[i] : end].strip()


# --------------------------------------------------------------------------- recover


@pytest.mark.doc_case("recover/done", "recover/left")
def test_recover_plans_then_finishes_what_a_killed_job_left(db: Db) -> None:
    sink = db.sink()
    killed = killed_job(sink)
    before = db.snapshot()
    assert db.mine() == set(killed.plan)
    assert sink.rows() == killed.visible_rows

    report = xasink.recover(db.url, sink_id=sink.sink_id, older_than_s=0, dry_run=True)

    assert planned(report, sink) == killed.plan
    for e in report.entries:
        if e.sink_id == sink.sink_id:
            x = Xid.parse(e.gid)
            assert x is not None and e.ours
            assert (e.batch_id, e.partition, e.attempt) == (x.batch_id, x.partition, x.attempt)
            assert e.outcome == "planned"
            assert e.age_s is not None and 0 <= e.age_s < 600  # MariaDB: the age of the run's claim
            if db.backend.name == "postgresql":
                assert (e.database, e.owner) == ("postgres", "postgres")
    assert report.exit_code == 1 and report.errors == []
    assert db.snapshot() == before and sink.rows() == killed.visible_rows  # a dry run changes nothing

    code, doc = cli_json("recover", "--url", db.url, "--sink-id", sink.sink_id, "--older-than", "0s", "--dry-run")
    assert code == 1
    assert {e["gid"]: (e["decision"], e["action"]) for e in doc["entries"] if e["ours"]} == killed.plan
    assert doc["dry_run"] is True and doc["errors"] == []
    assert db.snapshot() == before

    code, out, err = cli("recover", "--url", db.url, "--sink-id", sink.sink_id, "--older-than", "0s")

    assert (code, err) == (0, ""), out + err
    assert sink.rows() == killed.decided_rows
    assert db.mine() == set()
    header, lines = table_rows(out, "gid")
    shown = {column(header, ln, "gid"): ln for ln in lines}
    assert set(shown) == set(killed.plan)
    for gid, (decision, action) in killed.plan.items():
        assert column(header, shown[gid], "decision") == decision
        assert column(header, shown[gid], "action") == action
        assert column(header, shown[gid], "outcome") == "done"
    assert f"finished decided batches of sink {sink.sink_id}: [1]" in out
    assert "did commit 1, roll back 3, leave 0 young" in out.splitlines()[-1]

    again = xasink.recover(db.url, sink_id=sink.sink_id, older_than_s=0)
    assert (again.exit_code, planned(again, sink), again.finished_batches) == (0, {}, {})
    assert sink.rows() == killed.decided_rows
    assert sink.coordinator.commit(1, []).skipped  # the restarted driver replays batch 1: nothing new
    assert sink.rows() == killed.decided_rows


@pytest.mark.doc_case("status/ok", "status/stale")
def test_status_reports_the_killed_job_then_the_recovered_one(db: Db) -> None:
    sink = db.sink()
    killed = killed_job(sink)

    st = xasink.status(db.url, sink_id=sink.sink_id, older_than_s=0)
    assert [s.sink_id for s in st.sinks] == [sink.sink_id]
    s = st.sinks[0]
    assert (s.last_committed_batch, s.in_doubt_batches, s.prepared_branches) == (0, [1], len(killed.plan))
    assert s.stale == len(killed.plan) + 1  # every branch and the in-doubt batch are older than 0s
    assert [(r["batch_id"], r["state"], r["rows"], r["branches"]) for r in s.recent] == [
        (1, "committing", 20, 2),
        (0, "committed", 5, 1),
    ]
    assert st.exit_code == 1
    young = xasink.status(db.url, sink_id=sink.sink_id)  # default threshold: all of it is seconds old
    assert young.exit_code == 0

    code, doc = cli_json("status", "--url", db.url, "--sink-id", sink.sink_id, "--older-than", "0s")
    assert code == 1
    assert doc["sinks"][0]["in_doubt_batches"] == [1]
    assert doc["sinks"][0]["prepared_branches"] == len(killed.plan)

    assert xasink.recover(db.url, sink_id=sink.sink_id, older_than_s=0).exit_code == 0

    code, out, err = cli("status", "--url", db.url, "--sink-id", sink.sink_id, "--older-than", "0s")
    assert (code, err) == (0, ""), out + err
    header, lines = table_rows(out, "sink")
    assert len(lines) == 1
    assert column(header, lines[0], "sink") == sink.sink_id
    assert column(header, lines[0], "last committed") == "1"
    assert column(header, lines[0], "in doubt") == "-"
    assert column(header, lines[0], "prepared") == "0"
    rheader, rlines = table_rows(out, "batch")
    assert [column(rheader, ln, "batch") for ln in rlines] == ["1", "0"]
    assert [column(rheader, ln, "rows") for ln in rlines] == ["20", "5"]
    assert "1 sinks; 0 prepared branches of xasink" in out


@pytest.mark.doc_case("recover/bad-foreign")
def test_foreign_and_near_miss_transactions_survive(db: Db) -> None:
    sink = db.sink()
    s, log = sink.sink_id, sink.coordinator.journal.log_id()
    near = [
        f"xasink:s1:1/{log}:0:5-zzzzzzzz",
        f"xasink:s1:1/{log}:0:5-abcdef01x",
        f"XASINK:s1:1/{log}:0:5-abcdef01",
        f"xasink:{s}:1/{log}:0:5-zzzzzzzz",
        f"xasink:{s}:1/{log}:0:5-abcdef01x",
        f"XASINK:{s}:1/{log}:0:5-abcdef01",
        f"xasink:{s}:01/{log}:0:5-abcdef01",
        f"xasink:{s}:1/{log}:0:5-ABCDEF01",
        f"xasink:{s}:1/{log.upper()}:0:5-abcdef01",
        f"xasink:{s}:1/{log[:-1]}:0:5-abcdef01",
        f"xasink:{s}:1/0:5-abcdef01",  # the format before log ids
    ]
    foreign = [db.make_foreign("foreign-1", format_id=1)] + [db.make_foreign(g) for g in near]
    if db.backend.name == "mariadb":  # our exact strings under another XA formatID are someone else's
        foreign.append(db.make_foreign(f"xasink:{s}:1/{log}:0:5-abcdef01", format_id=1))
    unknown = db.make_foreign(f"xasink:rcnosuchsink:1/{log}:0:5-abcdef01")  # parses as ours, but no sink of this log
    other = "f" * 10 if log != "f" * 10 else "e" * 10
    other_log = db.make_foreign(f"xasink:{s}:1/{other}:0:5-abcdef01")  # the same sink of another decision log
    assert len(set(foreign)) == len(foreign) and Xid.parse(unknown) is not None and Xid.parse(other_log) is not None
    killed = killed_job(sink)

    report = xasink.recover(db.url, older_than_s=0)

    by_gid = {e.gid: e for e in report.entries}
    for name in foreign:
        e = by_gid[name]
        assert (e.ours, e.decision, e.action, e.outcome) == (False, "foreign", "ignore", "untouched")
    e = by_gid[unknown]
    assert (e.ours, e.decision, e.action, e.outcome) == (True, "unknown-sink", "ignore-unknown-sink", "untouched")
    e = by_gid[other_log]
    assert (e.ours, e.decision, e.action, e.outcome) == (False, "other-log", "ignore-other-log", "untouched")
    assert e.log_id == other and e.sink_id == s
    assert planned(report, sink) == killed.plan
    assert report.exit_code == 1  # the unknown sink's branch stays prepared, and it is old
    left = db.backend.prepared()
    assert set(foreign) <= left and unknown in left and other_log in left
    assert db.mine() == set()
    assert sink.rows() == killed.decided_rows
    assert db.backend.rows("rc_scratch") == []  # the foreign ones are neither committed nor rolled back

    # an exact foreign name may be rolled back on request, with a warning; nothing else foreign is touched
    victim = foreign[0]
    code, out, err = cli("recover", "--url", db.url, "--older-than", "0s", "--rollback-foreign", victim)
    assert "warning" in err and "another application" in err
    assert code == 1, out + err
    left = db.backend.prepared()
    assert victim not in left and set(foreign[1:]) <= left and unknown in left

    # a name that is one of ours, or nothing at all, is refused and nothing at all is changed
    pending = sink.write(5, 0, range(200, 210))
    assert pending.gid is not None
    for name in (pending.gid, unknown, other_log, "no-such-transaction"):
        code, doc = cli_json("recover", "--url", db.url, "--older-than", "0s", "--rollback-foreign", name)
        assert code == 2 and doc["acted"] is False
        assert "nothing was changed" in doc["errors"]
        assert any(name in err for err in doc["errors"])
        assert pending.gid in db.backend.prepared() and set(foreign[1:]) <= db.backend.prepared()
    xasink.recover(db.url, sink_id=s, older_than_s=0)
    assert db.mine() == set() and sink.rows() == killed.decided_rows


def test_recover_racing_a_live_commit_never_splits_a_batch(db: Db) -> None:
    """Invariant 4 through the CLI's code path: recover with no age threshold against live commits.

    Either side may win (timing decides); whichever does, a batch is visible whole or not at all.
    """
    sink = db.sink()
    go, stop = threading.Event(), threading.Event()
    runs: list[admin.RecoverReport] = []
    failures: list[BaseException] = []

    def recover_loop() -> None:
        while not stop.is_set():
            if not go.wait(0.05):
                continue
            try:
                runs.append(xasink.recover(db.url, sink_id=sink.sink_id, older_than_s=0))
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

    thread = threading.Thread(target=recover_loop, daemon=True)
    thread.start()
    committed: list[range] = []
    outcomes: dict[str, int] = {"committed": 0, "lost the race": 0}
    try:
        for batch in range(RACE_ROUNDS):
            ids = [range(batch * 100 + p * 10, batch * 100 + p * 10 + 10) for p in range(3)]
            if batch % 2:
                go.set()  # odd batches: recovery runs while the branches are written, decided and committed
            try:
                branches = [sink.write(batch, p, r) for p, r in enumerate(ids)]
            except BranchError as exc:  # recovery rolled a branch back between its PREPARE and the check of it
                assert "was not prepared (the server rolled it back)" in str(exc), exc
                go.clear()
                xasink.recover(db.url, sink_id=sink.sink_id, older_than_s=0)  # the batch's other branches
                outcomes["lost the race"] += 1
                assert sink.rows() == expected(*committed, tag="v")
                continue
            go.set()  # even batches: from the decision on
            try:
                result = sink.coordinator.commit(batch, list(branches))
            except ConcurrentWriterError:
                outcomes["lost the race"] += 1
            else:
                assert (result.rows, result.branches, result.skipped) == (30, 3, False)
                committed += ids
                outcomes["committed"] += 1
            finally:
                go.clear()
            assert sink.rows() == expected(*committed, tag="v")  # all of the batch or none of it
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    assert failures == []
    assert runs and all(r.errors == [] for r in runs), [r.errors for r in runs if r.errors]
    xasink.recover(db.url, sink_id=sink.sink_id, older_than_s=0)
    assert db.mine() == set()
    assert sink.rows() == expected(*committed, tag="v")
    assert sum(outcomes.values()) == RACE_ROUNDS


def test_older_than_leaves_a_young_undecided_branch_alone(db: Db) -> None:
    sink = db.sink()
    young = [sink.write(3, 0, range(0, 10)), sink.write(3, 1, range(10, 20))]
    gids = {o.gid for o in young}

    report = xasink.recover(db.url, sink_id=sink.sink_id)  # default threshold: minutes
    assert {e.gid: (e.action, e.outcome) for e in report.entries if e.ours} == {g: ("wait", "waiting") for g in gids}
    assert report.exit_code == 0  # nothing older than the threshold is prepared
    assert db.mine() == gids
    assert sink.coordinator.recover(min_age_s=600).rolled_back == []  # the coordinator's rule too
    assert db.mine() == gids
    code, out, err = cli("recover", "--url", db.url, "--sink-id", sink.sink_id, "--older-than", "1h", "--dry-run")
    assert code == 0 and "wait" in out
    assert cli("status", "--url", db.url, "--sink-id", sink.sink_id)[0] == 0
    assert cli("status", "--url", db.url, "--sink-id", sink.sink_id, "--older-than", "0")[0] == 1

    code, out, err = cli("recover", "--url", db.url, "--sink-id", sink.sink_id, "--older-than", "0s", "--dry-run")
    assert code == 1, out + err
    assert db.mine() == gids

    code, out, err = cli("recover", "--url", db.url, "--sink-id", sink.sink_id, "--older-than", "0s")
    assert code == 0, out + err
    assert db.mine() == set() and sink.rows() == []
    with pytest.raises(ConcurrentWriterError):  # the batch's driver comes back too late: nothing is visible
        sink.coordinator.commit(3, list(young))
    assert sink.rows() == []


def test_a_branch_of_an_unregistered_sink_is_dated_by_its_claim(db: Db) -> None:
    """A branch of this log whose sink is not registered (its row was deleted) is left alone, and dated like
    every other branch of the log: by its run's claim where the server gives no age (MariaDB), so a young one
    is not counted stale.  (What the survey did before one judgement served it and recovery.)"""
    sink = db.sink()
    young = sink.write(3, 0, range(0, 10))
    journal = sink.coordinator.journal
    with journal.dialect.connect() as conn:
        conn.execute(journal.sinks.delete().where(journal.sinks.c.sink_id == sink.sink_id))
        conn.commit()
    try:
        report = xasink.recover(db.url, older_than_s=600, dry_run=True)
        e = next(e for e in report.entries if e.gid == young.gid)
        assert (e.ours, e.decision, e.action) == (True, "unknown-sink", "ignore-unknown-sink")
        assert e.age_s is not None and e.age_s < 600
        assert report.exit_code == 0  # young: not stale
    finally:
        assert young.xid is not None
        sink.coordinator.group.rollback([young.xid])
    assert db.mine() == set()


def test_a_recovery_pass_with_nothing_prepared_does_not_need_the_logs_identity(db: Db) -> None:
    """A sink's recovery pass reads the log's identity only when a branch of the sink is prepared: with nothing
    prepared, a log whose identity row is gone still answers "nothing to do", as it did before one judgement
    served recovery and the survey (a log of its own: the module's other sinks keep theirs)."""
    prefix = f"noid{uuid.uuid4().hex[:6]}_"
    options = parse_options({"url": db.url, "dbtable": "t_noid", "sinkId": "noid", "journalTablePrefix": prefix})
    first = Coordinator(options)
    try:
        first.preflight()
        with first.journal.dialect.connect() as conn:
            conn.execute(first.journal.logs.delete())
            conn.commit()
    finally:
        first.close()
    fresh = Coordinator(options)  # no identity remembered from before
    try:
        assert not fresh.recover()
    finally:
        fresh.close()


@pytest.mark.doc_case("recover/no-log", "status/no-log")
def test_missing_decision_log_touches_nothing_and_says_why(db: Db) -> None:
    sink = db.sink()
    killed = killed_job(sink)
    before = db.snapshot()

    code, out, err = cli("recover", "--url", db.url, "--older-than", "0s", "--journal-prefix", "nosuch_")

    assert code == 2
    assert "decision log" in err and "nosuch_batches" in err and "not found" in err
    assert "--journal-prefix" in err
    assert db.snapshot() == before
    assert sink.rows() == killed.visible_rows
    header, lines = table_rows(out, "gid")
    mine = [ln for ln in lines if column(header, ln, "sink") == sink.sink_id]
    assert len(mine) == len(killed.plan)
    assert {column(header, ln, "action") for ln in mine} == {
        "ignore-other-log"
    }  # no log here: every branch is another log's

    code, doc = cli_json("recover", "--url", db.url, "--journal-prefix", "nosuch_", "--older-than", "0s", "--dry-run")
    assert code == 2 and any("not found" in e for e in doc["errors"])
    code, doc = cli_json("status", "--url", db.url, "--journal-prefix", "nosuch_")
    assert code == 3 and any("not found" in e for e in doc["errors"])  # status: UNKNOWN, as a Nagios check
    assert db.snapshot() == before

    assert xasink.recover(db.url, sink_id=sink.sink_id, older_than_s=0).exit_code == 0
    assert sink.rows() == killed.decided_rows


# --------------------------------------------------------------------------- passwords, errors, exit codes


def test_password_never_appears_in_any_output(db: Db) -> None:
    sink = db.sink()
    killed = killed_job(sink)
    url = db.backend.secret_url()
    try:
        p = urlsplit(url)
        urls = [url]
        if db.backend.name == "postgresql":
            urls.append(f"jdbc:postgresql://{p.hostname}:{p.port}{p.path}?user={ADMIN_USER}&password={SECRET}")
        for u in urls:
            runs = [
                cli("recover", "--url", u, "--older-than", "0s", "--dry-run"),
                cli("recover", "--url", u, "--older-than", "0s", "--dry-run", "--json"),
                cli("status", "--url", u, "--sink-id", sink.sink_id, "--older-than", "0s"),
                cli("status", "--url", u, "--sink-id", sink.sink_id, "--older-than", "0s", "--json"),
            ]
            for code, out, err in runs:
                assert code == 1, out + err
                assert SECRET not in out + err
                assert sink.sink_id in out
                assert "***" in out  # the URL is shown, masked
        report = xasink.recover(url, sink_id=sink.sink_id, older_than_s=0)
        assert SECRET not in json.dumps(report.to_dict(), default=str)
        assert SECRET not in repr(report) + repr(xasink.status(url))
        assert report.exit_code == 0 and sink.rows() == killed.decided_rows

        # a real process acting, with its logs at INFO: exit code, and no password anywhere
        extra = sink.write(7, 0, range(300, 310))
        args = ["-v", "recover", "--url", url, "--sink-id", sink.sink_id, "--older-than", "0s", "--json"]
        cmd = [sys.executable, "-m", "xasink.ops.cli", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["exit_code"] == 0
        assert [(e["gid"], e["outcome"]) for e in doc["entries"] if e["ours"]] == [(extra.gid, "done")]
        assert "INFO" in proc.stderr
        assert SECRET not in proc.stdout + proc.stderr
        assert db.mine() == set() and sink.rows() == killed.decided_rows
    finally:
        db.backend.drop_secret_user()


@pytest.mark.doc_case("status/cannot-connect", "recover/cannot-connect", "error/ConnectError")
def test_unreachable_server_is_exit_code_2_without_the_password(db: Db) -> None:
    url = db.backend.unreachable_url()
    proc = subprocess.run(
        [sys.executable, "-m", "xasink.ops.cli", "recover", "--url", url, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "cannot connect" in proc.stderr and "127.0.0.1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr

    code, out, err = cli("status", "--url", url, "--json")
    assert code == 3 and err == ""  # status is a Nagios-style check: cannot connect is UNKNOWN
    doc = json.loads(out)
    assert doc["exit_code"] == 3 and doc["state"] == "UNKNOWN" and "cannot connect" in doc["error"]
    assert SECRET not in out

    code, out, err = cli("recover", "--url", url, "--json")
    doc = json.loads(out)
    assert (code, doc["exit_code"], doc["error_class"]) == (2, 2, "ConnectError") and "cannot connect" in doc["error"]
    assert doc["error_class"] == json.loads(cli("status", "--url", url, "--json")[1])["error_class"]
    assert SECRET not in out + err

    with pytest.raises(xasink.ConnectError) as info:  # the Python API raises; the CLI turns it into exit code 2
        xasink.recover(url)
    assert SECRET not in str(info.value)


def test_wrong_password_is_exit_code_2_without_the_password(db: Db) -> None:
    url = db.backend.secret_url()
    try:
        bad = url.replace(SECRET, SECRET + "x")
        code, out, err = cli("recover", "--url", bad, "--dry-run")
        assert code == 2
        assert "authentication failed" in err and ADMIN_USER in err
        assert SECRET not in out + err
    finally:
        db.backend.drop_secret_user()


@pytest.mark.doc_case("status/no-rights", "recover/no-rights", "error/XasinkError")
def test_missing_rights_are_exit_code_2_without_the_password(db: Db) -> None:
    """A user who may log in but not read the decision log: a clear error, never a traceback (exit code 2;
    status: 3, UNKNOWN)."""
    sink = db.sink()
    sink.write(0, 0, range(0, 3))
    url = db.backend.secret_url(PLAIN_USER)
    try:
        for command in ("recover", "status"):
            code, out, err = cli(command, "--url", url, "--older-than", "0s")
            assert code == (3 if command == "status" else 2), out + err
            assert err.startswith("error: ") and "Traceback" not in err
            assert "denied" in err.lower()
            assert SECRET not in out + err
            code, out, err = cli(command, "--url", url, "--older-than", "0s", "--json")
            doc = json.loads(out)
            assert (code, doc["error_class"]) == (3 if command == "status" else 2, "XasinkError"), out
            assert "denied" in doc["error"].lower() and SECRET not in out + err
        assert len(db.mine()) == 1  # untouched
        if isinstance(db.backend, MariaDB):  # no right on the database at all: the login is refused, and says why
            db.backend.drop_secret_user(PLAIN_USER)
            db.backend.server_sql(f"CREATE USER '{PLAIN_USER}'@'{urlsplit(url).hostname}' IDENTIFIED BY '{SECRET}'")
            code, out, err = cli("status", "--url", url, "--json")
            doc = json.loads(out)
            assert (code, doc["error_class"]) == (3, "ConnectError"), out
            assert "may not use the database" in doc["error"] and "authentication failed" not in doc["error"], out
    finally:
        db.backend.drop_secret_user(PLAIN_USER)
    xasink.recover(db.url, sink_id=sink.sink_id, older_than_s=0)


@pytest.mark.parametrize(
    "args, message",
    [
        (["recover", "--url", "sqlite:///x.db"], "unsupported database"),
        (["recover", "--url", "not a url at all"], "not a database URL"),
        (["status", "--url", "postgresql://u:S3cretPw@h:notaport/db"], "not a database URL"),
        (["recover", "--url", "postgresql://h/db", "--older-than", "soon"], "invalid duration"),
        (["recover", "--url", "postgresql://h/db", "--older-than=-5m"], "0 or more"),
    ],
)
def test_bad_arguments_are_exit_code_2(args: list[str], message: str) -> None:
    code, out, err = cli(*args)
    assert code == (3 if args[0] == "status" else 2)  # status: UNKNOWN, as a Nagios check
    assert message in err and "Traceback" not in err
    assert SECRET not in out + err


@pytest.mark.parametrize(
    "text, seconds", [("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400), ("15", 15), (" 0s ", 0), ("1.5m", 90)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert admin.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "ten minutes", "-1s", "nan", "5w"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(OptionError):
        admin.parse_duration(text)
