"""``xasink status`` as a monitoring check: health figures, ``--json`` against its schema, ``--prometheus``, exit codes.

Every test runs on the private PostgreSQL (max_prepared_transactions = 100) and on MariaDB.  The scene is real:
a sink with one committed batch, a decided batch whose prepared branch was never committed (the driver was
killed after the decision), and a second connection blocked on that branch's row lock (an INSERT of a key the
branch inserted, with a lock timeout so that nothing can hang; it is cancelled before the branch is finished).
No timed assertions: ages are >= 0 and do not go back between two reads, and thresholds of 0 trigger for sure.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import pymysql
import pytest

import xasink
from tests import targets
from tests.harness import BackendSink, Db, cli, cli_db
from xasink.ops import alerts as health
from xasink.ops.status import StatusReport

db = cli_db  # the fixture: PostgreSQL and MariaDB, with its own leak check (conftest.no_prepared_left skips it)

BLOCKER_LOCK_TIMEOUT_S = 300  # the blocked INSERT gives up by itself at the latest after this
WAIT_S = 60.0  # how long a test waits for the blocked INSERT to be seen waiting (a wait, not an assertion)


@dataclass
class Blocker:
    """A second connection whose INSERT waits for the prepared branch's row lock."""

    session: int
    cancel: Callable[[], None]
    thread: threading.Thread
    close: Callable[[], None]
    outcome: list[BaseException] = field(default_factory=list)


@dataclass
class Scene:
    db: Db
    sink: BackendSink
    gid: str  # the decided, uncommitted branch
    blocker: Blocker
    lock_waits_visible: bool = True

    @property
    def url(self) -> str:
        return self.db.url

    @property
    def pg(self) -> bool:
        return self.db.backend.name == "postgresql"


def _add_key(db: Db, table: str) -> None:
    if db.backend.name == "postgresql":
        with targets.connect(db.url) as conn, conn.cursor() as cur:
            cur.execute(f'ALTER TABLE "{table}" ADD PRIMARY KEY (id)')
    else:
        with targets.mariadb_connect(db.url) as conn, conn.cursor() as cur:
            cur.execute(f"ALTER TABLE `{table}` ADD PRIMARY KEY (id)")


