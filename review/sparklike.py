"""batch_direct as the Spark data source orders it: plan (ensure_shadow), then recover(upto=batch), then branches, commit."""
from common import *
from tests.modes_driver import _direct_plan, write_branches

def spark_like(url, table, sink_id, batch_id, columns, partitions, mode="overwrite", **options):
    import pyarrow as pa
    from xasink.protocol.coordinator import Coordinator
    from xasink.protocol.liveness import InProcessGuard
    opts, plan, arrow = _direct_plan(url, table, sink_id, batch_id, columns, mode, len(partitions), options)
    coordinator = Coordinator(opts)
    guard = InProcessGuard(coordinator.dialect, plan.log_id)
    try:
        coordinator.recover(upto=batch_id)
        batches = [pa.RecordBatch.from_pydict({n: [r[i] for r in rows] for i, n in enumerate(columns)}, schema=arrow) for rows in partitions]
        outcomes = write_branches(opts, plan.target, batch_id, batches, guard.name, log_id=plan.log_id)
        return coordinator.commit(batch_id, outcomes, apply=plan.apply)
    finally:
        guard.close()
        coordinator.close()
