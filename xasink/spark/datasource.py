"""The "xasink" PySpark data source: batch and streaming Arrow writers.

``writer()``/``streamWriter()`` run on the driver (in a Python worker the JVM
starts): options are validated and the target planned there, before any task
runs.  Tasks write one branch each and return its xid in the commit message;
``commit()`` hands the messages to the coordinator.  The writer objects keep
no state between calls beyond what was decided in ``writer()``.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from dataclasses import replace
from types import FrameType
from typing import Any

from pyspark.sql.types import StructType

from xasink.errors import OptionError
from xasink.options import WriteOptions, parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.xid import new_run_nonce
from xasink.spark.batch_writer import XasinkBatchWriter
from xasink.spark.planning import planning_failed, preflight_failed, prepare_write
from xasink.spark.stream_writer import XasinkStreamWriter
from xasink.spark.txwrite import TX_URL_OPTION, prepare_tx_write, tx_write
from xasink.spark.versions import DataSource
from xasink.spark.worker_log import told, worker_logging
from xasink.support import notices
from xasink.support.phases import phase

# the Python worker in which Spark calls streamWriter() again to commit or abort a micro-batch; Spark tells
# the data source nothing else about why it is called, and this call needs no plan for an append
STREAM_COMMIT_MODULE = "pyspark.sql.worker.python_streaming_sink_runner"
# internal option: xasink.write() names the run, so it can tell its own decision from a concurrent writer's
RUN_OPTION = "xasink.run"
# internal option: foreach_batch names the streaming query when its tasks cannot (Spark Connect)
QUERY_OPTION = "xasink.query"
# internal option: xasink.write counted the DataFrame's partitions (the most branches it opens) without a job
BRANCHES_OPTION = "xasink.branches"


def _called_by(frame: FrameType | None, module: str) -> bool:
    """Whether ``frame`` runs code of ``module``, whether Spark ran it with ``python -m`` or imported it."""
    if frame is None:
        return False
    spec = frame.f_globals.get("__spec__")
    return frame.f_globals.get("__name__") == module or getattr(spec, "name", None) == module


def _committed(coordinator: Coordinator, batch_id: int) -> bool:
    with coordinator.journal.dialect.connect(autocommit=True) as conn:  # reads only
        record = coordinator.journal.get(conn, coordinator.sink_id, batch_id)
    return record is not None and record.committed


class XasinkDataSource(DataSource):
    """``df.write.format("xasink")``: all partitions of a batch commit, or none."""

    @classmethod
    def name(cls) -> str:
        return "xasink"

    def _options(self, streaming: bool) -> WriteOptions:
        opts: dict[str, Any] = {k: v for k, v in self.options.items() if not k.lower().startswith("xasink.")}
        return parse_options(opts, streaming=streaming)

    def _run(self) -> str | None:
        run = self.options.get(RUN_OPTION)
        if run is not None and not re.fullmatch(r"[0-9a-f]{8}", str(run)):
            raise OptionError(f"option '{RUN_OPTION}' is internal to xasink.write()")
        return str(run) if run is not None else None

    def _branches(self) -> tuple[int | None, int | None]:
        """The branches of this write as xasink.write counted them (else None), and ``numPartitions``, the
        most it opens (Spark tells a data source nothing of its input's partitions)."""
        cap = self._options(streaming=False).num_partitions
        counted = self.options.get(BRANCHES_OPTION)
        if counted is None:
            return None, cap
        if not re.fullmatch(r"\d{1,9}", str(counted)):
            raise OptionError(f"option '{BRANCHES_OPTION}' is internal to xasink.write()")
        return int(counted), cap

    def writer(self, schema: StructType, overwrite: bool) -> XasinkBatchWriter:
        started = time.time()  # the batch's figures count from here (the INFO line's total)
        options = self._options(streaming=False).with_mode("overwrite" if overwrite else "append")
        tx = tx_write(self.options)
        if tx is not None and options.applies_at_commit:
            raise OptionError(
                "overwrite, replaceWhere, change-data writes (deleteFlagColumn, sequenceColumn) and "
                "visibility='batch' are not supported inside xasink.transaction() yet; write them with "
                "xasink.write() or format('xasink')"
            )
        if tx is not None:  # inside xasink.transaction(): it claimed the batch and swept; plan and write only
            run = self._run()
            if run is None:
                raise OptionError(f"option '{TX_URL_OPTION}' is internal to xasink.transaction()")
            return XasinkBatchWriter(options, prepare_tx_write(options, schema, tx), run, tx)
        path = self.options.get(notices.NOTICES_OPTION)
        given = {k.lower() for k in self.options}
        query = self.options.get(QUERY_OPTION)
        with told(path):
            branches, cap = self._branches()
            plan = prepare_write(options, schema, branches, cap, told=preflight_failed(options))
            run = self._run() or new_run_nonce()
            coordinator = Coordinator(options, shared=True)
            try:
                with (
                    coordinator.policy.never_raw(planning_failed(options)),
                    phase("plan.recover", sink=options.sink_id, batch=options.batch_id),
                ):
                    # another target's (or query's) batch, or one the log forgot: refuse now
                    replay = coordinator.check_batch(options.batch_id, query)
                    # take the batch over here, once, instead of in every task; then finish what earlier runs
                    # decided and roll back their branches of this batch (superseded now, so dead to recovery)
                    claimed = coordinator.claim(options.batch_id, run, plan.guard)
                    coordinator.recover(upto=options.batch_id, run=run)
                    # committed before (a replay of its target; a committed batch stays so): its tasks load nothing
                    committed = replay and not claimed and _committed(coordinator, options.batch_id)
            finally:
                coordinator.close()
        return XasinkBatchWriter(
            options,
            replace(plan, claimed=claimed, replay=committed),
            run,
            notices_path=path,
            sink_without_batch="sinkid" in given and "batchid" not in given,
            query=str(query) if query is not None else None,
            started=started,
        )

    def streamWriter(self, schema: StructType, overwrite: bool) -> XasinkStreamWriter:  # noqa: N802 - Spark's name
        worker_logging(logging.INFO)
        # outputMode("complete"): every micro-batch is the whole result, replacing the table's rows
        options = self._options(streaming=True).with_mode("overwrite" if overwrite else "append")
        writer = XasinkStreamWriter(options, schema)
        if not _called_by(sys._getframe(1), STREAM_COMMIT_MODULE):
            writer.plan_before_tasks()  # a wrong option or a missing table fails here, before any task
        return writer
