"""The DataFrame as a write needs it, with DataFrame calls only (Spark Connect has no ``df.rdd``): laid out for
the branches, and how many branches that makes where Spark can say before any row is loaded."""

from __future__ import annotations

from typing import NamedTuple

from pyspark.sql import DataFrame

from xasink import errors
from xasink.options import WriteOptions
from xasink.spark.streams import is_connect


class Shaped(NamedTuple):
    df: DataFrame
    branches: int | None  # the most branches the write opens, known before any row is loaded; None: unknown


def shape(df: DataFrame, parsed: WriteOptions) -> Shaped:
    """``df`` laid out for the write, with DataFrame calls only (Spark Connect has no ``df.rdd``), and how many
    branches it opens at most where that is known without running a Spark job (:func:`branch_count`).

    Upsert keys: equal keys in two branches would make the second wait on the first, prepared, until a
    lock timeout, so rows are hash-partitioned by key, into ``numPartitions`` partitions if given (else
    as many as the DataFrame has in classic Spark, ``spark.sql.shuffle.partitions`` under Connect).
    Otherwise ``numPartitions`` coalesces: a coalesce never adds partitions, so the write opens the fewer of
    the DataFrame's partitions and ``numPartitions`` (unknown where Spark cannot count the former without a
    job: the driver then checks the slots against ``numPartitions`` as a cap, :func:`.planning.prepare_write`).
    """
    unknown = [k for k in parsed.upsert_key_columns if k.lower() not in {c.lower() for c in df.columns}]
    if unknown:  # say it in our words before Spark's repartition fails on it
        raise errors.PreflightError(f"option 'upsertKeyColumns': '{unknown[0]}' is not a column of the DataFrame")
    keys, num_partitions = parsed.upsert_key_columns, parsed.num_partitions
    if keys:
        n = num_partitions
        if n is None and not is_connect(df.sparkSession):
            n = df.rdd.getNumPartitions()  # classic: keep the DataFrame's parallelism, as before
        return Shaped(df.repartition(n, *keys), n) if n is not None else Shaped(df.repartition(*keys), None)
    count = branch_count(df)
    if num_partitions is not None:  # a cap: a coalesce never adds partitions
        return Shaped(df.coalesce(num_partitions), min(count, num_partitions) if count is not None else None)
    return Shaped(df, count)


def branch_count(df: DataFrame) -> int | None:
    """``df``'s partitions (each opens at most one branch) when Spark tells without running a job, else None.

    Classic Spark counts the partitions of a plan without a shuffle as it plans it.  A plan with one (a
    groupBy, a join, a repartition) runs its stages to count them under adaptive execution (and samples the
    rows for an orderBy): the count would cost a second job, so it is left unknown and each task checks for
    a free prepared-transaction slot before it loads (xasink.spark.write_task).  Spark Connect gives no count.
    """
    if is_connect(df.sparkSession):
        return None
    plan = str(df._jdf.queryExecution().executedPlan().toString())  # planning only
    if any(word in plan for word in ("Exchange", "AdaptiveSparkPlan", "Subquery")):
        return None
    return int(df.rdd.getNumPartitions())
