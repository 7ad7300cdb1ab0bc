"""Array columns as PostgreSQL's array text ('{1,NULL,"a b"}'), for the statements that bind each column as one
array parameter (the upsert's and the cast insert's unnest): a parameter of arrays would be a two-dimensional
array, which unnest flattens and which must be rectangular.  Binary COPY takes the lists as they are."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from xasink.dialects.decimal_text import decimal_text
from xasink.dialects.hex_text import hex_text


def _hex(arr: pa.Array) -> pa.Array:
    """bytea's hex input ('\\x0A1B') of every value, nulls kept."""
    return pc.binary_join_element_wise(
        pa.scalar("\\x", pa.large_string()), hex_text(arr, None), pa.scalar("", pa.large_string())
    )


def _element_text(values: pa.Array) -> pa.Array:
    """Each element as its type's input function reads it back exactly: a float's shortest digits, a decimal's
    exact ones, a timestamp with its offset (+00), bytes in hex."""
    t = values.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return _hex(values)
    if pa.types.is_timestamp(t) and t.tz is not None:
        wall = pc.local_timestamp(values.cast(pa.timestamp(t.unit, tz="UTC"))).cast(pa.large_string())
        return pc.binary_join_element_wise(wall, pa.scalar("+00", pa.large_string()), pa.scalar("", pa.large_string()))
    if pa.types.is_decimal(t):
        return decimal_text(values, pa.large_string())
    return values.cast(pa.large_string())


def array_text(arr: pa.Array) -> pa.Array:
    """A list column as array text: every element quoted (a backslash and a double quote escaped), a null element
    NULL, a null list a null value, an empty list '{}'."""
    offsets = arr.offsets
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    text = _element_text(arr.values.slice(first, last - first))
    text = pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), '"', '\\"')
    quote, null, empty = (pa.scalar(x, pa.large_string()) for x in ('"', "NULL", ""))
    text = pc.if_else(pc.is_null(text), null, pc.binary_join_element_wise(quote, text, quote, empty))
    if first:
        offsets = pc.subtract(offsets, pa.scalar(first, offsets.type))
    lists = pa.ListArray.from_arrays(offsets, text, mask=arr.is_null() if arr.null_count else None)
    joined = pc.binary_join(lists, pa.scalar(",", pa.large_string()))
    brace, unbrace = pa.scalar("{", pa.large_string()), pa.scalar("}", pa.large_string())
    return pc.binary_join_element_wise(brace, joined, unbrace, empty).cast(pa.string())
