"""Exceptions users can catch; every message says what to do next.

``df.write.format("xasink")`` and streaming queries raise Spark's exceptions (``PythonException``,
``AnalysisException``, ``StreamingQueryException``...), which carry xasink's error only in their text:
:func:`from_spark` and :func:`spark_errors` give it back with its own class.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager


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


class BatchCommittedError(XasinkError):
    """The batch is committed, every row of it visible, but Spark failed the write: the step running the commit
    failed after the decision (its Python worker died, say), and Spark's abort finished the decided batch.

    Raised through ``format("xasink")`` (Spark fails the save whatever its abort finds); ``xasink.write``
    returns the written result instead.  A rerun with the same sinkId and batchId is skipped.
    """


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


class BatchBlockedError(BatchAbortedError):
    """An older decided batch of the same table is not applied yet, and this run could not finish it first: a
    newer batch never takes effect before an older decided one (DESIGN invariant 12).  This batch was not
    decided and nothing of it is visible; ``xasink recover`` finishes the older batch, then run this one again."""


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


# xasink's messages are one line: the message ends at the line's end, where Spark's own text resumes (another
# worker's traceback, a Java frame, the SQLSTATE Spark appends)
_ERROR_RE = re.compile(r"xasink\.errors\.(\w+): ([^\n]+?)(?:\s*SQLSTATE: \w+)?\s*(?:\n|\Z)")
_NOT_FOUND_RE = re.compile(r"DATA_SOURCE_NOT_FOUND\].*?data source: xasink\b", re.S | re.I)
# a Python worker that could not import xasink or one of its packages: xasink's own frames (or xasink itself)
_MISSING_RE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
_XASINK_FRAME_RE = re.compile(r"[/\\]xasink[/\\][\w/\\]+\.py\b")


def _missing_module(text: str) -> PreflightError | None:
    """Spark's Python workers run PYSPARK_PYTHON, not the driver's Python: one without xasink's packages."""
    found = _MISSING_RE.search(text)
    if found is None or not (found.group(1).split(".")[0] == "xasink" or _XASINK_FRAME_RE.search(text)):
        return None
    return PreflightError(
        f"Spark's Python workers cannot import {found.group(1)} (No module named '{found.group(1)}'), which xasink "
        "needs: they run the Python that PYSPARK_PYTHON (or spark.pyspark.python) names, 'python3' when unset, "
        "not the driver's. Install xasink into that Python, or point PYSPARK_PYTHON at one that has it (e.g. "
        "os.environ['PYSPARK_PYTHON'] = sys.executable before the SparkSession starts; on a cluster, a Python "
        "environment shipped to the executors). Nothing was written."
    )


def from_spark(exc: BaseException) -> XasinkError | None:
    """The xasink error inside an exception Spark raised (``format("xasink")``, a streaming query, Spark
    Connect), rebuilt with its own class and message; None when it carries none.

    ``exc`` itself when it is an :class:`XasinkError` already.  Spark's DATA_SOURCE_NOT_FOUND for ``xasink``
    becomes an :class:`OptionError` that says what to do (register the source in the writing thread).
    """
    texts: list[str] = []
    cause: BaseException | None = exc
    while cause is not None and len(texts) < 10:  # the chain of explicit causes (``raise ... from``)
        if isinstance(cause, XasinkError):
            return cause
        texts.append(str(cause))
        # a streaming query's "Writing job failed" keeps the failed task's error in its JVM causes only
        extra = (getattr(cause, "_desc", None), getattr(cause, "desc", None), getattr(cause, "_stackTrace", None))
        texts += [v for v in extra if isinstance(v, str)]
        cause = cause.__cause__
    text = "\n".join(texts)
    found = _ERROR_RE.findall(text)
    if found:
        name, message = found[-1]
        cls = globals().get(name)
        if not (isinstance(cls, type) and issubclass(cls, XasinkError)):
            cls = XasinkError
        return cls(message.strip())
    missing = _missing_module(text)
    if missing is not None:
        return missing
    if _NOT_FOUND_RE.search(text):
        return OptionError(
            "Spark did not find the 'xasink' data source in this thread: Spark looks a Python data source up in "
            "the writing thread's active session, which a new thread (a thread pool's) does not have. Call "
            "xasink.register(spark) in the thread before writing (it is cheap and idempotent), or write with "
            "xasink.write(df, ...), which does so itself. Nothing was written."
        )
    return None


@contextmanager
def spark_errors() -> Iterator[None]:
    """Raise xasink's own error class from a Spark exception that carries one, so that ``except
    xasink.BranchError`` (or any class of this module) catches what ``format("xasink")`` and streaming queries
    raise; other exceptions pass unchanged.  The Spark exception is the new one's ``__cause__``::

        with xasink.spark_errors():
            df.write.format("xasink").option(...).save()
    """
    try:
        yield
    except XasinkError:
        raise
    except Exception as exc:
        inner = from_spark(exc)
        if inner is None:
            raise
        raise inner from exc
