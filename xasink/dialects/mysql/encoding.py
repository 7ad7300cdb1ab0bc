"""Rows as LOAD DATA text: tab-separated, ``\\N`` for NULL, backslash escapes, binary as hex; or as Python
tuples for multi-row INSERT.  Vectorised with pyarrow: the encoding is most of a branch's client CPU.

Arrow's CSV writer joins the fields (tab, no quoting, ``\\N``): it formats a number, date or wall time with the
very cast :func:`text_column` uses (tests/test_mysql_dialect.py compares them byte for byte), and at 2M narrow
rows takes about 60 % of the CPU of joining the columns with ``binary_join_element_wise``.  It refuses a
value holding a double quote when it may not quote; such a batch is joined the former way."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from xasink.dialects.decimal_text import decimal_text, may_have_exponent
from xasink.dialects.hex_text import hex_text
from xasink.dialects.mysql.errors import TIME_RANGE_HINT
from xasink.dialects.values import TargetPlan
from xasink.errors import BranchError

_NULL = "\\N"
_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\x00", "\\0"))
_ESCAPED_BYTES = np.zeros(256, dtype=bool)  # the bytes of _ESCAPES' first elements
_ESCAPED_BYTES[[ord(old) for old, _ in _ESCAPES]] = True
_QUOTE_BYTES = np.zeros(256, dtype=bool)
_QUOTE_BYTES[ord('"')] = True


def _offsets(arr: pa.Array) -> np.ndarray:
    return np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]


def holds_any(arr: pa.Array, table: np.ndarray) -> bool:
    """Whether a large_string array's bytes hold any byte ``table`` marks: one look-up per byte, far cheaper
    than a regular expression per value (a null slot's bytes may count: the answer is then a needless yes)."""
    offsets = _offsets(arr)
    data = arr.buffers()[2]
    if data is None or offsets[-1] == offsets[0]:
        return False
    return bool(table[np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]]].any())


def hex_column(arr: pa.Array) -> pa.Array:
    """Upper-case hex of every value (large_string, no nulls: NULL becomes ``\\N``)."""
    return hex_text(arr, _NULL)


def _check_finite(arr: pa.Array, name: str) -> None:
    if pa.types.is_floating(arr.type) and len(arr):
        bad = pc.sum(pc.or_(pc.is_nan(arr), pc.is_inf(arr))).as_py()
        if bad:
            raise BranchError(
                f"column '{name}' holds NaN or infinite values ({bad} in this task's rows), which MySQL and MariaDB "
                "cannot store: replace them (e.g. with NULL) first. Nothing of this batch is visible."
            )


_FLT_MAX = float(np.finfo(np.float32).max)


def float32_text(arr: pa.Array) -> pa.Array:
    """A float's shortest text, as Spark's JDBC writer sends it (Float.toString): a DOUBLE or DECIMAL column gets
    0.1 for 0.1f, not 0.10000000149011612.  The server reads it as a double (narrowed again for FLOAT), but
    the shortest text of +-FLT_MAX lies beyond FLT_MAX (refused as out of range): those go as the exact double."""
    out = arr.cast(pa.large_string())
    largest = pc.equal(pc.abs(arr), pa.scalar(_FLT_MAX, pa.float32()))
    if pc.any(largest).as_py():
        out = pc.if_else(largest, arr.cast(pa.float64()).cast(pa.large_string()), out)
    return out


def text_column(arr: pa.Array) -> pa.Array:
    """One column as LOAD DATA text (large_string, no nulls); binary columns go through :func:`hex_column`."""
    t = arr.type
    if is_binary(t):
        return hex_column(arr)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        out = arr.cast(pa.large_string())
        if holds_any(out, _ESCAPED_BYTES):  # one scan instead of five rewrites
            for old, new in _ESCAPES:
                out = pc.replace_substring(out, old, new)
    elif pa.types.is_boolean(t):
        out = arr.cast(pa.int8()).cast(pa.large_string())
    elif pa.types.is_timestamp(t):
        out = arr.cast(pa.timestamp(t.unit)).cast(pa.large_string())  # the plan's are wall times (no zone)
    elif pa.types.is_float32(t):
        out = float32_text(arr)
    elif pa.types.is_decimal(t):
        out = decimal_text(arr, pa.large_string())
    else:
        out = arr.cast(pa.large_string())
    return out.fill_null(_NULL) if out.null_count else out


_CSV = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none", null_string=_NULL)


