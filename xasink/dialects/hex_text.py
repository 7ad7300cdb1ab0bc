"""Bytes as hexadecimal text, vectorised: MySQL's LOAD DATA field (read back by ``UNHEX``) and PostgreSQL's
bytea input (``\\x..``) inside an array's text.  One table look-up per byte, no Python loop per value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_HEX = np.frombuffer(b"".join(f"{i:02X}".encode() for i in range(256)), dtype=np.uint8).reshape(256, 2)


def hex_text(arr: pa.Array, null: str | None) -> pa.Array:
    """Upper-case hex of every value, as large_string; a null value becomes ``null`` (a null, when None)."""
    arr = arr.cast(pa.large_binary())
    if len(arr) == 0:
        return pa.array([], pa.large_string())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    hexed = _HEX[data[offsets[0] : offsets[-1]]].ravel()
    new_offsets = (offsets - offsets[0]) * 2
    out = pa.Array.from_buffers(pa.large_string(), len(arr), [None, pa.py_buffer(new_offsets), pa.py_buffer(hexed)])
    if arr.null_count:
        out = pc.if_else(arr.is_valid(), out, pa.scalar(null, pa.large_string()))
    return out
