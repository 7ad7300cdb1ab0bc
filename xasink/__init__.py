"""xasink: exactly-once writes from PySpark into PostgreSQL and MySQL/MariaDB by XA two-phase commit.

import xasink
xasink.register(spark)
df.write.format("xasink").option("url", url).option("dbtable", "orders").mode("append").save()
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from xasink.errors import (
    ApplyError,
    BatchAbortedError,
    BatchBlockedError,
    BatchIdentityError,
    BranchError,
    CommitIncompleteError,
    ConcurrentWriterError,
    ConnectError,
    DecisionUnknownError,
    ForgottenBatchError,
    JournalError,
    LateBranchError,
    OptionError,
    PreflightError,
    ReplayIncompleteError,
    XasinkError,
    XasinkWarning,
    from_spark,
    spark_errors,
)
from xasink.ops.status import status
from xasink.ops.survey import recover
from xasink.results import EarlierCommit, TransactionResult, WriteResult

if TYPE_CHECKING:
    from xasink.spark.api import foreach_batch, register, write
    from xasink.spark.transaction import foreach_batch_multi, transaction

__version__ = "0.1.0"

logging.getLogger("xasink").addHandler(logging.NullHandler())

_SPARK = {"register", "write", "foreach_batch"}
_TX = {"transaction", "foreach_batch_multi"}


def __getattr__(name: str) -> Any:
    # pyspark is imported only when a Spark entry point is used: the CLI's recover stays light
    if name in _SPARK:
        from xasink.spark import api

        return getattr(api, name)
    if name in _TX:
        from xasink.spark import transaction as tx

        return getattr(tx, name)
    raise AttributeError(f"module 'xasink' has no attribute {name!r}")


__all__ = [
    "ApplyError",
    "BatchAbortedError",
    "BatchBlockedError",
    "BatchIdentityError",
    "BranchError",
    "CommitIncompleteError",
    "ConcurrentWriterError",
    "ConnectError",
    "DecisionUnknownError",
    "EarlierCommit",
    "ForgottenBatchError",
    "JournalError",
    "LateBranchError",
    "OptionError",
    "PreflightError",
    "ReplayIncompleteError",
    "TransactionResult",
    "WriteResult",
    "XasinkError",
    "XasinkWarning",
    "foreach_batch",
    "foreach_batch_multi",
    "from_spark",
    "recover",
    "register",
    "spark_errors",
    "status",
    "transaction",
    "write",
]
