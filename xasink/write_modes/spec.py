"""What a write mode's apply does, as a value recorded with the decision: the kind, the target, its shadow.

Recovery finishes a decided batch from the log alone, so the spec travels in the decision's recorded target
(:meth:`ApplySpec.from_target`); :mod:`xasink.write_modes.statements` runs it.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from typing import Any

from xasink.dialects.values import TargetPlan
from xasink.errors import PreflightError
from xasink.options import WriteOptions

BATCH_COLUMN = "xasink_batch_"  # the shadow's column tagging each row with its batch id
BRANCH_COLUMN = "xasink_branch_"  # ... and with its branch (the xid's bqual): an apply reads only its decided ones
OVERWRITE = "overwrite"
REPLACE_WHERE = "replaceWhere"
CHANGES = "changes"
APPEND = "append"  # visibility="batch": the batch's rows inserted in one transaction


@dataclass(frozen=True)
class ApplySpec:
    """How a decided batch reaches its target from the shadow; recorded with the decision, so recovery can
    finish it from the log alone."""

    kind: str  # OVERWRITE, REPLACE_WHERE, CHANGES or APPEND
    schema: str | None
    table: str
    shadow: str
    columns: tuple[str, ...]  # the target's columns the batch writes, as the shadow holds them
    keys: tuple[str, ...] = ()
    predicate: str | None = None
    check_predicate: bool = True
    flag: str | None = None
    sequence: str | None = None
    tombstones: str | None = None  # change-data with deletes and a sequence: the deleted keys' table

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ApplySpec:
        fields = dict(d)
        for name in ("columns", "keys"):
            fields[name] = tuple(fields.get(name) or ())
        return cls(**fields)

    @classmethod
    def from_target(cls, target: str | None) -> ApplySpec | None:
        """The spec a decision's recorded target carries, or None for a plain append or upsert."""
        if not target:
            return None
        try:
            spec = json.loads(target).get("apply")
        except (ValueError, AttributeError):
            return None
        return cls.from_dict(spec) if spec else None

    def describe(self) -> str:
        where = f"{self.schema}.{self.table}" if self.schema else self.table
        if self.kind == REPLACE_WHERE:
            return f"replace the rows of {where} matching {self.predicate!r}"
        if self.kind == CHANGES:
            return f"apply changes to {where}"
        if self.kind == APPEND:
            return f"append to {where}"
        return f"overwrite {where}"


def shadow_name(prefix: str, log_id: str, sink_id: str) -> str:
    """One shadow per decision log and sink: it only ever holds the sink's decided, unapplied batches."""
    return f"{prefix}sh_{zlib.crc32(f'{log_id}:{sink_id}'.encode()):08x}"


def tombstone_name(prefix: str, log_id: str, sink_id: str) -> str:
    return f"{prefix}tb_{zlib.crc32(f'{log_id}:{sink_id}'.encode()):08x}"


def spec_for(options: WriteOptions, plan: TargetPlan, log_id: str, schema: str | None = None) -> ApplySpec:
    """The apply step of a write, checked against the planned target (before any branch opens); ``schema``:
    where the session found an unqualified table (:meth:`Dialect.table_schema`)."""
    columns = tuple(f.name for f in plan.arrow_schema)
    kind = _kind(options)
    sequence = options.sequence_column
    if sequence is not None:
        match = [c for c in columns if c.lower() == sequence.lower()]
        if not match:
            raise PreflightError(
                f"option 'sequenceColumn': '{sequence}' is not a column being written to {options.table}; "
                "the sequence is stored with each row so later changes can be compared with it"
            )
        sequence = match[0]
    return ApplySpec(
        kind=kind,
        schema=plan.schema or schema,
        table=plan.table,
        shadow=shadow_name(options.journal_prefix, log_id, options.sink_id),
        columns=columns,
        keys=plan.upsert_keys,
        predicate=options.replace_where,
        check_predicate=options.replace_where_check,
        flag=options.delete_flag_column,
        sequence=sequence,
        tombstones=(
            tombstone_name(options.journal_prefix, log_id, options.sink_id)
            if sequence is not None and options.delete_flag_column is not None
            else None
        ),
    )


def _kind(options: WriteOptions) -> str:
    """An upsert with visibility="batch" is a change-data apply without deletes: rows merged by key."""
    if options.mode == "overwrite":
        return REPLACE_WHERE if options.replace_where else OVERWRITE
    if options.change_data or options.upsert_key_columns:
        return CHANGES
    return APPEND
