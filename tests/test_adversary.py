"""Adversarial checks of issue 27's rules (only the holder decides, forward only after the decision, errors
classified once by the dialect) against the real servers: each test is a way found to lose, double or
mis-report a batch; ``xfail(strict=True)`` while the bug is open."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from tests.scenarios.driver import _Phase, write
from tests.targets import Target
from xasink.coordinator import Coordinator
from xasink.options import parse_options


def change_data_options(db: Target, table: str, sink: str, batch: int) -> dict[str, Any]:
    options: dict[str, Any] = {
        "url": db.url,
        "dbtable": table,
        "sinkId": sink,
        "batchId": batch,
        "upsertKeyColumns": "id",
        "deleteFlagColumn": "is_delete",
        "sequenceColumn": "seq",
        "commitTimeout": 20,
        "lockTimeout": 20,
    }
    if db.password is not None:
        options["password"] = db.password
    return options


def in_thread(spec: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """A scenario writer (tests/scenarios/driver.py) run in a thread; its result or exception in the dict."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["ok"] = write(spec, lambda **_: None, _Phase())
        except Exception as exc:  # noqa: BLE001 - the outcome is what is checked
            result["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, result


def test_apply_error_after_a_recovery_applied_the_batch_is_not_reported_as_nothing_visible(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's apply of a decided change-data batch fails on a constraint (ROWS); before its withdrawal
    gets the sink lock, the constraint is gone and 'xasink recover' applies the batch (its rows are
    visible, the batch marked committed).  The withdrawal then deletes nothing: the driver must not tell the
    user 'the table keeps its old rows and nothing of this batch is visible' (invariant 11)."""
    table = db.new_table()
    db.create_table(
        table, "id int PRIMARY KEY, name varchar(40), seq bigint, CONSTRAINT adv_no_bad CHECK (name <> 'bad')"
    )
    sink = f"adv-{uuid.uuid4().hex[:8]}"
    options = change_data_options(db, table, sink, 1)
    monkeypatch.setenv("XASINK_FAULT", "driver.after_commits:sleep=3")
    t, result = in_thread({"options": options, "save_mode": "append", "partitions": [[[1, "bad", 5, False]]]})
    time.sleep(1.5)  # decided, its branches committed into the shadow, sleeping before the apply
    with db.connect() as lock, lock.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"SELECT sink_id FROM {db.q('xasink_sinks')} WHERE sink_id = %s FOR UPDATE", (sink,))
        time.sleep(4)  # the apply failed on the check; the withdrawal waits for the sink lock
        assert t.is_alive()
        db.execute(f"ALTER TABLE {db.q(table)} DROP CONSTRAINT adv_no_bad")
        monkeypatch.delenv("XASINK_FAULT")
        recovery = Coordinator(parse_options(options))
        try:
            report = recovery.recover()
        finally:
            recovery.close()
        assert 1 in report.finished_batches
        cur.execute("COMMIT")
    t.join(60)
    assert db.rows(table) == [(1, "bad", 5)]  # the batch is visible
    decision = db.decision(sink, 1)
    assert decision is not None
    assert "error" not in result, repr(result.get("error"))
