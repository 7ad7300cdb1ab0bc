"""Exceptions users can catch; every message says what to do next."""

from __future__ import annotations


class XasinkError(Exception):
    """Base class of every error xasink raises on purpose."""


class OptionError(XasinkError, ValueError):
    """A user option is unknown, missing or invalid; raised before any work starts."""


class PreflightError(XasinkError):
    """The server or the target table cannot take an XA write as configured."""


class ConnectError(PreflightError):
    """The server is unreachable or refused the credentials."""


class BranchError(XasinkError):
    """A partition's branch failed before PREPARE; it was rolled back."""


class BatchAbortedError(XasinkError):
    """The batch was not decided: no row of it is visible and nothing of it is left prepared."""


class CommitIncompleteError(XasinkError):
    """The batch is decided but some branches could not be committed yet.

    The decision is durable: the rows will appear when recovery (the next
    write of the same sink, or ``xasink recover``) commits the rest.  Never
    rerun the batch under another sink id: its rows would be written twice.
    """


class DecisionUnknownError(CommitIncompleteError):
    """The connection broke while the decision was committed, and the log could not be read again in time.

    The batch may or may not be decided; recovery (the next write of the same
    sink, or ``xasink recover``) settles it either way, as for a
    :class:`CommitIncompleteError`.
    """


class ReplayIncompleteError(CommitIncompleteError):
    """This run found its batch decided by another run (a replay, or a writer that took the batch over), and
    finishing that decision failed.

    None of this run's rows is written: the batch is the deciding run's, whose rows appear when recovery (the
    next write of the same sink, or ``xasink recover``) finishes it.  As for a finished replay ("skipped"),
    do not rerun the batch under another sink id.
    """


class JournalError(XasinkError):
    """The decision log does not hold what xasink wrote into it: a row was deleted or changed by someone else."""


class ApplyError(BatchAbortedError):
    """An overwrite, replaceWhere or change-data batch could not replace the target's rows for a reason no retry
    fixes (a constraint of the table, a row outside replaceWhere): the decision was withdrawn, the table keeps
    its old rows and nothing of the batch is visible or left prepared."""


class ConcurrentWriterError(BatchAbortedError):
    """Another writer or a recovery run settled this batch first."""


class LateBranchError(XasinkError):
    """A task attempt prepared its branch after its batch was decided without it, or after its run ended.

    The branch was rolled back at once (never left prepared): a zombie or losing speculative attempt
    whose result Spark does not use anyway.
    """


class BatchIdentityError(XasinkError):
    """A (sinkId, batchId) the log holds as committed was written again to another target (or by another
    streaming query): it is refused, never taken as a replay.  Nothing of this attempt was written."""


class ForgottenBatchError(BatchIdentityError):
    """The decision log can no longer tell whether this (sinkId, batchId) was committed (a log trimmed by an
    older xasink): writing could double its rows and skipping could lose them, so xasink refuses."""


class XasinkWarning(UserWarning):
    """Something the user must know though the write succeeded: a durability risk, retries after the decision,
    a batch left for recovery.  Shown by Python's ``warnings`` in the user's process and kept in
    :attr:`xasink.WriteResult.warnings`."""