def _wait_until(what: str, probe: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not probe():
        assert time.monotonic() < deadline, f"{what} not seen within {WAIT_S}s"
        time.sleep(0.05)


def _block(db: Db, table: str, key: int) -> Blocker:
    """Start an INSERT of ``key`` on a second connection and return once the server shows it waiting for a lock."""
    outcome: list[BaseException] = []
    conn: Any
    if db.backend.name == "postgresql":
        import psycopg2

        conn = psycopg2.connect(targets.libpq_url(db.url))
        conn.autocommit = True
        session = conn.get_backend_pid()
        plain: Callable[[str], Any] = targets.connect
        setup = f"SET lock_timeout = '{BLOCKER_LOCK_TIMEOUT_S}s'"
        stmt = f"INSERT INTO \"{table}\" VALUES ({key}, 'blocked')"
        cancel_sql = "SELECT pg_cancel_backend(%s)"
        waiting_sql = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
    else:
        conn = pymysql.connect(**targets.mariadb_params(db.url))
        session = conn.thread_id()
        plain = targets.mariadb_connect
        setup = f"SET SESSION innodb_lock_wait_timeout = {BLOCKER_LOCK_TIMEOUT_S}"
        stmt = f"INSERT INTO `{table}` VALUES ({key}, 'blocked')"
        cancel_sql = "KILL QUERY %s"
        # PROCESSLIST, not INNODB_TRX: that is a cache which can lag (see maria_trx_visible)
        waiting_sql = (
            "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s AND COMMAND = 'Query' "
            "AND STATE = 'Update' AND TIME_MS >= 500"
        )
    cur = conn.cursor()
    cur.execute(setup)

    def cancel() -> None:
        with plain(db.url) as c, c.cursor() as k:
            k.execute(cancel_sql, (int(session),))

    def waiting() -> bool:
        with plain(db.url) as c, c.cursor() as k:
            k.execute(waiting_sql, (session,))
            return k.fetchone() is not None

    def run() -> None:
        try:
            cur.execute(stmt)
        except Exception as exc:  # noqa: BLE001 - cancelled (expected) or timed out: reported to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _wait_until("the blocked INSERT", lambda: waiting() or not thread.is_alive())
    assert thread.is_alive(), f"the INSERT was not blocked: {outcome}"
    return Blocker(int(session), cancel, thread, conn.close, outcome)


def maria_trx_visible(db: Db, session: int) -> bool:
    """Whether MariaDB's INNODB_TRX shows the blocked session's transaction (read no faster than every 0.5 s).

    INNODB_TRX and INNODB_LOCK_WAITS are a cache that InnoDB refreshes only when nobody has read it for 0.1 s;
    on the shared test server it was seen showing one old state for over ten minutes.  A server in that state
    cannot show a new blocked session; the tests that need one are skipped, saying so.
    """
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with targets.mariadb_connect(db.url) as c, c.cursor() as k:
            k.execute("SELECT 1 FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = %s", (session,))
            if k.fetchone() is not None:
                return True
        time.sleep(0.5)
    return False


def need_lock_waits(scene: Scene) -> None:
    if not scene.lock_waits_visible:
        pytest.skip("this MariaDB's INNODB_TRX cache lags (shows an old state): the blocked session is not visible")


@pytest.fixture
def scene(db: Db) -> Iterator[Scene]:
    sink = db.sink()
    _add_key(db, sink.table)
    sink.coordinator.commit(0, [sink.write(0, 0, range(0, 5))])  # the last committed batch
    branch = sink.write(1, 0, range(10, 20))
    assert branch.gid is not None
    sink.decide(1, [branch])  # decided, never committed: the driver died here
    blocker = _block(db, sink.table, 10)
    try:
        visible = db.backend.name == "postgresql" or maria_trx_visible(db, blocker.session)
        yield Scene(db, sink, branch.gid, blocker, visible)
    finally:
        blocker.cancel()
        blocker.thread.join(BLOCKER_LOCK_TIMEOUT_S)
        blocker.close()
        assert not blocker.thread.is_alive()
        assert xasink.recover(db.url, sink_id=sink.sink_id, older_than_s=0).exit_code == 0
    # cleaned up: nothing of the sink prepared, the blocked session gone, the decided batch committed once
    assert db.mine() == set()
    after = xasink.status(db.url, sink_id=sink.sink_id)
    if db.backend.name == "postgresql":
        assert after.blocked_sessions is not None
        assert [b for b in after.blocked_sessions if b["session"] == blocker.session] == []
    else:  # INNODB_TRX is a cache that may still show the past wait: PROCESSLIST says the session is gone

        def gone() -> bool:
            with targets.mariadb_connect(db.url) as c, c.cursor() as k:
                k.execute("SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s", (blocker.session,))
                return k.fetchone() is None

        _wait_until("the blocked session's disconnect", gone)
    assert (after.exit_code, after.prepared_branches, after.in_doubt_batches) == (0, 0, 0)
    assert sink.rows() == [(x, f"v{x}") for x in [*range(0, 5), *range(10, 20)]]
    assert len(blocker.outcome) == 1  # the INSERT ended by the cancel, not by getting its row in


def _status_json(scene: Scene, *flags: str) -> tuple[int, dict[str, Any]]:
    code, out, err = cli("status", "--url", scene.url, "--sink-id", scene.sink.sink_id, "--json", *flags)
    doc = json.loads(out)
    assert doc["exit_code"] == code, out + err
    return code, doc


def _schema() -> dict[str, Any]:
    text = resources.files("xasink.ops").joinpath("status.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _ours(blocked: list[dict[str, Any]], session: int) -> dict[str, Any]:
    mine = [b for b in blocked if b["session"] == session]
    assert len(mine) == 1, blocked
    return mine[0]


# --------------------------------------------------------------------------- --json


def test_json_report_has_the_health_figures_and_matches_its_schema(scene: Scene) -> None:
    import jsonschema

    schema = _schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    first_code, first = _status_json(scene, "--older-than", "1d")
    jsonschema.validate(first, schema)

    assert first["prepared_branches"] == 1
    known = first["oldest_prepared_age_s"]
    assert (1 if known is None else 0) == first["prepared_age_unknown"]
    if scene.pg:  # pg_prepared_xacts dates every branch; MariaDB's come from the run's claim
        assert known is not None
    if known is not None:
        assert known >= 0
    assert first["prepared_on_server"] >= 1
    if scene.pg:
        assert first["max_prepared_transactions"] == 100
        assert first["prepared_ratio"] == first["prepared_on_server"] / 100
    else:
        assert first["max_prepared_transactions"] is None and first["prepared_ratio"] is None
    blocked: dict[str, Any] = {}
    if scene.lock_waits_visible:  # else MariaDB's INNODB_TRX cache is stale: it shows no lock wait at all
        blocked = _ours(first["blocked_sessions"], scene.blocker.session)
        assert blocked["query_age_s"] >= 0 and blocked["wait_age_s"] >= 0
        if scene.pg:
            assert (blocked["blockers"], blocked["blocker_ours"], blocked["sinks"]) == (
                [scene.gid],
                True,
                [scene.sink.sink_id],
            )
            assert blocked["database"] == "postgres"
        else:  # InnoDB does not say which xid holds the lock: named by its transaction id
            assert len(blocked["blockers"]) == 1 and blocked["blockers"][0].startswith("innodb-trx:")
            assert (blocked["blocker_ours"], blocked["sinks"]) == (None, [])
    assert first["in_doubt_batches"] == 1
    [sink] = first["sinks"]
    assert sink["sink_id"] == scene.sink.sink_id
    assert (sink["last_committed_batch"], sink["in_doubt_batches"], sink["prepared_branches"]) == (0, [1], 1)
    assert sink["last_committed_at"] is not None and sink["last_committed_age_s"] >= 0
    [doubt] = sink["in_doubt"]
    assert doubt["batch_id"] == 1 and doubt["age_s"] >= 0
    assert first["state"] == ("WARNING" if first["prepared_age_unknown"] else "OK")  # unknown age counts as old
    assert first_code == health.EXIT_CODES[first["state"]]
    assert first["checks"] == [] or [c["name"] for c in first["checks"]] == ["stale"]

    code, second = _status_json(scene, "--older-than", "1d")  # ages by the server's clock never go back
    jsonschema.validate(second, schema)
    if blocked:
        again = _ours(second["blocked_sessions"], scene.blocker.session)
        assert again["query_age_s"] >= blocked["query_age_s"]
    assert second["sinks"][0]["last_committed_age_s"] >= sink["last_committed_age_s"]
    assert second["sinks"][0]["in_doubt"][0]["age_s"] >= doubt["age_s"]
    if known is not None:
        assert second["oldest_prepared_age_s"] >= known
    assert second["server_time_utc"] >= first["server_time_utc"]

    code, out, err = cli("status", "--url", scene.url, "--sink-id", scene.sink.sink_id, "--older-than", "1d")
    assert code == first_code and "sessions blocked by prepared transactions: " in out
    if blocked:
        assert str(scene.blocker.session) in out
    assert out.splitlines()[-1].startswith(f"XASINK {first['state']}")


def test_error_document_matches_the_schema() -> None:
    import jsonschema

    code, out, err = cli("status", "--url", "postgresql://u:pw@127.0.0.1:1/db", "--json")
    doc = json.loads(out)
    assert code == 3 and doc["state"] == "UNKNOWN" and doc["exit_code"] == 3
    jsonschema.validate(doc, _schema())


# --------------------------------------------------------------------------- --prometheus

_SAMPLE = re.compile(
    r'(?P<name>xasink_[a-z_]+)\{(?P<labels>(?:[a-z_]+="(?:[^"\\\n]|\\[\\"n])*")(?:,[a-z_]+="(?:[^"\\\n]|\\[\\"n])*")*)\}'
    r" (?P<value>-?[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)"
)


def _parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> samples; every line checked against the text format (HELP and TYPE before each metric's samples)."""
    assert text.endswith("\n")
    families: dict[str, list[tuple[dict[str, str], float]]] = {}
    current = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# HELP "):
            current = line.split(" ")[2]
            assert current.startswith("xasink_") and current not in families, line
            assert lines[i + 1] == f"# TYPE {current} gauge", lines[i + 1]
            families[current] = []
        elif line.startswith("# TYPE "):
            assert line == f"# TYPE {current} gauge"
        else:
            m = _SAMPLE.fullmatch(line)
            assert m is not None and current is not None and m["name"] == current, line
            labels = dict(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', m["labels"]))
            families[current].append((labels, float(m["value"])))
    try:  # Prometheus' own parser, where installed: the same families and samples
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return families
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(parsed) == set(families)
    for name, family in parsed.items():
        assert family.type == "gauge" and family.documentation
        assert [(s.labels, s.value) for s in family.samples] == families[name]
    return families


def test_prometheus_output_has_the_same_figures(scene: Scene) -> None:
    # the server-wide counts (other logs' branches, foreign ones) are the shared server's, which other tests
    # change meanwhile: compared once two JSON readings around the Prometheus one agree on them
    for _ in range(10):
        _, doc = _status_json(scene, "--older-than", "1d")
        code, out, err = cli(
            "status", "--url", scene.url, "--sink-id", scene.sink.sink_id, "--older-than", "1d", "--prometheus"
        )
        _, again = _status_json(scene, "--older-than", "1d")
        if all(doc[k] == again[k] for k in ("other_log_prepared", "foreign_prepared")):
            break
    assert code == doc["exit_code"], out + err
    m = _parse_prometheus(out)
    backend = {"server": doc["server"], "database": doc["database"]}
    on_sink = {**backend, "sink": scene.sink.sink_id}
    for samples in m.values():
        for labels, _ in samples:
            assert set(labels) <= {"server", "database", "sink", "owner"}
            assert {k: labels[k] for k in ("server", "database")} == backend
    assert m["xasink_up"] == [(backend, 1.0)]
    assert m["xasink_status_code"] == [(backend, float(code))]
    owners = {labels["owner"]: v for labels, v in m["xasink_prepared_branches"]}
    assert owners["this_log"] == 1
    assert (owners["other_log"], owners["foreign"]) == (doc["other_log_prepared"], doc["foreign_prepared"])
    assert m["xasink_prepared_transactions"][0][1] >= 1
    if scene.pg:
        assert m["xasink_max_prepared_transactions"] == [(backend, 100.0)]
        assert 0 < m["xasink_prepared_transactions_ratio"][0][1] <= 1
        assert m["xasink_prepared_oldest_age_seconds"][0][1] >= 0
    else:
        assert "xasink_max_prepared_transactions" not in m and "xasink_prepared_transactions_ratio" not in m
    if scene.lock_waits_visible:
        assert m["xasink_blocked_sessions"][0][1] >= 1  # ours, and whatever else the shared server has
        assert m["xasink_blocked_oldest_query_age_seconds"][0][1] >= 0
    assert m["xasink_in_doubt_batches"] == [(backend, 1.0)]
    assert m["xasink_sink_in_doubt_batches"] == [(on_sink, 1.0)]
    assert m["xasink_sink_in_doubt_oldest_age_seconds"][0][1] >= 0
    assert m["xasink_sink_prepared_branches"] == [(on_sink, 1.0)]
    assert m["xasink_sink_last_committed_batch"] == [(on_sink, 0.0)]
    [(labels, age)] = m["xasink_sink_last_committed_age_seconds"]
    assert labels == on_sink and age >= 0


def test_prometheus_says_down_when_the_server_cannot_be_reached() -> None:
    code, out, err = cli("status", "--url", "postgresql://u:S3cretPw@127.0.0.1:1/shop", "--prometheus")
    assert code == 3 and "cannot connect" in err
    m = _parse_prometheus(out)
    backend = {"server": "127.0.0.1:1", "database": "shop"}
    assert m == {"xasink_up": [(backend, 0.0)], "xasink_status_code": [(backend, 3.0)]}
    assert "S3cretPw" not in out + err


# --------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    "flags, pg_code, maria_code",
    [
        pytest.param(["--warn-prepared-age", "0"], 1, 1, marks=pytest.mark.doc_case("status/warn")),
        pytest.param(["--crit-prepared-age", "0"], 2, 2, marks=pytest.mark.doc_case("status/crit")),
        (["--warn-prepared-age", "0", "--crit-prepared-age", "0"], 2, 2),
        (["--warn-prepared-age", "1d", "--crit-prepared-age", "2d"], 0, None),  # MariaDB: None = baseline
        (["--warn-blocked", "0"], 1, 1),  # above 0: any blocked session
        (["--crit-blocked", "0"], 2, 2),
        (["--warn-blocked", "100000", "--crit-blocked", "100000"], 0, None),
        (["--warn-batch-age", "0"], 1, 1),
        (["--crit-batch-age", "0s"], 2, 2),
        (["--warn-batch-age", "1d", "--crit-batch-age", "2d"], 0, None),
        (["--warn-prepared-ratio", "0"], 1, None),  # MySQL has no limit: no ratio to alert on
        (["--crit-prepared-ratio", "0"], 2, None),
        (["--warn-prepared-ratio", "1", "--crit-prepared-ratio", "1"], 0, None),
        (["--older-than", "0s"], 1, 1),  # the old rule: in doubt or prepared for --older-than: WARNING
        (["--older-than", "0s", "--crit-blocked", "0"], 2, 2),  # the worst check wins
    ],
)
def test_each_threshold_gives_its_exit_code(
    scene: Scene, flags: list[str], pg_code: int, maria_code: int | None
) -> None:
    if any("blocked" in f for f in flags):
        need_lock_waits(scene)
    if "--older-than" not in flags:
        flags = [*flags, "--older-than", "1d"]
    baseline = health.EXIT_CODES[_status_json(scene, "--older-than", "1d")[1]["state"]]
    code, doc = _status_json(scene, *flags)
    expected = pg_code if scene.pg else (baseline if maria_code is None else maria_code)
    assert code == expected, doc["checks"]
    assert doc["state"] == {0: "OK", 1: "WARNING", 2: "CRITICAL"}[code]
    assert all(c["state"] in ("OK", "WARNING", "CRITICAL") for c in doc["checks"])
    plain, out, err = cli("status", "--url", scene.url, "--sink-id", scene.sink.sink_id, *flags)
    prom, pout, perr = cli("status", "--url", scene.url, "--sink-id", scene.sink.sink_id, "--prometheus", *flags)
    assert plain == prom == code, out + err + pout + perr
    assert f'xasink_status_code{{server="{doc["server"]}",database="{doc["database"]}"}} {code}' in pout


def test_python_api_takes_the_thresholds(scene: Scene) -> None:
    need_lock_waits(scene)
    report: StatusReport = xasink.status(
        scene.url, sink_id=scene.sink.sink_id, older_than_s=86400, thresholds=health.Thresholds(crit_blocked=0)
    )
    assert report.exit_code == 2 and report.state == "CRITICAL"
    [check] = [c for c in report.checks() if c.name == "blocked"]
    assert check.state == "CRITICAL" and check.value is not None and check.value >= 1
    with pytest.raises(ValueError):
        health.Thresholds(warn_prepared_age=-1)


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--url", "postgresql://u:S3cretPw@127.0.0.1:1/db"],  # cannot connect
        ["status", "--url", "postgresql://u:S3cretPw@127.0.0.1:1/db", "--json"],
        ["status", "--url", "postgresql://h/db", "--warn-blocked", "many"],  # bad argument
        ["status", "--url", "postgresql://h/db", "--crit-prepared-ratio", "2"],
        ["status", "--url", "postgresql://h/db", "--warn-prepared-age", "soon"],
        ["status"],  # no --url
    ],
)
def test_unknown_is_exit_code_3(args: list[str]) -> None:
    try:
        code, out, err = cli(*args)
    except SystemExit as exc:  # argparse's usage errors exit from inside main()
        code, out, err = int(exc.code or 0), "", ""
    assert code == 3
    assert "S3cretPw" not in out + err
