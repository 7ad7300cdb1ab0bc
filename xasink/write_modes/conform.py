"""Conform a DataFrame's Arrow batches to the plan's column types in the tasks: Spark's semantics where a cast
has a choice (zones, ranges), the server's refusals before the server sees the rows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xasink.dialects.values import TargetPlan
from xasink.errors import BranchError
from xasink.support.zones import iso_zone

# Arrow reads the system's zone files without the rule they give for the years after their last listed
# transition (the TZif footer): from 2038 on it keeps standard time all year, where Java (Spark, its JDBC writer)
# and PostgreSQL apply the rule, an hour off in every summer.  Values from this instant (2037-01-01 UTC) on are
# converted again by Python's zoneinfo, which reads the rule (found by an adversary's review).
FAR_US = 2_114_380_800_000_000
_EPOCH = datetime(1970, 1, 1)
_MICRO = timedelta(microseconds=1)


def _region(zone: str | None) -> ZoneInfo | None:
    """The zone's rules, where it is a region (an offset has no rules to miss)."""
    try:
        return ZoneInfo(zone) if zone and zone[0] not in "+-" and zone != "UTC" else None
    except (ValueError, ZoneInfoNotFoundError):
        return None


def _far_again(micros: pa.Array, done: pa.Array, convert: Callable[[datetime], datetime | None]) -> pa.Array:
    """``done`` (timestamps, us) with its values at or past FAR_US (by ``micros``) converted again by ``convert``."""
    far = pc.fill_null(pc.greater_equal(micros, FAR_US), False)
    if not pc.any(far).as_py():
        return done
    values = pc.fill_null(micros, 0).to_numpy(zero_copy_only=False)
    out = pc.fill_null(done.cast(pa.int64()), 0).to_numpy(zero_copy_only=False).copy()
    for i in np.flatnonzero(far.to_numpy(zero_copy_only=False)):
        try:
            got = convert(_EPOCH + timedelta(microseconds=int(values[i])))
        except (OverflowError, ValueError):  # past Python's year 9999: Arrow's stands
            continue
        if got is not None:
            out[i] = (got - _EPOCH) // _MICRO
    return pa.array(out, pa.int64(), mask=done.is_null().to_numpy(zero_copy_only=False)).cast(done.type)


def local_wall(arr: pa.Array) -> pa.Array:
    """Instants (a zone's timestamps) as wall times in that zone, with the zone's rules in every year."""
    wall = pc.local_timestamp(arr).cast(pa.timestamp("us"))
    region = _region(arr.type.tz)
    if region is None or not len(arr):
        return wall
    micros = arr.cast(pa.timestamp("us", arr.type.tz)).cast(pa.int64())

    def to_wall(utc: datetime) -> datetime:
        return utc.replace(tzinfo=timezone.utc).astimezone(region).replace(tzinfo=None)

    return _far_again(micros, wall, to_wall)


def wall_time_in_zone(arr: pa.Array, zone: str) -> pa.Array:
    """Wall times (no zone) as the instants they are in zone, by Spark's rule (ZonedDateTime.of, as its cast does).

    A wall time in a gap (clocks jump forward) moves forward by the gap's length, one in an overlap takes the
    earlier instant: both are the offset in force just before the transition.  Arrow's "earliest" gives the
    right instant outside gaps and the last instant before a gap inside one; its wall time less itself is
    that offset in both cases."""
    earliest = pc.assume_timezone(arr, zone, ambiguous="earliest", nonexistent="earliest")
    offset = pc.subtract(pc.local_timestamp(earliest), earliest.cast(arr.type))
    instants = pc.subtract(arr, offset).cast(pa.timestamp("us"))
    region = _region(zone)
    if region is not None and len(arr):
        # the offset in force before a transition: PEP 495's fold=0 (a gap's wall time forward, an overlap's earlier)
        def to_instant(wall: datetime) -> datetime | None:
            offset = wall.replace(tzinfo=region).utcoffset()
            return None if offset is None else wall - offset

        instants = _far_again(arr.cast(pa.timestamp("us")).cast(pa.int64()), instants, to_instant)
    return instants.cast(pa.timestamp(arr.type.unit, tz="UTC"))


