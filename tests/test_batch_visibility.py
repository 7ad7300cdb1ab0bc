"""``visibility="batch"`` (issue 40): readers see none or all of an appended (or upserted) batch.

The branches commit into the shadow table; the batch reaches the table in one local transaction, by the
write modes' apply step (decision order, recovery).  The control case, the default ``"branch"``, shows a
reader a part of the batch while the driver is held between two COMMITs: so the checks can fail.
"""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

import xasink
from tests.harness import (
    Stream,
    assert_settled,
    expected,
    fill,
    frame,
    needs_data_source,
    run_driver,
    seen_while,
    shadow_rows,
    shadow_tables,
)
from tests.leaks import run_cli
from tests.modes_driver import batch_direct, split
from tests.procs import ROOT, tail
from tests.targets import MARIADB, POSTGRESQL, Target, case
from xasink.errors import OptionError

COLUMNS = {"id": "int", "name": "string"}
OLD = expected(range(100), tag="o")


def sink() -> str:
    return f"vis-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("visibility", ["batch", "branch"])
def test_readers_see_none_or_all_of_an_appended_batch(
    db: Target, monkeypatch: pytest.MonkeyPatch, visibility: str
) -> None:
    """An append of 900 rows in 3 branches, the driver held 1.5 s after its first COMMIT."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    before, after = (100, sum(range(100))), (1000, sum(range(100)) + sum(range(1000, 1900)))
    monkeypatch.setenv("XASINK_FAULT", "driver.after_first_commit:sleep=1.5")
    s = sink()
    results: list[Any] = []
    seen = seen_while(
        db,
        table,
        lambda: results.append(
            batch_direct(db.url, table, s, 0, COLUMNS, split(1000, 900, 3), "append", visibility=visibility)
        ),
    )
    assert results[0].rows == 900 and not results[0].skipped
    assert seen.get(before, 0) > 10 and seen.get(after, 0) > 0, seen  # the reader read throughout
    if visibility == "batch":
        assert set(seen) <= {before, after}, f"a reader saw a part of the batch: {seen}"
    else:  # the control: each branch visible as it commits
        assert set(seen) - {before, after}, f"no reader saw the partly committed batch: {seen}"
    assert db.rows(table) == sorted(OLD + expected(range(1000, 1900)))
    assert_settled(db, s)


def test_an_upsert_seen_whole_merges_by_key(db: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """``upsertKeyColumns`` with ``visibility="batch"``: the keys 50..149 updated or inserted at once."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    before = (100, sum(range(100)))
    after = (150, sum(range(150)))
    monkeypatch.setenv("XASINK_FAULT", "driver.after_first_commit:sleep=1.0")
    s = sink()
    seen = seen_while(
        db,
        table,
        lambda: batch_direct(
            db.url, table, s, 0, COLUMNS, split(50, 100, 2), "append", visibility="batch", upsertKeyColumns="id"
        ),
    )
    assert set(seen) <= {before, after}, f"a reader saw a part of the batch: {seen}"
    assert db.rows(table) == sorted(expected(range(50), tag="o") + expected(range(50, 150)))
    assert_settled(db, s)


@pytest.mark.parametrize(
    ("db", "point"),
    [
        case(POSTGRESQL, "driver.after_first_commit"),
        case(POSTGRESQL, "driver.after_commits"),
        case(MARIADB, "driver.after_decide"),
        case(MARIADB, "driver.after_commits"),
    ],
    indirect=["db"],
)
def test_a_batch_visible_append_killed_after_its_decision_is_finished_whole_by_recover(
    db: Target, tmp_path: Path, point: str
) -> None:
    """kill -9 of the driver once decided: the table keeps its old rows until ``xasink recover`` applies
    the whole batch, once."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    s = sink()
    spec = {
        "url": db.url,
        "table": table,
        "sink_id": s,
        "batch_id": 3,
        "columns": COLUMNS,
        "partitions": split(1000, 300, 3),
        "mode": "append",
        "options": {"visibility": "batch"},
    }
    log = tmp_path / "driver.log"
    returncode = run_driver(ROOT / "tests" / "modes_driver.py", ["batch", json.dumps(spec)], f"{point}:kill", log)
    assert returncode == -signal.SIGKILL, f"driver exited {returncode}, not killed at {point}:\n{tail(log)}"
    decision = db.decision(s, 3)
    assert decision is not None and decision.state == "committing"
    assert db.rows(table) == OLD  # decided, some branches maybe committed into the shadow: none visible
    cli = run_cli("recover", "--url", db.url)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert db.rows(table) == sorted(OLD + expected(range(1000, 1300)))
    assert_settled(db, s)
    again = run_cli("recover", "--url", db.url)  # applied once: a second recover changes nothing
    assert again.returncode == 0 and db.rows(table) == sorted(OLD + expected(range(1000, 1300)))


def test_an_unknown_visibility_is_refused_before_any_work(db: Target) -> None:
    table = db.new_table()
    db.keyed_table(table)
    with pytest.raises(OptionError, match="'visibility'.*'branch'.*'batch'"):
        batch_direct(db.url, table, sink(), 0, COLUMNS, split(0, 10, 1), "append", visibility="partition")
    assert db.rows(table) == []


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)
def test_spark_writers_take_visibility_batch(db: Target, spark: SparkSession) -> None:
    """``xasink.write(visibility="batch")`` and ``format("xasink").option("visibility", "batch")`` append
    through the shadow (their rows exact, the shadow empty after)."""
    table = db.new_table()
    db.keyed_table(table)
    result = xasink.write(frame(spark, range(0, 40), 4), db.url, table, sink_id=sink(), visibility="batch")
    assert result.rows == 40
    frame(spark, range(40, 80), 4).write.format("xasink").option("url", db.url).option("dbtable", table).option(
        "sinkId", sink()
    ).option("visibility", "batch").mode("append").save()
    assert db.rows(table) == expected(range(80)) and shadow_rows(db) == 0
    # through the public API: an unknown value, and a batch-visible write inside a transaction, are refused
    # before anything is written or claimed
    refused = sink()
    unknown: Any = "partition"  # not a value of the visibility Literal: the call a type checker would refuse
    with pytest.raises(OptionError, match="'visibility'.*'branch'.*'batch'"):
        xasink.write(frame(spark, range(80, 90), 2), db.url, table, sink_id=refused, visibility=unknown)
    with pytest.raises(OptionError, match="visibility='batch' are not supported inside xasink.transaction"):  # noqa: SIM117
        with xasink.transaction(sink_id=refused, batch_id=0) as tx:
            tx.write(frame(spark, range(80, 90), 2), db.url, table, visibility="batch")
    assert db.rows(table) == expected(range(80)) and db.decision(refused, 0) is None and db.prepared(refused) == []


def test_the_streaming_sink_takes_visibility_batch(stream: Stream, pg: Target) -> None:
    """``writeStream.format("xasink").option("visibility", "batch")``: each micro-batch once through the
    shadow, a replay of a committed one writes nothing."""
    needs_data_source()
    stream.add_files(2)
    shadows = shadow_tables(pg)
    stream.run(visibility="batch")
    assert len(shadow_tables(pg)) == len(shadows) + 1  # the sink's shadow: the batches went through it
    before = stream.decisions()
    stream.forget_spark_commit(1)
    stream.run(visibility="batch")
    assert stream.decisions() == before
    stream.assert_exactly_once()
