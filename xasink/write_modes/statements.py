"""Writes that replace or change existing rows: overwrite, replaceWhere and change-data apply.

Deleting old rows in one prepared branch while other branches insert new rows with the same keys deadlocks
(the insert waits for the prepared delete, the delete's commit waits for the decision, the decision waits for
the insert).  So the branches of such a write load the batch into a *shadow table* (the target's columns,
no constraints, each row tagged with its batch id), and after the decision, once the branches are committed
into it, one local transaction on the target's database

1. marks the batch committed in the decision log (first: a second applier waits on that row, finds nothing),
2. replaces the target's rows from the shadow (DELETE + INSERT .. SELECT, or the change-data statements),
3. deletes the batch's rows from the shadow.

Readers see the old rows or the new ones, never an empty table or a mix.  Recovery redoes the transaction for
a decided batch that is not marked committed.  An apply that fails for a reason no retry can fix (a constraint
of the target, a batch row outside replaceWhere) withdraws the decision: the target keeps its rows.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.dialects.rendering import insert_selected
from xasink.dialects.type_text import reflected_columns, reflected_table
from xasink.dialects.values import SHADOW_ROW_COLUMN, SHADOW_TAG_COLUMN, TargetPlan
from xasink.errors import ApplyError, PreflightError
from xasink.options import TableName
from xasink.support.faults import fault
from xasink.write_modes.changes import apply_changes, check_changes_table
from xasink.write_modes.shadow import DecidedRows, of_branches, shadow_table
from xasink.write_modes.spec import (
    APPEND,
    BATCH_COLUMN,
    BRANCH_COLUMN,
    CHANGES,
    OVERWRITE,
    REPLACE_WHERE,
    ApplySpec,
    shadow_name,
)
from xasink.write_modes.swap import swap_overwrite

log = logging.getLogger(__name__)


def apply_lock_name(spec: ApplySpec, default_schema: str | None) -> str:
    """The lock serializing the applies of one target, whatever sink writes it: two sinks' applies of one table
    never interleave (their order of decision is kept by the decision's check: DESIGN invariant 12).  An
    unqualified table is named in the session's ``default_schema`` (:func:`session_schema`), as the decision
    log's target identity names it: ``t`` and ``public.t`` are one lock, not two that let two sinks decide at once."""
    schema = spec.schema or default_schema or ""
    key = hashlib.blake2b(f"{schema}|{spec.table}".encode(), digest_size=8).hexdigest()
    return f"xasink.write_modes.statements.{key}"


def session_schema(conn: Connection) -> str | None:
    """The connection's default schema (PostgreSQL's current schema, MariaDB's database), as found at connect:
    no statement is sent, so a transaction begun after it is the caller's."""
    found = sa.inspect(conn).default_schema_name
    return str(found) if found else None


def check_predicate(conn: Connection, spec: ApplySpec) -> None:
    """Run replaceWhere against the target once, reading no row: a typo fails here, not after the decision."""
    if spec.predicate is None:
        return
    target = sa.table(spec.table, *(sa.column(c) for c in spec.columns), schema=spec.schema)
    try:
        conn.execute(sa.select(sa.literal(1)).select_from(target).where(_predicate(spec)).limit(0))
    except sa.exc.DBAPIError as exc:
        conn.rollback()
        raise PreflightError(
            f"option 'replaceWhere' ({spec.predicate!r}) is not a valid condition on table "
            f"{spec.schema + '.' if spec.schema else ''}{spec.table}: {_first_line(exc)}"
        ) from None
    conn.rollback()


def ensure_shadow(dialect: Dialect, conn: Connection, spec: ApplySpec) -> None:
    """Create the shadow (the target's column types, no constraints), or make it anew when it no longer
    matches: only between batches, when recovery has applied what it held.  Also the tombstone table of a
    change-data sink with deletes and a sequence."""
    dialect.check_apply(conn)  # first: the apply itself could not run (nothing is made or decided then)
    target = reflected_table(conn, spec.table, spec.schema)
    columns: dict[str, Any] = {c.name: {"type": c.type} for c in target.c}
    dialect.name_unknown_types(conn, spec.schema, spec.table, columns)  # (point, xml: not NullType in the shadow)
    types = {name: column["type"] for name, column in columns.items()}
    want = shadow_table(spec, types, dialect.keyed_shadow)
    collations = dialect.column_collations(conn, spec.schema, spec.table)  # the target's, read once
    insp = sa.inspect(conn)
    if insp.has_table(spec.shadow, schema=spec.schema):
        have = [c["name"] for c in reflected_columns(insp, spec.shadow, spec.schema)]
        drift = collation_drift(dialect, conn, spec, spec.shadow, collations)
        conn.rollback()
        if have == [c.name for c in want.c] and drift:  # made by an earlier xasink: mend it in place
            # ALTER keeps every row: a decided batch not applied yet, or one whose branches are still prepared
            # (invisible to a count: dropping the "empty" table once they commit would lose the batch); the
            # shadow's own keys are xasink's columns, so no two of its rows can collide under the new collation
            advice = "If an earlier run's branches are still prepared in it, run 'xasink recover', then write again"
            _mend_collations(dialect, conn, spec, want, {c: collations[c] for c in drift}, advice)
        elif have != [c.name for c in want.c]:
            log.info("shadow table %s no longer matches %s: making it anew", spec.shadow, spec.table)
            held = _branches_into(dialect, conn, spec.shadow)
            if held:  # their rows are invisible to a count, and a DROP would wait for them, then lose them
                raise PreflightError(
                    f"the shadow table {spec.shadow} of {spec.table} no longer matches the table's columns, and "
                    f"{held} prepared branch(es) of an earlier run of this sink may hold a decided batch in it: "
                    "run 'xasink recover' with the table as it was, then write again"
                )
            with conn.begin():
                pending = conn.execute(sa.select(sa.func.count()).select_from(want)).scalar()
                if pending and have == [c.name for c in want.c if c.name not in (SHADOW_TAG_COLUMN, SHADOW_ROW_COLUMN)]:
                    raise PreflightError(  # an upgrade, not a changed target: never suggest dropping a decision
                        f"the shadow table {spec.shadow} of {spec.table} holds {pending} rows of a decided batch "
                        "not applied yet, in the layout of an earlier xasink (before the MariaDB/MySQL shadow was "
                        "keyed by branch and row): run 'xasink recover' to apply it, then write again"
                    )
                if pending:
                    raise PreflightError(
                        f"the shadow table {spec.shadow} of {spec.table} holds {pending} rows of a batch not "
                        "applied yet, but its columns no longer match the target's: run 'xasink recover' with the "
                        "table as it was, or drop the shadow table if that batch must be given up"
                    )
                want.drop(conn)
            _create(dialect, conn, want, target)
    else:
        conn.rollback()
        _create(dialect, conn, want, target)
    if spec.tombstones is not None:
        tombstones = _tombstone_table(spec, types)
        _create(dialect, conn, tombstones, target)
        drift = collation_drift(dialect, conn, spec, spec.tombstones, collations)
        conn.rollback()
        if drift:  # made by an earlier xasink: its keys take the target's collation, the deleted keys stay
            advice = (
                "If it names a duplicate entry, two deleted keys are one key under the table's collation: delete "
                f"the older of them from {spec.tombstones}, then write again"
            )
            _mend_collations(dialect, conn, spec, tombstones, {c: collations[c] for c in drift}, advice)
    if spec.kind == CHANGES:
        check_changes_table(dialect, conn, spec, want)
    if spec.kind in (OVERWRITE, REPLACE_WHERE):
        in_place_keys(dialect, conn, spec)  # a table others refer to is replaced in place, or refused here
        conn.rollback()


def _branches_into(dialect: Dialect, conn: Connection, shadow: str) -> int:
    """The prepared branches of xasink that write into ``shadow`` (one shadow per decision log and sink)."""
    prefix = shadow[: shadow.rindex("sh_")]
    try:
        found = dialect.list_prepared(conn)
    except sa.exc.DBAPIError:  # a role that may not list them (MySQL 8 without XA_RECOVER_ADMIN)
        conn.rollback()
        return 0
    conn.rollback()
    return sum(1 for p in found if p.xid is not None and shadow_name(prefix, p.xid.log_id, p.xid.sink_id) == shadow)


def _mend_collations(
    dialect: Dialect, conn: Connection, spec: ApplySpec, table: sa.Table, want: dict[str, str], advice: str
) -> None:
    """Give the drifted columns of a table an earlier xasink made the target's collations (``want``: column to
    collation), keeping its rows."""
    log.info("%s: columns %s take the collation of %s", table.name, ", ".join(want), spec.table)
    try:
        dialect.modify_columns(conn, table, want)
    except sa.exc.DBAPIError as exc:
        conn.rollback()
        raise PreflightError(
            f"table {table.name} beside {spec.table}, made by an earlier xasink, must take the table's collation, "
            f"but that failed: {_first_line(exc)}. {advice}"
        ) from None
    conn.commit()


def collation_drift(dialect: Dialect, conn: Connection, spec: ApplySpec, table: str, want: dict[str, str]) -> list[str]:
    """The columns of ``table`` (one xasink made) whose collation is not ``want``'s (the target's) same column's."""
    have = dialect.column_collations(conn, spec.schema, table)
    return [c for c, collation in have.items() if c in want and collation != want[c]]


def _create(dialect: Dialect, conn: Connection, want: sa.Table, target: sa.Table) -> None:
    """Create ``want`` with the target's table defaults (MariaDB/MySQL: a string key compares as the target's)."""
    md = sa.MetaData(schema=want.schema)
    cols = (
        sa.Column(c.name, c.type, nullable=c.nullable, primary_key=c.primary_key, autoincrement=False) for c in want.c
    )
    table = sa.Table(want.name, md, *cols, **dialect.table_kwargs(like=target))
    try:
        with conn.begin():
            table.create(conn, checkfirst=True)
    except sa.exc.DBAPIError as exc:
        conn.rollback()
        if sa.inspect(conn).has_table(want.name, schema=want.schema):
            conn.rollback()
            return  # created concurrently
        raise PreflightError(
            f"cannot create xasink's table {want.name} beside the target: {_first_line(exc)}. Overwrite, "
            "replaceWhere and change-data writes load the batch there first; grant CREATE on the table's schema"
        ) from None
    conn.rollback()


def _tombstone_table(spec: ApplySpec, types: dict[str, Any]) -> sa.Table:
    """One row per deleted key, with the delete's sequence: an older change of the key arriving later is
    ignored (the row is gone, so nothing else remembers how new the delete was)."""
    assert spec.tombstones is not None and spec.sequence is not None
    cols = [sa.Column(k, types[k], primary_key=True, autoincrement=False) for k in spec.keys]
    cols.append(sa.Column(spec.sequence, types[spec.sequence], nullable=False))
    return sa.Table(spec.tombstones, sa.MetaData(schema=spec.schema), *cols)


def shadow_plan(plan: TargetPlan, spec: ApplySpec, flag_source: str | None) -> TargetPlan:
    """The tasks' plan: the batch's columns (plus the delete flag and the batch tag) into the shadow."""
    import pyarrow as pa

    fields = list(plan.arrow_schema)
    sources = list(plan.source_names)
    if spec.flag is not None:
        fields.append(pa.field(spec.flag, pa.bool_(), nullable=True))
        sources.append(flag_source or spec.flag)
    fields.append(pa.field(BATCH_COLUMN, pa.int64(), nullable=False))
    sources.append(BATCH_COLUMN)
    fields.append(pa.field(BRANCH_COLUMN, pa.string(), nullable=False))
    sources.append(BRANCH_COLUMN)
    required = spec.keys + ((spec.sequence,) if spec.sequence else ())
    return TargetPlan(
        spec.schema,  # where the table is, as the apply names it
        spec.shadow,
        pa.schema(fields),
        tuple(sources),
        batch_column=BATCH_COLUMN,
        branch_column=BRANCH_COLUMN,
        row_column=SHADOW_ROW_COLUMN,  # (filled where the dialect keys its shadow by it)
        required=required,
        server_casts=plan.server_casts,  # the shadow has the target's column types
        case_folded=plan.case_folded,
        case_twins=plan.case_twins,
    )


def _predicate(spec: ApplySpec) -> sa.ColumnElement[bool]:
    # the job author's SQL, run as written (documented: never build it from data); literal_column keeps a
    # ':' or '%' in it from being read as a parameter
    return sa.literal_column(f"({spec.predicate})", sa.Boolean())


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _clear(
    dialect: Dialect, conn: Connection, shadow: sa.TableClause, mine: sa.ColumnElement[bool], legacy: bool
) -> None:
    if legacy:  # (no branch column, no index on it)
        conn.execute(sa.delete(shadow).where(mine))
    else:
        dialect.clear_shadow(conn, shadow, mine)


def in_place_keys(dialect: Dialect, conn: Connection, spec: ApplySpec) -> tuple[str, ...] | None:
    """The primary key by which an overwrite replaces the rows of a table other tables refer to, in place (None:
    nobody refers to it, DELETE + INSERT).  Deleting every row would cascade into, null or fail on the
    referencing rows, and an overwrite changes no other table; in place, only the rows whose keys are gone
    are deleted, with exactly the effect the user's own DELETE of them would have.  A referenced table
    without a primary key cannot be replaced in place: :class:`PreflightError` naming the referencing tables."""
    referencing = dialect.referencing_tables(conn, spec.schema, spec.table)
    if not referencing:
        return None
    keys = tuple(sa.inspect(conn).get_pk_constraint(spec.table, schema=spec.schema).get("constrained_columns") or ())
    where = f"{spec.schema}.{spec.table}" if spec.schema else spec.table
    if not keys:
        raise PreflightError(
            f"cannot overwrite {where}: table {', '.join(referencing)} refers to it by a foreign key, and without "
            "a primary key its rows cannot be replaced in place (deleting them all would change or fail on "
            "the referencing rows). Give the table a primary key, or drop the foreign key"
        )
    missing = [k for k in keys if k not in spec.columns]
    if missing:
        raise PreflightError(
            f"cannot overwrite {where}: table {', '.join(referencing)} refers to it by a foreign key, so its rows "
            f"are replaced in place by the primary key, but the DataFrame has no column {', '.join(missing)}"
        )
    return keys


def _replace_in_place(
    dialect: Dialect,
    conn: Connection,
    spec: ApplySpec,
    keys: tuple[str, ...],
    target: sa.TableClause,
    shadow: sa.TableClause,
    mine: sa.ColumnElement[bool],
) -> int:
    """Delete the rows (in the replaced scope) whose keys are gone, update the rows whose keys stay, insert the
    new keys: the referencing tables see only the deletes of the gone keys.  Rows written."""
    names = list(spec.columns)
    twice = conn.execute(
        sa.select(*(shadow.c[k] for k in keys))
        .where(mine)
        .group_by(*(shadow.c[k] for k in keys))
        .having(sa.func.count() > 1)
        .limit(1)
    ).first()
    if twice is not None:  # (DELETE + INSERT fails on it as a duplicate key: so does this)
        raise ApplyError(f"key ({', '.join(map(str, twice))}) appears more than once in the batch")
    same_key = sa.and_(*(target.c[k] == shadow.c[k] for k in keys))
    scope: sa.ColumnElement[bool] = sa.true()
    if spec.kind == REPLACE_WHERE:
        scope = _predicate(spec)
        # a batch key held by a row outside the condition: DELETE + INSERT fails on it as a duplicate key
        outside = conn.execute(
            sa.select(*(target.c[k] for k in keys))
            .where(~sa.func.coalesce(scope, False), sa.exists().where(same_key, mine))
            .limit(1)
        ).first()
        if outside is not None:
            raise ApplyError(
                f"key ({', '.join(map(str, outside))}) of the batch belongs to a row that does not match "
                f"replaceWhere ({spec.predicate!r}): it would be there twice"
            )
    batch_keys = sa.select(*(shadow.c[k].label(f"xasink_key{i}_") for i, k in enumerate(keys))).where(mine)
    dialect.delete_missing(conn, target, list(keys), batch_keys, scope)
    written = 0
    rest = [c for c in names if c not in keys]
    if rest:
        update = sa.update(target).values({c: shadow.c[c] for c in rest}).where(same_key, mine)
        written += max(conn.execute(update).rowcount or 0, 0)
    new = sa.select(*(shadow.c[c] for c in names)).where(mine, ~sa.exists().where(same_key))
    return written + insert_selected(conn, target, names, new)


def apply_statements(dialect: Dialect, conn: Connection, spec: ApplySpec, batch_id: int, decided: DecidedRows) -> int:
    """Replace (append to, merge into) the target's rows from the shadow's rows of the ``decided`` branches,
    inside the caller's transaction; rows written."""
    names = list(spec.columns)
    target = sa.table(spec.table, *(sa.column(c) for c in names), schema=spec.schema)
    branches = decided.branches
    shadow_cols = names + ([spec.flag] if spec.flag else []) + decided.tag_columns()
    shadow = sa.table(spec.shadow, *(sa.column(c) for c in shadow_cols), schema=spec.schema)
    mine = of_branches(shadow, batch_id, branches)
    if spec.kind in (OVERWRITE, REPLACE_WHERE):
        if spec.kind == REPLACE_WHERE and spec.check_predicate:
            # the shadow under the target's name: a condition naming its columns as table.column reads the batch
            batch = shadow.alias(spec.table)
            outside = conn.execute(
                sa.select(sa.func.count())
                .select_from(batch)
                .where(of_branches(batch, batch_id, branches), ~sa.func.coalesce(_predicate(spec), False))
            ).scalar()
            if outside:
                raise ApplyError(
                    f"{outside} rows of the batch do not match replaceWhere ({spec.predicate!r}): they would "
                    "not be replaced by the next write with the same condition. Filter the DataFrame by the "
                    "same condition, or set replaceWhereCheck=false to write them anyway"
                )
        dialect.lock_for_overwrite(conn, spec.schema, spec.table)
        try:
            keys = in_place_keys(dialect, conn, spec)
        except PreflightError as exc:  # a foreign key made since the write was planned: nothing is visible
            raise ApplyError(str(exc)) from None
        if keys is not None:
            written = _replace_in_place(dialect, conn, spec, keys, target, shadow, mine)
            fault("driver.apply_statements", batch=batch_id)
            _clear(dialect, conn, shadow, mine, branches is None)
            return written
        swapped = swap_overwrite(dialect, conn, spec, shadow, mine)
        if swapped is not None:  # the new storage holds the batch: the shadow is cleared as after any apply
            fault("driver.apply_statements", batch=batch_id)
            _clear(dialect, conn, shadow, mine, branches is None)
            return swapped
        delete = sa.delete(target)
        if spec.kind == REPLACE_WHERE:
            delete = delete.where(_predicate(spec))
        conn.execute(delete)
        written = insert_selected(conn, target, names, sa.select(*(shadow.c[c] for c in names)).where(mine))
    elif spec.kind == APPEND:
        written = insert_selected(conn, target, names, sa.select(*(shadow.c[c] for c in names)).where(mine))
    else:
        written = apply_changes(dialect, conn, spec, target, shadow, mine)
    fault("driver.apply_statements", batch=batch_id)
    _clear(dialect, conn, shadow, mine, branches is None)
    return written


def clear_batch(dialect: Dialect, conn: Connection, spec: ApplySpec, batch_id: int, decided: DecidedRows) -> None:
    """Delete a batch's rows from the shadow: its decision withdrawn (its apply can never succeed), or applied."""
    shadow = sa.table(spec.shadow, *(sa.column(c) for c in decided.tag_columns()), schema=spec.schema)
    _clear(dialect, conn, shadow, of_branches(shadow, batch_id, decided.branches), decided.branches is None)


def table_name(spec: ApplySpec) -> TableName:
    return TableName(spec.table, spec.schema)