def _conform_column(arr: pa.Array, target: pa.DataType, time_zone: str = "UTC") -> pa.Array:
    src = arr.type
    if pa.types.is_timestamp(src) and src.tz is not None and iso_zone(src.tz) != src.tz:
        # Spark labels a TimestampType with the session's zone id as Java spells it (GMT+08:00), which Arrow
        # cannot read: the same instants, labelled with the offset as Arrow reads it
        arr = arr.cast(pa.timestamp(src.unit, iso_zone(src.tz)))
        src = arr.type
    if pa.types.is_list(src) and pa.types.is_list(target):
        return _conform_elements(arr, target, time_zone)
    if pa.types.is_fixed_size_binary(target) and not pa.types.is_fixed_size_binary(src):
        return _bits(arr, target.byte_width)
    if pa.types.is_timestamp(src) and pa.types.is_timestamp(target):
        if src.tz is not None and target.tz is None:  # as Spark's JDBC writer: wall time in the session zone
            arr = local_wall(arr).cast(pa.timestamp(src.unit))
        elif src.tz is None and target.tz is not None:  # as Spark's cast: the wall time in the session zone
            arr = wall_time_in_zone(arr, time_zone)
    if pa.types.is_timestamp(src) and pa.types.is_date(target):
        return _whole_days(arr)
    if pa.types.is_date(src) and pa.types.is_timestamp(target) and target.tz is not None:
        # as Spark's cast and its JDBC writer: midnight in the session zone, not in UTC
        arr = wall_time_in_zone(arr.cast(pa.timestamp(target.unit)), time_zone)
    if pa.types.is_float32(target) and not pa.types.is_float32(src):
        return _in_real_range(arr)
    if pa.types.is_decimal(src) and pa.types.is_floating(target):
        # correctly rounded, as the server's cast of the decimal Spark's JDBC writer sends (Arrow's direct
        # decimal-to-float cast is not: one value in five of a decimal(38,18) lands an ulp off)
        arr = arr.cast(pa.string())
    if arr.type == target:
        return arr
    if pa.types.is_integer(target) and (pa.types.is_floating(src) or pa.types.is_decimal(src)):
        arr = _whole_numbers(arr)
        src = arr.type
    if pa.types.is_integer(src) and (pa.types.is_integer(target) or pa.types.is_decimal(target)):
        return _integers_into(arr, target)
    if pa.types.is_integer(src) and pa.types.is_floating(target):
        # past 2**53 rounded to the nearest double, as the server rounds the integer Spark's JDBC writer sends
        return arr.cast(target, safe=False)
    return arr.cast(target, safe=True)


def _conform_elements(arr: pa.Array, target: pa.ListType, time_zone: str) -> pa.Array:
    """An array column: its elements conformed as a column of the element type, the lists kept (null, empty)."""
    offsets = arr.offsets
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    values = _conform_column(arr.values.slice(first, last - first), target.value_type, time_zone)
    if first:
        offsets = pc.subtract(offsets, pa.scalar(first, offsets.type))
    mask = arr.is_null() if arr.null_count else None
    return pa.ListArray.from_arrays(offsets, values, type=target, mask=mask)


def _whole_numbers(arr: pa.Array) -> pa.Array:
    """A double or a decimal into an integer column, as 64-bit integers: Spark's JDBC writer stores a fraction
    rounded by the server (2.5 is 2 on PostgreSQL, 3 on MariaDB), which xasink refuses (docs/types.md)."""
    fraction = pc.fill_null(pc.not_equal(pc.floor(arr), arr), False)
    if pa.types.is_floating(arr.type):  # NaN, infinities and what no 64-bit integer holds: out of range
        fraction = pc.and_(fraction, pc.is_finite(arr))
    if pc.any(fraction).as_py():
        raise pa.ArrowInvalid(
            f"{pc.filter(arr, fraction)[0].as_py()} is not a whole number (Spark's JDBC writer would store it "
            "rounded by the server): round it in Spark first, e.g. F.round(col).cast('long')"
        )
    try:
        return arr.cast(pa.int64(), safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise pa.ArrowInvalid("a value is out of the column's range (as the server says)") from None


def _whole_days(arr: pa.Array) -> pa.Array:
    """A timestamp into a date column: its date (a TimestampType's in its zone, the session's), refused where it
    has a time of day, which Spark's JDBC writer drops (docs/types.md)."""
    wall = local_wall(arr).cast(pa.timestamp(arr.type.unit)) if arr.type.tz is not None else arr
    days = wall.cast(pa.date32())
    bad = pc.fill_null(pc.not_equal(days.cast(wall.type), wall), False)
    if pc.any(bad).as_py():
        raise pa.ArrowInvalid(
            f"{pc.filter(wall, bad)[0]} has a time of day, which a date column drops (Spark's JDBC writer would "
            "store its date): truncate it in Spark first, e.g. F.to_date(col)"
        )
    return days


def _bits(arr: pa.Array, width: int) -> pa.Array:
    """Booleans or integers as a BIT column's bytes, big-endian, ``width`` of them: the value as Spark's JDBC
    writer sends it (true is 1; a negative integer its 64 bits, which only a BIT(64) holds).  A value wider than
    the bytes is refused here, one wider than the column's bits by the server ("Data too long"), as for JDBC."""
    values = np.asarray(arr.cast(pa.int64()).fill_null(0)).astype(np.int64).view(np.uint64)
    if width < 8:
        bad = pc.and_(pa.array(values >= np.uint64(1 << (8 * width))), arr.is_valid())
        if pc.any(bad).as_py():
            raise pa.ArrowInvalid(
                f"{pc.filter(arr, bad)[0].as_py()} does not fit the BIT column's {8 * width} bits or fewer "
                "(Data too long, as the server says)"
            )
    raw = values.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - width :]
    data = pa.py_buffer(np.ascontiguousarray(raw).tobytes())
    validity = pa.array(arr.is_valid()).buffers()[1] if arr.null_count else None
    return pa.Array.from_buffers(pa.binary(width), len(arr), [validity, data], arr.null_count)


