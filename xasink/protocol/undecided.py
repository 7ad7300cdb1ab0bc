"""What a run does when its batch cannot be decided now: finish the older batches that come first, or roll back.

Both are the decision step's ways out before anything of the batch is recorded, kept apart from the coordinator's
happy path.  They take what they use: the sink's recoveries, its branch group and retry policy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NoReturn

from xasink.errors import ApplyError, BatchAbortedError, CommitIncompleteError
from xasink.journal.records import BatchRecord
from xasink.protocol.branch_group import BranchGroup
from xasink.protocol.decision import Refusal
from xasink.protocol.recovery import Recovery
from xasink.protocol.retry import RetryPolicy

log = logging.getLogger(__name__)


def decide_past_blockers(
    decide: Callable[[], Refusal | None], recovery_of: Callable[[str], Recovery], policy: RetryPolicy
) -> Refusal | None:
    """``decide()``; while it is refused for older decided batches of the table, finish them and decide again.

    Another sink of the table may decide a batch while this run finishes the older ones (writers side by side):
    while the blocking batches change, each finish is progress, so this goes on until commitTimeout; the same
    batches blocking again (reported finished, still pending) end it at once."""
    verdict = decide()
    until = policy.deadline()
    while verdict is not None and verdict.blocked:
        before = set(verdict.blocked)
        if not finish_blockers(verdict, recovery_of, policy):
            break
        verdict = decide()
        if verdict is None or not verdict.blocked or set(verdict.blocked) == before:
            break
        if time.monotonic() > until:
            verdict.blocked_why = (
                f"other batches of the table kept being decided for commitTimeout ({policy.timeout_s} s) while "
                "this run finished the older ones"
            )
            break
    return verdict


def finish_blockers(verdict: Refusal, recovery_of: Callable[[str], Recovery], policy: RetryPolicy) -> bool:
    """Finish forward the older decided batches that keep a write-mode batch from deciding (DESIGN invariant
    12), oldest decision first, as ``xasink recover`` would (another sink's too: its apply takes the same table
    lock, so a live run's apply is waited for, then found done); True when all were finished (the decision is
    tried again).  What kept one unfinished goes into ``verdict.blocked_why``."""
    for sink in dict.fromkeys(s for s, _ in verdict.blocked):
        try:
            report = recovery_of(sink).finish([b for s, b in verdict.blocked if s == sink])
        except ApplyError:
            continue  # withdrawn for its rows: it no longer comes first
        except CommitIncompleteError as exc:
            verdict.blocked_why = policy.describe(exc)
            return False
        except Exception as exc:  # e.g. the connection lost while finishing: this batch is still undecided, so
            verdict.blocked_why = policy.describe(exc)  # it is refused as blocked (its branches rolled back)
            return False
        if report.unfinished:
            verdict.blocked_why = "; ".join(report.unfinished.values())
            return False
    return True


def roll_back_run(
    sink_id: str,
    record: BatchRecord,
    run: str | None,
    group: BranchGroup,
    policy: RetryPolicy,
    abort: Callable[[int, str | None], object],
) -> str | None:
    """Roll back a run that will not decide: its own branches first, without the log's sink lock
    (:meth:`BranchGroup.roll_back_run`: only this run could decide them, and it never will), so a lock another
    session holds on the sink row does not keep them prepared; then ``abort`` ends the run and sweeps under the
    lock (a late attempt's branch rolls itself back), its failure only logged.  Returns why branches may stay
    prepared, or None."""
    batch = record.batch_id
    run = run or next((x.run for x in record.xids), None)
    left = None
    if record.xids and run is not None:
        try:
            group.roll_back_run(record.xids[0].log_id, batch, run)
        except Exception as exc:  # noqa: BLE001 - the locked abort below may still reach them; else told
            left = policy.describe(exc)
    try:
        abort(batch, run)
    except Exception as exc:  # noqa: BLE001 - the run's branches are rolled back (or named by the caller)
        log.warning(
            "sink %s batch %s: ending the run in the decision log after it could not decide failed too (%s); "
            "a branch a late task prepares is rolled back by the next run of this sink or 'xasink recover'",
            sink_id,
            batch,
            policy.describe(exc),
        )
    else:
        left = None
    return left


def roll_back_undecided(
    sink_id: str,
    record: BatchRecord,
    run: str | None,
    cause: Exception,
    group: BranchGroup,
    policy: RetryPolicy,
    abort: Callable[[int, str | None], object],
) -> NoReturn:
    """The decision failed before it was sent (nothing recorded): roll back the run's branches
    (:func:`roll_back_run`) and say so."""
    batch = record.batch_id
    why = policy.describe(cause)
    left = roll_back_run(sink_id, record, run, group, policy, abort)
    head = f"sink {sink_id} batch {batch}: the decision could not be made ({why}), so nothing of it is visible"
    if left is None:
        raise BatchAbortedError(
            f"{head} and nothing of it is left prepared: this run's branches were rolled back. Run it again "
            f"with the same sinkId ('{sink_id}') and batchId"
        ) from cause
    raise BatchAbortedError(
        f"{head}, but rolling back this run's branches failed too ({left}): {STAY_PREPARED}. Then run it again "
        f"with the same sinkId ('{sink_id}') and batchId"
    ) from cause


STAY_PREPARED = (
    "they stay prepared, holding their row locks, until the next run of this sink or 'xasink recover' rolls them back"
)
