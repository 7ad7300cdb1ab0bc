"""Property-based test of the protocol: random interleavings of prepare, decide, commit, crash and recover.

A hypothesis state machine drives ``write_partition`` (a task's branch), ``Decider.decide``,
``Coordinator.commit`` / ``BranchGroup.commit`` (a commit that stops half-way), ``Coordinator.abort`` and
``Coordinator.recover`` against the real embedded PostgreSQL, for one sink with three batches.  A crash
abandons the coordinator and the driver's reports and starts a new run, as a restarted driver would.
After every step it checks the six invariants of DESIGN.md on what the database holds:

1. every visible row belongs to a branch listed in its batch's decision, and a branch is visible whole;
2. every listed branch is still prepared or visible (never rolled back);
3. a batch's decision never changes once made, and a replay of a decided batch writes nothing;
4. (decide vs. roll back) follows from 2 holding after every interleaving;
5. after a full recovery nothing of the sink is prepared;
6. a foreign prepared transaction that looks almost like ours is never touched.

Each row carries its branch's gid, so a row is traced to the branch that wrote it.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any, ClassVar

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from tests.cluster import Tally, tally_fixture
from tests.leaks import SECRET, no_secret_in_output  # noqa: F401 - autouse fixture
from tests.targets import connect, make_foreign_prepared, prepared_gids, rollback_prepared
from xasink.errors import BatchAbortedError, CommitIncompleteError, ConcurrentWriterError
from xasink.journal.records import BatchRecord
from xasink.options import parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import Xid, attempt_token, new_run_nonce
from xasink.results import BranchOutcome
from xasink.write_modes.schema import plan_target

SCHEMA = pa.schema([("id", pa.int64()), ("tag", pa.string())])
BATCHES = st.integers(0, 2)
PARTITIONS = st.integers(0, 1)
SCRATCH = "prop_foreign_scratch"


tally = tally_fixture("test_property")


def sql(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(statement, params or None)
        return list(cur.fetchall()) if cur.description else []


class Protocol(RuleBasedStateMachine):
    """One sink, three batches, two partitions; every step a real database operation."""

    url: ClassVar[str] = ""
    tally: ClassVar[Tally | None] = None
    seen: ClassVar[Counter[str]] = Counter()  # what the examples exercised, printed at the end

    def __init__(self) -> None:
        super().__init__()
        self.sink = f"p{uuid.uuid4().hex[:10]}"
        self.table = f"prop_{uuid.uuid4().hex[:8]}"
        sql(self.url, f"CREATE TABLE {self.table} (id bigint, tag text NOT NULL)")
        self.options = parse_options({"url": self.url, "dbtable": self.table, "sinkId": self.sink, "password": SECRET})
        self.coordinator = Coordinator(self.options)
        self.coordinator.preflight()
        with self.coordinator.dialect.connect() as conn:
            self.plan = plan_target(self.coordinator.dialect, conn, self.options, SCHEMA)
        self.run = new_run_nonce()
        self.attempt = 0
        self.next_id = 0
        self.branches: dict[str, list[int]] = {}  # every branch ever prepared -> its ids
        self.reports: dict[int, dict[int, BranchOutcome]] = {}  # what the live driver holds, per batch
        self.decided: dict[int, tuple[str, ...]] = {}  # decisions seen so far
        self.foreign = f"xasink:{self.sink}:0/0:1-0123ABCD"  # parses as nothing: upper-case nonce
        make_foreign_prepared(self.url, self.foreign, table=SCRATCH)
        self.recovered = False

    def _mine(self) -> list[str]:
        """Prepared branches of this sink, by parsing (the foreign one shares the prefix)."""
        return [g for g in prepared_gids(self.url, prefix=f"xasink:{self.sink}:") if Xid.parse(g) is not None]

    def _step(self) -> None:
        if self.tally is not None:
            self.tally.add(property_steps=1)

    def _journal(self) -> dict[int, tuple[str, tuple[str, ...]]]:
        found = sql(self.url, "SELECT batch_id, state, xids FROM xasink_batches WHERE sink_id = %s", self.sink)
        return {int(b): (s, tuple(sorted(json.loads(x)))) for b, s, x in found}

    # -- rules ------------------------------------------------------------------------------
    @initialize()
    def start(self) -> None:
        self._step()

    @rule(batch=BATCHES, partition=PARTITIONS, n=st.integers(1, 3))
    def prepare(self, batch: int, partition: int, n: int) -> None:
        """A task attempt writes a branch (a retry when the partition already reported).

        An attempt that finds this partition already prepared by another attempt of its run adopts that
        branch (reports it, writes nothing), as a speculative copy or a retry past PREPARE does.
        """
        self._step()
        decided = batch in self._journal()
        siblings = sorted(
            (x for x in (Xid.parse(g) for g in self._mine()) if x is not None),
            key=lambda x: (x.task_attempt_id, x.attempt),
        )
        siblings = [x for x in siblings if (x.batch_id, x.partition, x.run) == (batch, partition, self.run)]
        self.attempt += 1
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        gid = Xid(
            self.coordinator.journal.log_id(), self.sink, batch, partition, attempt_token(self.attempt, self.run)
        ).gid
        rows = pa.RecordBatch.from_arrays([pa.array(ids, pa.int64()), pa.array([gid] * n)], schema=SCHEMA)
        outcome = write_partition(
            self.options,
            self.plan,
            batch_id=batch,
            partition=partition,
            task_attempt_id=self.attempt,
            run=self.run,
            batches=[rows],
        )
        if decided:  # invariant 3: a replay of a decided batch writes nothing
            assert outcome.skipped and outcome.gid is None, outcome
            self.seen["prepare: replay skipped"] += 1
            return
        if siblings:
            assert outcome.gid == siblings[0].gid and outcome.rows == n, outcome
            self.seen["prepare: adopted a prepared sibling"] += 1
            self.reports.setdefault(batch, {})[partition] = outcome
            return
        assert outcome.gid == gid and outcome.rows == n
        self.branches[gid] = ids
        self.reports.setdefault(batch, {})[partition] = outcome

    @rule(batch=BATCHES, data=st.data())
    def decide(self, batch: int, data: st.DataObject) -> None:
        """Record a decision over some of the reported branches (the decision step alone)."""
        self._step()
        reported = sorted(o.gid for o in self.reports.get(batch, {}).values() if o.gid)
        chosen = data.draw(st.lists(st.sampled_from(reported), unique=True) if reported else st.just([]))
        xids = tuple(sorted(x for x in (Xid.parse(g) for g in chosen) if x is not None))
        record = BatchRecord(self.sink, batch, "committing", xids, 0, len(xids))
        try:
            self.coordinator.decider.decide(record)
            self.seen["decide: recorded"] += 1
        except ConcurrentWriterError:
            self.seen["decide: refused"] += 1

    @rule(batch=BATCHES)
    def commit(self, batch: int) -> None:
        """The driver's whole commit of a batch with what its tasks reported."""
        self._step()
        before = self._journal().get(batch)
        try:
            result = self.coordinator.commit(batch, list(self.reports.get(batch, {}).values()))
        except (ConcurrentWriterError, BatchAbortedError, CommitIncompleteError) as exc:
            self.seen[f"commit: {type(exc).__name__}"] += 1
            return
        self.seen["commit: finished a decided batch" if before is not None else "commit: decided and committed"] += 1
        if before is not None:
            assert result.skipped  # invariant 3: finishing a decided batch is a replay
        assert self._journal()[batch][0] == "committed"

    @rule(batch=BATCHES, data=st.data())
    def commit_some(self, batch: int, data: st.DataObject) -> None:
        """A commit phase that stops part-way: some listed branches committed, then the driver is gone."""
        self._step()
        listed = self._journal().get(batch)
        if listed is None or not listed[1]:
            return
        some = data.draw(st.lists(st.sampled_from(listed[1]), unique=True, min_size=1))
        xids = [x for x in (Xid.parse(g) for g in some) if x is not None]
        self.coordinator.group.commit(xids)

    @rule(batch=BATCHES)
    def abort(self, batch: int) -> None:
        self._step()
        self.coordinator.abort(batch)

    @rule()
    def crash(self) -> None:
        """The driver dies: its coordinator and the reports it held are gone; the next run has a new nonce."""
        self._step()
        self.coordinator.close()
        self.coordinator = Coordinator(self.options)
        self.run = new_run_nonce()
        self.reports.clear()

    @rule(upto=st.none() | BATCHES)
    def recover(self, upto: int | None) -> None:
        self._step()
        self.coordinator.recover(upto=upto)
        if upto is None:  # invariant 5
            assert self._mine() == []

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def six_invariants(self) -> None:
        journal = self._journal()
        rows = sql(self.url, f"SELECT id, tag FROM {self.table}")
        counts = Counter(int(i) for i, _ in rows)
        assert all(c == 1 for c in counts.values()), "a row is visible twice"
        visible: dict[str, list[int]] = {}
        for i, tag in rows:
            visible.setdefault(tag, []).append(int(i))
        prepared = set(self._mine())
        for gid, ids in visible.items():  # 1: visible only if listed, and whole
            xid = Xid.parse(gid)
            assert xid is not None and xid.batch_id in journal, f"{gid} is visible but its batch is undecided"
            assert gid in journal[xid.batch_id][1], f"{gid} is visible but not in its batch's decision"
            assert sorted(ids) == self.branches[gid], f"{gid} is partly visible"
            assert gid not in prepared
        for _, gids in journal.values():  # 2: a listed branch is never rolled back
            for gid in gids:
                assert gid in prepared or gid in visible, f"decided branch {gid} was rolled back"
        for batch, gids in self.decided.items():  # 3: a decision never changes or disappears
            assert journal.get(batch, (None, None))[1] == gids, f"the decision of batch {batch} changed"
        self.decided.update({b: g for b, (_, g) in journal.items()})
        assert prepared <= set(self.branches), "a prepared branch nobody wrote"
        assert self.foreign in prepared_gids(self.url), "the foreign prepared transaction was touched"  # 6

    def teardown(self) -> None:
        try:
            self.coordinator.recover()
            assert self._mine() == []
        finally:
            self.coordinator.close()
            if self.foreign in prepared_gids(self.url):
                rollback_prepared(self.url, self.foreign)
            sql(self.url, f"DROP TABLE IF EXISTS {self.table}")
            sql(self.url, "DELETE FROM xasink_batches WHERE sink_id = %s", self.sink)


def test_random_interleavings_keep_the_six_invariants(pg_url: str, tally: Tally) -> None:
    Protocol.url = pg_url
    Protocol.tally = tally
    run_state_machine_as_test(
        Protocol,
        settings=settings(
            max_examples=25,
            stateful_step_count=20,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    print(dict(sorted(Protocol.seen.items())))
    assert sql(pg_url, f"SELECT count(*) FROM {SCRATCH}")[0][0] == 0  # no foreign transaction was ever committed
    # the interleavings reached the interesting cases
    assert Protocol.seen["decide: recorded"] and Protocol.seen["decide: refused"], Protocol.seen
    assert Protocol.seen["commit: decided and committed"] and Protocol.seen["commit: finished a decided batch"]
