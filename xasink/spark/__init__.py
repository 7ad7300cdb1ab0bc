"""Spark adapters: the only modules that import pyspark."""

from xasink.spark.api import foreach_batch, register, write

__all__ = ["foreach_batch", "register", "write"]
