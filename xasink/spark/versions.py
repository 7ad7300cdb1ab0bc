"""What the installed PySpark offers xasink: the Python data source API (4.0+) and its Arrow stream writer (4.1+).

One protocol, two ways in (docs/spark-versions.md): where PySpark has the Python data source API,
``format("xasink")`` runs the writer classes of :mod:`xasink.spark.datasource`; on Spark 3.5 the same
writer objects are driven by :mod:`xasink.spark.partition_job` over ``mapInArrow``.  So the writer
modules import their base classes from here: PySpark's own where they exist, plain stand-ins where they do
not (3.5), which no Spark code ever sees.
"""

from __future__ import annotations

import inspect
import re
from collections import UserDict
from typing import TYPE_CHECKING, Any

import pyspark

from xasink.errors import XasinkError


def _version(text: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


SPARK_VERSION = _version(pyspark.__version__)
# the Python data source API (pyspark.sql.datasource, spark.dataSource.register): Spark 4.0
HAS_DATA_SOURCE = SPARK_VERSION >= (4, 0)
# DataSourceStreamArrowWriter (a streaming writer fed Arrow batches; 4.0's stream writer is fed Rows): 4.1
HAS_STREAM_ARROW_WRITER = SPARK_VERSION >= (4, 1)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructField

if TYPE_CHECKING or HAS_DATA_SOURCE:
    from pyspark.sql.datasource import (
        CaseInsensitiveDict,
        DataSource,
        DataSourceArrowWriter,
        DataSourceStreamWriter,
        WriterCommitMessage,
    )
else:  # Spark 3.5: stand-ins, for the partition-function way in (xasink.spark.partition_job)

    class CaseInsensitiveDict(UserDict):  # type: ignore[no-redef,type-arg]
        """Options looked up without case, as PySpark's own (4.0+) hands them to a data source."""

        def __setitem__(self, key: str, value: Any) -> None:
            super().__setitem__(key.lower(), value)

        def __getitem__(self, key: str) -> Any:
            return super().__getitem__(key.lower())

        def __contains__(self, key: object) -> bool:
            return isinstance(key, str) and super().__contains__(key.lower())

    class DataSource:  # type: ignore[no-redef]
        def __init__(self, options: Any) -> None:
            self.options = options

    class DataSourceArrowWriter:  # type: ignore[no-redef]
        pass

    class DataSourceStreamWriter:  # type: ignore[no-redef]
        pass

    class WriterCommitMessage:  # type: ignore[no-redef]
        pass


if TYPE_CHECKING or HAS_STREAM_ARROW_WRITER:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamWriterBase
elif HAS_DATA_SOURCE:
    # 4.0: a stream writer is fed Rows, unless it is also a DataSourceArrowWriter, which 4.0's write worker
    # (pyspark.sql.worker.write_into_data_source) checks first for streaming writes too; its stream commit
    # worker calls commit(messages, batchId) without checking the type.  XasinkStreamWriter checks what it is
    # fed (a Row would be an error, never a silent conversion): tests/test_spark_versions.py runs it on 4.0

    class StreamWriterBase(DataSourceStreamWriter, DataSourceArrowWriter):  # type: ignore[no-redef,misc]
        pass

else:  # 3.5: a stand-in (no format("xasink"))
    StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc]


def pyspark_version() -> str:
    return str(pyspark.__version__)


def no_data_source_message() -> str:
    return (
        f"format('xasink') needs the Python data source API of Spark 4.0 or later; this is PySpark "
        f"{pyspark.__version__}. On Spark 3.5 write with xasink.write(df, url=..., table=..., sink_id=..., "
        "batch_id=...) for a batch job and writeStream.foreachBatch(xasink.foreach_batch(url=..., table=..., "
        "sink_id=...)) for a stream (or xasink.transaction / foreach_batch_multi): they give the same "
        "exactly-once guarantees (docs/spark-versions.md)"
    )


def require_data_source() -> None:
    """``format("xasink")`` asked for on a Spark without the Python data source API: say what to use instead."""
    if not HAS_DATA_SOURCE:
        raise XasinkError(no_data_source_message())


def arrow_field(field: StructField) -> pa.Field:
    """The Arrow field Spark's Arrow writers hand a column as (timestamps labelled UTC); raises for a type
    Arrow cannot carry.  Before 4.1 PySpark's converter takes no time zone and labels TimestampType UTC."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(StructType([field]), timezone="UTC").field(0)
    return to_arrow_schema(StructType([field])).field(0)


def java_session_class(spark: Any) -> Any:
    """The JVM class of a classic session (``org.apache.spark.sql.classic.SparkSession`` since 4.0)."""
    from pyspark.sql import SparkSession

    get = getattr(SparkSession, "_get_j_spark_session_class", None)
    if get is not None:
        return get(spark._jvm)
    return spark._jvm.org.apache.spark.sql.SparkSession


__all__ = [
    "HAS_DATA_SOURCE",
    "HAS_STREAM_ARROW_WRITER",
    "SPARK_VERSION",
    "CaseInsensitiveDict",
    "DataSource",
    "DataSourceArrowWriter",
    "StreamWriterBase",
    "WriterCommitMessage",
    "arrow_field",
    "java_session_class",
    "no_data_source_message",
    "pyspark_version",
    "require_data_source",
]