def _integers_into(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """Integers into a narrower integer or a decimal, refused by the first value that does not fit, named with
    the column type's own range (Arrow's cast names its intermediate type's, or asks for more precision)."""
    if pa.types.is_integer(target):
        info = np.iinfo(target.to_pandas_dtype())
        low, high = int(info.min), int(info.max)
    else:
        high = 10 ** (target.precision - target.scale) - 1
        low = -high
    own = np.iinfo(arr.type.to_pandas_dtype())
    checks = []  # a widening cast needs none
    if low > int(own.min):
        checks.append(pc.less(arr, pa.scalar(low, arr.type)))
    if high < int(own.max):
        checks.append(pc.greater(arr, pa.scalar(high, arr.type)))
    outside = pc.fill_null(checks[0] if len(checks) == 1 else pc.or_(*checks), False) if checks else None
    if outside is not None and pc.any(outside).as_py():
        value = pc.filter(arr, outside)[0].as_py()
        if pa.types.is_integer(target):
            raise pa.ArrowInvalid(f"{value} is out of the column's range, {low} to {high}")
        raise pa.ArrowInvalid(
            f"{value} is out of the column's range, less than 10^{target.precision - target.scale} "
            f"(numeric field overflow, as the server says)"
        )
    if pa.types.is_decimal(target):  # through a decimal wide enough for any 64-bit integer at the target's scale
        if target.scale > 19:  # (none is: the values' own text, which fits, as checked)
            return arr.cast(pa.string()).cast(target)
        return arr.cast(pa.int64()).cast(pa.decimal128(38, target.scale)).cast(target)
    return arr.cast(target)


def _in_real_range(arr: pa.Array) -> pa.Array:
    """A number as a 4-byte float, refused where it overflows to infinity or underflows to zero, as PostgreSQL's
    cast of the double Spark's JDBC writer sends ("value out of range"); Arrow's own cast checks no range."""
    if pa.types.is_decimal(arr.type):
        wide = arr.cast(pa.string()).cast(pa.float64())
    else:  # an integer past 2**53 rounded, as the server rounds the integer Spark's JDBC writer sends
        wide = arr.cast(pa.float64(), safe=not pa.types.is_integer(arr.type))
    out = wide.cast(pa.float32(), safe=False)
    overflow = pc.and_(pc.is_inf(out), pc.invert(pc.is_inf(wide)))
    underflow = pc.and_(pc.equal(out, 0), pc.not_equal(wide, 0))
    bad = pc.fill_null(pc.or_(overflow, underflow), False)
    if pc.any(bad).as_py():
        value = pc.filter(arr, bad)[0].as_py()
        raise pa.ArrowInvalid(f"{value!r} is out of a real's range (value out of range, as the server says)")
    return out


def _labelled_zone(schema: pa.Schema) -> str:
    """The zone Spark's Arrow batches label a TimestampType with (the session's), or UTC without one."""
    for f in schema:
        if pa.types.is_timestamp(f.type) and f.type.tz is not None:
            return iso_zone(str(f.type.tz))
    return "UTC"


def conform(
    batch: pa.RecordBatch, plan: TargetPlan, partition: int, batch_id: int = 0, branch: str = ""
) -> pa.RecordBatch:
    """Select and cast a DataFrame batch into the table's exact column types; overflow is an error.

    A shadow table's plan (``plan.batch_column``, ``plan.branch_column``) gets each row tagged with
    ``batch_id`` and the ``branch`` (its xid's bqual): the apply reads only the decided branches' rows."""
    arrays = []
    zone = plan.time_zone or _labelled_zone(batch.schema)
    for name, field in zip(plan.source_names, plan.arrow_schema, strict=True):
        if name == plan.batch_column:
            arrays.append(pa.array([batch_id] * batch.num_rows, pa.int64()))
            continue
        if name == plan.branch_column:
            arrays.append(pa.array([branch] * batch.num_rows, pa.string()))
            continue
        arr = batch.column(name)
        try:
            arrays.append(_conform_column(arr, field.type, zone))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise BranchError(
                f"partition {partition}: column '{name}' does not fit column '{field.name}' "
                f"({field.type}) of the table: {exc}. Nothing of this batch is visible."
            ) from None
    return pa.RecordBatch.from_arrays(arrays, schema=plan.arrow_schema)