def _as_is(t: pa.DataType) -> bool:
    """Whether the CSV writer's own text of this type is :func:`text_column`'s (its cast to string)."""
    if pa.types.is_timestamp(t):
        return t.tz is None  # a zoned one would end in Z
    return (
        pa.types.is_integer(t)
        or (pa.types.is_floating(t) and not pa.types.is_float32(t))
        or (pa.types.is_decimal(t) and not may_have_exponent(t))
        or pa.types.is_date(t)
    )


def encode_tsv(batch: pa.RecordBatch) -> pa.Buffer:
    """The batch as LOAD DATA input: fields by tab, lines by newline, escaped by backslash."""
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        _check_finite(col, name)
    cols = [c if _as_is(c.type) else text_column(c) for c in batch.columns]
    quoted = any(holds_any(c, _QUOTE_BYTES) for c in cols if pa.types.is_large_string(c.type))
    if not quoted:
        sink = pa.BufferOutputStream()
        pacsv.write_csv(pa.RecordBatch.from_arrays(cols, names=batch.schema.names), sink, _CSV)
        return sink.getvalue()
    cols = [text_column(c) if _as_is(c.type) else c for c in cols]
    tab, newline, empty = (pa.scalar(x, pa.large_string()) for x in ("\t", "\n", ""))
    parts: list[object] = []
    for col in cols:  # col, tab, col, tab, ..., col, newline: joined in one pass with an empty separator
        parts += [col, tab]
    parts[-1] = newline
    line = pc.binary_join_element_wise(*parts, empty)
    if isinstance(line, pa.ChunkedArray):
        line = line.combine_chunks()
    offsets = _offsets(line)
    return line.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _check_years(arr: pa.Array, name: str) -> None:
    """A date or time past the year 9999 (Spark's TimestampType reaches far beyond) is past every MySQL and
    MariaDB column's range, and past Python's too: told so, not as Python's "date value out of range"."""
    if (pa.types.is_timestamp(arr.type) or pa.types.is_date(arr.type)) and len(arr):
        years = pc.year(arr)
        if pc.any(pc.or_(pc.greater(years, 9999), pc.less(years, 1))).as_py():
            raise BranchError(
                f"column '{name}' holds a date or time past the year 9999 or before the year 1: {TIME_RANGE_HINT}. "
                "Nothing of this batch is visible."
            )


def is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


def check_empty_keys(batch: pa.RecordBatch, plan: TargetPlan, partition: int) -> None:
    """Under the server's EMPTY_STRING_IS_NULL an empty string is stored as NULL: an empty upsert or
    change-data key (or sequence) is a NULL one, refused as such before the branch prepares (a change-data
    apply failed after the decision, "Column 'id' cannot be null"; an upsert stored a NULL key)."""
    for name in dict.fromkeys((*plan.upsert_keys, *plan.required)):
        column = batch.column(plan.arrow_schema.get_field_index(name))
        if is_text(column.type) and pc.any(pc.equal(pc.binary_length(column), 0)).as_py():
            raise BranchError(
                f"partition {partition}: key column '{name}' is an empty string in some rows, which the server "
                "stores as NULL (its sql_mode has EMPTY_STRING_IS_NULL), and a row without a key cannot be merged "
                "or applied. Filter or fill those rows first. Nothing of this batch is visible."
            )


def python_rows(batch: pa.RecordBatch, empty_binary_null: bool = False) -> list[tuple[Any, ...]]:
    """The batch as Python tuples for pymysql's multi-row INSERT (timestamps: the plan's wall times).

    ``empty_binary_null``: an empty binary value as NULL, as the server's EMPTY_STRING_IS_NULL stores JDBC's
    ``_binary''`` (pymysql sends bytes as ``X''``, which that mode keeps; a str's ``''`` it makes NULL itself)."""
    columns = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        _check_finite(col, name)
        if pa.types.is_timestamp(col.type) and col.type.tz is not None:
            col = col.cast(pa.timestamp(col.type.unit))
        _check_years(col, name)
        if pa.types.is_float32(col.type):  # its shortest text, as a decimal literal (see float32_text)
            columns.append([None if v is None else Decimal(v) for v in float32_text(col).to_pylist()])
            continue
        values = col.to_pylist()
        if empty_binary_null and is_binary(col.type):
            values = [None if v == b"" else v for v in values]
        columns.append(values)
    return list(zip(*columns, strict=True))
