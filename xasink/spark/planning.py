"""The driver's plan of a write, made before any task runs: server checks, the table, the run guard, the shadow."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

from xasink.dialects.values import TargetPlan
from xasink.errors import PreflightError
from xasink.options import WriteOptions
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.liveness import ensure_keeper, spark_driver_process
from xasink.protocol.renamed_overwrite import drop_finished_witnesses
from xasink.spark.versions import arrow_field
from xasink.support.phases import phase, worker_started
from xasink.write_modes.spec import OVERWRITE, ApplySpec, spec_for
from xasink.write_modes.statements import check_predicate, ensure_shadow, session_schema, shadow_plan

if TYPE_CHECKING:
    import pyarrow as pa


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark's Arrow writer hands us, or a clear error naming a column it cannot take."""
    import pyarrow as pa

    fields = []
    for f in schema.fields:
        try:
            fields.append(arrow_field(f))
        except Exception:  # noqa: BLE001 - Spark raises assorted errors for types Arrow cannot carry
            raise PreflightError(
                f"column '{f.name}' has Spark type {f.dataType.simpleString()}, which xasink cannot "
                "write; cast it to a supported type first"
            ) from None
    return pa.schema(fields)


@dataclass(frozen=True)
class WritePlan:
    """What the driver decided before any task runs, shipped to every task."""

    target: TargetPlan
    log_id: str  # the decision log's identity: every branch's xid carries it
    guard: str | None = None  # the session lock this driver holds while its runs live (xasink.protocol.liveness)
    apply: ApplySpec | None = None  # overwrite / replaceWhere / change-data: tasks load the shadow table
    claimed: bool = False  # the driver took the batch over for this run: first task attempts skip their claim
    replay: bool = False  # the batch was committed before: every task writes nothing, without reading its rows
    slots_checked: bool = False  # the driver checked the free prepared-transaction slots against the branches


def prepare_write(
    options: WriteOptions,
    schema: StructType,
    branches: int | None,
    cap: int | None = None,
    told: Callable[[str], str] | None = None,
) -> WritePlan:
    """Driver-side: server checks, journal, table plan.  Everything that can be wrong fails here.

    ``branches``: how many branches the write opens, where the driver knows (a PreflightError when the free
    prepared-transaction slots cannot hold them); else ``cap``, the most it opens (``numPartitions``): where
    that fits the free slots no task needs to check, else each task checks before it loads (the write may
    have fewer partitions than the cap, so it is not refused here).  ``told``: before any task runs, what a
    database error of these checks is told (:func:`preflight_failed`); after (a commit's plan), it stays raw."""
    from xasink.write_modes.schema import plan_target

    worker_started("driver", sink=options.sink_id)
    coordinator = Coordinator(options, shared=True)
    try:
        with coordinator.policy.never_raw(told, lasting=PreflightError) if told else nullcontext():
            with phase("plan.preflight", sink=options.sink_id):
                coordinator.preflight(branches)
                checked = branches is not None or (cap is not None and coordinator.slots_hold(cap))
            source = arrow_schema(schema)
            flag = None
            if options.delete_flag_column is not None:
                flag, source = _split_flag(options.delete_flag_column, source)
            with phase("plan.target", sink=options.sink_id), coordinator.dialect.connect() as conn:
                target = plan_target(coordinator.dialect, conn, options, source)
                found = target.schema or coordinator.dialect.table_schema(conn, target.table)
                if found is not None and found != session_schema(conn):
                    # found through search_path past the default schema: the branches name it (PostgreSQL's COPY
                    # by ADBC names an unqualified table in the default schema), as its identity does
                    target = replace(target, schema=found)
            with phase("plan.keeper", sink=options.sink_id):
                log_id = coordinator.journal.log_id()
                driver = spark_driver_process()
                guard = ensure_keeper(coordinator.dialect, log_id, driver) if driver is not None else None
            apply = None
            if options.applies_at_commit:
                with phase("plan.shadow", sink=options.sink_id), coordinator.dialect.connect() as conn:
                    # an unqualified table is recorded in the schema this session finds it in, so the decision's
                    # identity, the table's apply lock and recovery's apply all name that table (search_path)
                    found = target.schema or coordinator.dialect.table_schema(conn, target.table)
                    apply = spec_for(options, target, log_id, found)
                    check_predicate(conn, apply)
                    ensure_shadow(coordinator.dialect, conn, apply)
                    swap = coordinator.dialect.rename_swap() if apply.kind == OVERWRITE else None
                    if swap is not None:
                        drop_finished_witnesses(coordinator.journal, swap, conn, options.sink_id, apply)
                target = shadow_plan(target, apply, flag)
            return WritePlan(target, log_id, guard, apply, slots_checked=checked)
    finally:
        coordinator.close()


RERUN = (
    "Run it again with the same sinkId and batchId once that is fixed: it finishes what an earlier run decided "
    "(and writes nothing more) or rolls back what one left prepared."
)


def preflight_failed(options: WriteOptions, streaming: bool = False) -> Callable[[str], str]:
    """What a write is told when its checks before any task (the log's record of the batch, the server, the
    table, its shadow) meet the database's error, not a finding of their own: this run wrote nothing, and
    whatever an earlier run of the batch left (committed, decided, prepared) is as it was."""

    def told(cause: str) -> str:
        checks = f"checking the server and table {options.table} before"
        if streaming:
            return (
                f"sink {options.sink_id}: {checks} a micro-batch's tasks failed ({cause}). This run wrote nothing "
                "and left nothing prepared; the query stops. Restart it once that is fixed: its next start "
                "finishes what earlier runs of the micro-batch left."
            )
        return (
            f"sink {options.sink_id} batch {options.batch_id}: {checks} the write failed ({cause}). This run "
            f"wrote nothing and left nothing prepared; what an earlier run of this batch left is as it was. {RERUN}"
        )

    return told


def planning_failed(options: WriteOptions) -> Callable[[str], str]:
    """What a write is told when its planning's log steps (the batch's check, the claim, recovery of earlier
    runs) fail: this run prepared nothing of the batch.  It must not say the batch holds nothing: an earlier
    run may have committed or decided it (a replay).  For ``RetryPolicy.never_raw``."""

    def told(cause: str) -> str:
        return (
            f"sink {options.sink_id} batch {options.batch_id}: reading the decision log or finishing the "
            f"sink's earlier batches before the write failed ({cause}). This run prepared nothing of this "
            f"batch; what earlier runs decided stays decided. {RERUN}"
        )

    return told


def _split_flag(name: str, source: pa.Schema) -> tuple[str, pa.Schema]:
    """The delete flag's DataFrame column (matched without case) and the columns the table takes."""
    import pyarrow as pa

    found = [f for f in source if f.name.lower() == name.lower()]
    if len(found) != 1:
        raise PreflightError(f"option 'deleteFlagColumn': '{name}' is not a column of the DataFrame")
    if not pa.types.is_boolean(found[0].type):
        raise PreflightError(
            f"option 'deleteFlagColumn': column '{found[0].name}' is {found[0].type}, not boolean; derive it, "
            "e.g. col('op') == 'd'"
        )
    return found[0].name, pa.schema([f for f in source if f.name != found[0].name])
