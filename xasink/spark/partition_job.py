"""The partition-function way in: the data source's own writer, run by ``mapInArrow`` and ``collect``.

Where PySpark has no Python data source API (Spark 3.5), ``xasink.write``, ``foreach_batch`` and
``xasink.transaction`` play Spark's part themselves, with the very objects ``format("xasink")`` uses:

1. ``XasinkDataSource(options).writer(schema, overwrite)`` plans the write on the driver (server checks,
   the table, the run guard, the claim of the batch, recovery of earlier runs), as Spark calls it;
2. one Spark job runs ``writer.write(batches)`` on every partition (``mapInArrow``: the Arrow batches
   Spark's own data source write feeds the same function) and returns each task's commit message;
3. ``collect()`` hands the driver exactly one message per partition, and ``writer.commit(messages)``
   decides and commits, or ``writer.abort(messages)`` rolls back when the job or the commit failed.

Why one message per partition is enough without Spark's output commit coordinator: the scheduler takes
the result of the first attempt of a partition that succeeds and ignores every later one (a speculative
copy, a retry whose first attempt was already reported), so the driver adopts exactly one branch per
partition; every other attempt's branch is of the same run but not in the decision, and is rolled back by
the commit's sweep, or by itself when it prepares after the decision (``settle_prepared``).  A retry
adopts a sibling's prepared branch as it does under the data source.  When the job fails, the run is
known on the driver (its nonce), so the abort ends it and rolls back all of its branches, those of tasks
still running included (the abort's settle window, then their own late check).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pickle
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from xasink.errors import BatchCommittedError, XasinkError
from xasink.spark.streams import is_connect
from xasink.spark.versions import HAS_DATA_SOURCE, CaseInsensitiveDict, pyspark_version, require_data_source
from xasink.support.masking import redact, url_secrets

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from xasink.spark.batch_writer import XasinkBatchWriter
    from xasink.spark.write_task import XasinkCommitMessage

log = logging.getLogger("xasink")

# which way in (for benchmarks and tests): "partitions" or "datasource"; unset, the data source where it exists
WAY_IN_ENV = "XASINK_SPARK_WAY_IN"
MESSAGE_SCHEMA = "message binary"  # one row per partition: the task's pickled commit message


def uses_data_source() -> bool:
    """Whether writes go through ``format("xasink")`` (Spark 4.0+) or the partition function."""
    way = os.environ.get(WAY_IN_ENV, "").strip().lower()
    if way == "partitions":
        return False
    if way == "datasource":
        require_data_source()
        return True
    if way:
        raise XasinkError(f"{WAY_IN_ENV}={way!r}: use 'partitions' or 'datasource' (or leave it unset)")
    return HAS_DATA_SOURCE


def save(df: DataFrame, options: dict[str, str], mode: str) -> None:
    """``df.write.format("xasink").options(**options).mode(mode).save()``, by this Spark's way in.

    Errors of the driver's own steps are raised as they are (xasink errors); a failed Spark job raises
    Spark's exception, whose text carries the task's error (:func:`xasink.spark.job_errors.unwrap_error`).
    """
    if uses_data_source():
        df.write.format("xasink").options(**options).mode(mode).save()
        return
    if is_connect(df.sparkSession):
        raise XasinkError(
            f"xasink writes through Spark Connect need the Python data source API of Spark 4.0 or later (this is "
            f"PySpark {pyspark_version()}{f', {WAY_IN_ENV}=partitions' if HAS_DATA_SOURCE else ''}); use a "
            "classic SparkSession on Spark 3.5"
        )
    if not HAS_DATA_SOURCE and importlib.util.find_spec("pandas") is None:
        # PySpark 3.5 builds mapInArrow's function with pandas_udf, which refuses to run without pandas
        raise XasinkError(
            f"xasink on PySpark {pyspark_version()} writes through mapInArrow, which PySpark 3.5 runs only with "
            "pandas installed: pip install 'pandas>=2.0,<2.3' in the driver's and the executors' Python "
            "(docs/spark-versions.md)"
        )
    save_by_partitions(df, options, mode)


def save_by_partitions(df: DataFrame, options: dict[str, str], mode: str) -> None:
    """Plan, run one job of the partition function, commit or abort: Spark's part in a data source write."""
    from xasink.spark.datasource import XasinkDataSource

    source = XasinkDataSource(CaseInsensitiveDict(options))
    writer = source.writer(df.schema, mode == "overwrite")
    messages: list[XasinkCommitMessage] = []
    job_failed = True  # until collect() returns: then the commit may decide, and the abort must not assume not
    try:
        rows = df.mapInArrow(partition_function(writer), MESSAGE_SCHEMA).collect()
        job_failed = False
        messages = sorted((pickle.loads(bytes(row[0])) for row in rows), key=lambda m: m.outcome.partition)
        writer.commit(list(messages))
    except BaseException as failed:
        # as Spark does: a failed job or commit is aborted with what the tasks reported (none when the job
        # failed; the writer knows its run, and the abort ends it and rolls back all of its branches); an
        # abort that fails too is logged, and the write's own error is what the caller gets, unless the abort
        # found the batch committed (what the log holds is the truth after a failed commit)
        try:
            writer.abort(list(messages), job_failed=job_failed)
        except BatchCommittedError as held:
            raise held from failed
        except Exception as abort_error:  # noqa: BLE001 - the branches wait for the next run or 'xasink recover'
            why = redact(f"{type(abort_error).__name__}: {abort_error}", url_secrets(writer.options.url))
            log.warning(
                "aborting sink %s batch %s failed too: %s", writer.options.sink_id, writer.options.batch_id, why
            )
        raise


def partition_function(writer: XasinkBatchWriter) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function every task runs: the writer's ``write`` over the partition's Arrow batches, and its
    commit message as the task's one output row (what Spark's own data source write does in 4.0+)."""

    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        message: Any = writer.write(batches)
        yield pa.record_batch([pa.array([pickle.dumps(message)], pa.binary())], names=["message"])

    return write_partition
