"""Decimals as plain text, the way the servers print a numeric and Spark's JDBC writer's drivers send one.

Arrow writes a decimal as Java's ``BigDecimal.toString`` does: with an exponent once it is below 1e-6 in scale
(``0E-18``, ``1E-18``).  A numeric column reads either the same, but a text column keeps what it is given, where
Spark's JDBC writer stores ``0.000000000000000000`` (PostgreSQL's numeric output; MariaDB's driver sends the
plain digits)."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc


def decimal_text(arr: pa.Array, kind: pa.DataType | None = None) -> pa.Array:
    """Every decimal's digits without an exponent, as ``kind`` (string by default); a null stays null."""
    kind = kind or pa.string()
    out = arr.cast(kind)
    if not may_have_exponent(arr.type):
        return out
    exponent = pc.match_substring(out, "E").fill_null(False)
    if not pc.any(exponent).as_py():
        return out
    plain = pa.array([format(Decimal(d), "f") for d in pc.filter(arr, exponent).to_pylist()], kind)
    return pc.replace_with_mask(out, exponent, plain)


def may_have_exponent(t: pa.DataType) -> bool:
    """Whether Arrow's text of this decimal type can hold an exponent: only past six digits of scale."""
    return pa.types.is_decimal(t) and t.scale > 6
