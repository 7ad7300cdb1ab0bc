"""The shadow table's layout: its columns (the target's, the batch's tags, on MariaDB/MySQL its key) and which of
its rows an apply reads (only the decided branches')."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.dialects.values import SHADOW_ROW_COLUMN, SHADOW_TAG_COLUMN, branch_tag
from xasink.protocol.xid import Xid
from xasink.write_modes.spec import BATCH_COLUMN, BRANCH_COLUMN, ApplySpec


def shadow_table(spec: ApplySpec, types: dict[str, Any], keyed: bool) -> sa.Table:
    """The target's columns (no constraints: a bad row fails the apply, not the load) and the batch's tags."""

    def col(name: str, type_: Any, key: bool = False) -> sa.Column[Any]:
        return sa.Column(name, type_, nullable=not key, primary_key=key and keyed, autoincrement=False)

    cols = [col(c, types.get(c, sa.types.NullType())) for c in spec.columns]
    if spec.flag is not None:
        cols.append(col(spec.flag, sa.Boolean()))
    cols += [col(BATCH_COLUMN, sa.BigInteger(), True), sa.Column(BRANCH_COLUMN, sa.String(64), nullable=False)]
    if keyed:  # the apply finds its branches' rows by the clustered key, scanning (and locking) no other run's
        cols += [col(SHADOW_TAG_COLUMN, sa.BigInteger(), True), col(SHADOW_ROW_COLUMN, sa.BigInteger(), True)]
    return sa.Table(spec.shadow, sa.MetaData(schema=spec.schema), *cols)


def of_branches(shadow: sa.FromClause, batch_id: int, branches: Sequence[str] | None) -> sa.ColumnElement[bool]:
    """The shadow's rows of the decided branches: never another run's (prepared, or rolled back later).
    ``branches`` None: a shadow made before rows carried their branch (all the batch's rows)."""
    if branches is None:
        return shadow.c[BATCH_COLUMN] == batch_id
    mine = sa.and_(shadow.c[BATCH_COLUMN] == batch_id, shadow.c[BRANCH_COLUMN].in_(sorted(branches)))
    if SHADOW_TAG_COLUMN in shadow.c:  # a keyed shadow: a range of its key per branch
        mine = sa.and_(mine, shadow.c[SHADOW_TAG_COLUMN].in_(sorted({branch_tag(b) for b in branches})))
    return mine


@dataclass(frozen=True)
class DecidedRows:
    """How an apply finds a decision's rows in the shadow, as the shadow (perhaps an earlier xasink's) is laid
    out: read once per apply."""

    branches: tuple[str, ...] | None  # the decided branches' bquals; None: rows that carry no branch (all the batch's)
    keys: tuple[str, ...] = ()  # the shadow's key columns, when it is keyed (the apply goes by that key)

    def tag_columns(self) -> list[str]:
        """The shadow's columns beside the target's (and the delete flag) that the apply names."""
        return [BATCH_COLUMN] + ([BRANCH_COLUMN, *self.keys] if self.branches is not None else [])


def decided_rows(dialect: Dialect, conn: Connection, spec: ApplySpec, xids: Sequence[Xid]) -> DecidedRows:
    """The decision ``xids``'s rows in the shadow: a shadow made by an earlier xasink has no branch column (a
    batch decided before an upgrade is applied or withdrawn as it was written), or no key."""
    have = {c["name"] for c in sa.inspect(conn).get_columns(spec.shadow, schema=spec.schema)}
    if BRANCH_COLUMN not in have:
        return DecidedRows(None)
    keyed = dialect.keyed_shadow and SHADOW_ROW_COLUMN in have
    return DecidedRows(tuple(x.bqual for x in xids), (SHADOW_TAG_COLUMN, SHADOW_ROW_COLUMN) if keyed else ())
