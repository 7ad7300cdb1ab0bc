"""Issue 38's drop-in gaps against Spark's JDBC writer: what JDBC writes and xasink refused (arrays into
PostgreSQL array columns, MariaDB BIT columns, the conversions JDBC performs), each case as in
tests/test_values_cases.py (stored alike, or refused by both), on the write paths it names."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url

from tests.targets import MARIADB, POSTGRESQL, Target
from tests.test_values_cases import Case, check_case, doubles, frame, ints
from tests.values_harness import ValuesDriver, write_both
from xasink.dialects.postgres import PostgresDialect

pytestmark = pytest.mark.spark

ALL_PATHS = ("bulk", "upsert", "overwrite", "changes")
UTC = timezone.utc
NTZ = pa.timestamp("us")


def bools(*values: bool | None) -> pa.Array:
    return pa.array(values, pa.bool_())


def lists(values: list[list[object] | None], element: pa.DataType) -> pa.Array:
    return pa.array(values, pa.list_(element))


CASES: dict[str, Case] = {
    # ArrayType into PostgreSQL arrays of each scalar: elements, NULL elements, empty and NULL arrays
    "pg-arrays": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, seq int, ai int[], al bigint[], asm smallint[], ad double precision[], af real[], "
        "an numeric(6,2)[], ab boolean[], at text[], av varchar(10)[], adt date[], adz timestamptz[], "
        "atn timestamp[], atz timestamptz[], ani numeric[], adn numeric(6,2)[], aln numeric(30,0)[]",
        {
            "id": ints(0, 1, 2, 3),
            "seq": ints(0, 0, 0, 0),
            "ai": lists([[1, None, -2147483648], [], None, [7]], pa.int32()),
            "al": lists([[2**62, None], [], None, [-1]], pa.int64()),
            "asm": lists([[1, None], [], None, [-128]], pa.int8()),
            "ad": lists([[0.1 + 0.2, None, float("nan"), float("inf"), 5e-324, -0.0], [], None, [1e300]], pa.float64()),
            "af": lists([[0.1, None, float("-inf")], [], None, [3.4028235e38]], pa.float32()),
            "an": lists(
                [[Decimal("1.25"), None, Decimal("-9999.99")], [], None, [Decimal("0.00")]], pa.decimal128(6, 2)
            ),
            "ab": lists([[True, None, False], [], None, [True]], pa.bool_()),
            "at": lists([["x", None, 'q"uo\\te', "a,b", "{}", "NULL", "", " sp ", "🎉"], [], None, ["é"]], pa.string()),
            "av": lists([["short", None], [], None, ["ten chars!"]], pa.string()),
            "adt": lists([[date(2024, 1, 15), None, date(1, 1, 1)], [], None, [date(9999, 12, 31)]], pa.date32()),
            "adz": lists([[date(2024, 1, 15), None, date(2024, 7, 1)], [], None, [None]], pa.date32()),
            # (Spark's JDBC writer fails on a NULL element of a TimestampNTZType array: see DIFFERENT)
            "atn": lists([[datetime(2024, 1, 15, 12, 0, 0, 123456)], [], None, [datetime(2024, 11, 3, 1, 30)]], NTZ),
            "atz": lists([[datetime(2024, 1, 15, 12, 0, 0, 123456)], [], None, [datetime(2024, 7, 1)]], NTZ),
            "ani": lists([[5, None, -(2**31)], [], None, [0]], pa.int32()),
            "adn": lists([[0.1 + 0.2, None, 0.125, 2.675], [], None, [-0.005]], pa.float64()),
            "aln": lists([[2**62, None], [], None, [-1]], pa.int64()),
        },
        paths=ALL_PATHS,
    ),
    # arrays whose elements need no cast by the server: binary COPY, as it is
    "pg-arrays-copied": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, seq int, ai int[], at text[], adz timestamptz[]",
        {
            "id": ints(0, 1, 2),
            "seq": ints(0, 0, 0),
            "ai": lists([[1, None], [], None], pa.int16()),
            "at": lists([["a", None, "b\\c"], [], None], pa.string()),
            "adz": lists([[date(2024, 1, 15)], [None], None], pa.date32()),
        },
        paths=("bulk", "overwrite"),
    ),
    # an element out of its column's range: refused by both, naming the range
    "pg-array-element-overflow": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, a smallint[]",
        {"id": ints(0), "a": lists([[1, 70000]], pa.int32())},
        refused="-32768 to 32767",
    ),
    # MariaDB has no array type: both refuse
    # LongType past 2**53 into floating columns: rounded, as the server rounds the integer JDBC sends
    "pg-long-into-floats": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, d double precision, r real",
        {
            "id": ints(0, 1, 2),
            "d": pa.array([2**63 - 1, -(2**63), 2**53 + 1], pa.int64()),
            "r": pa.array([2**63 - 1, -(2**63), 2**24 + 1], pa.int64()),
        },
        paths=ALL_PATHS,
    ),
    "maria-long-into-floats": Case(
        MARIADB,
        "id int PRIMARY KEY, d double, f float",
        {
            "id": ints(0, 1, 2),
            "d": pa.array([2**63 - 1, -(2**63), 2**53 + 1], pa.int64()),
            "f": pa.array([2**63 - 1, -(2**63), 2**24 + 1], pa.int64()),
        },
        paths=ALL_PATHS,
    ),
    # a value for a GENERATED ALWAYS identity column: refused by both (COPY stored it, found by the full matrix's
    # shard 16: pg:feature:identity-always on the bulk and overwrite paths)
    "pg-value-for-identity-always": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, v int, n int GENERATED ALWAYS AS IDENTITY",
        {"id": ints(0), "v": ints(5), "n": ints(9)},
        paths=ALL_PATHS,
        refused="GENERATED ALWAYS AS IDENTITY",
    ),
    # a value for a stored generated column: refused before anything is written (it was COPY's bare error)
    "pg-value-for-generated-column": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, v int, g int GENERATED ALWAYS AS (v * 2) STORED",
        {"id": ints(0), "v": ints(5), "g": ints(10)},
        paths=ALL_PATHS,
        refused="GENERATED ALWAYS AS (an expression) STORED",
    ),
    # a NULL into an AUTO_INCREMENT column is numbered, also by an upsert through a staging table (a table with a
    # unique index besides the key's), whose copy of the column was NOT NULL (found by the full matrix's shard 13)
    "maria-null-into-auto-increment": Case(
        MARIADB,
        "id int PRIMARY KEY, v int, n int NULL AUTO_INCREMENT, UNIQUE KEY (n)",
        {"id": ints(0, 1), "v": ints(5, 6), "n": pa.array([None, None], pa.int32())},
        paths=("bulk", "upsert", "changes"),  # (an overwrite numbers on: a listed difference, docs/types.md)
    ),
    "maria-array": Case(
        MARIADB, "id int PRIMARY KEY, a text", {"id": ints(0), "a": lists([[1]], pa.int32())}, refused="array"
    ),
    # MariaDB BIT(1) and BIT(n) from booleans and integers: the value's bits (true is 1; a negative LongType is
    # its 64 bits, which only a BIT(64) holds)
    "maria-bit-from-booleans": Case(
        MARIADB,
        "id int PRIMARY KEY, seq int, b1 bit(1), b8 bit(8)",
        {"id": ints(0, 1, 2), "seq": ints(0, 0, 0), "b1": bools(True, False, None), "b8": bools(True, None, False)},
        paths=ALL_PATHS,
    ),
    "maria-bit-from-integers": Case(
        MARIADB,
        "id int PRIMARY KEY, seq int, b1 bit(1), b2 bit(2), b8 bit(8), b12 bit(12), b8i bit(8), b64 bit(64)",
        {
            "id": ints(0, 1, 2),
            "seq": ints(0, 0, 0),
            "b1": ints(1, 0, None),
            "b2": pa.array([3, None, 0], pa.int16()),
            "b8": pa.array([5, 127, None], pa.int8()),
            "b12": ints(4095, 256, None),
            "b8i": ints(255, 0, None),
            "b64": pa.array([-1, 2**63 - 1, None], pa.int64()),
        },
        paths=ALL_PATHS,
    ),
    "maria-booleans-into-numbers": Case(  # the server stores the 1 or 0 JDBC sends; PostgreSQL refuses, both
        MARIADB,
        "id int PRIMARY KEY, seq int, i int, u bigint unsigned, s smallint, d decimal(10,2), f float, g double",
        {
            "id": ints(0, 1, 2),
            "seq": ints(0, 0, 0),
            **{c: bools(True, False, None) for c in ("i", "u", "s", "d", "f", "g")},
        },
        paths=ALL_PATHS,
    ),
    # strings into PostgreSQL types SQLAlchemy does not reflect (it calls them NullType): the server's reading of
    # the string, by the type's name the server gives (they were refused as "type NULL"; a new user's review)
    "pg-strings-into-unreflected-types": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, seq int, p point, x xml, l pg_lsn, b box, v int2vector, c circle",
        {
            "id": ints(0, 1),
            "seq": ints(0, 0),
            "p": pa.array(["(1,2)", None]),
            "x": pa.array(["<a href='x'>é</a>", None]),
            "l": pa.array(["16/B374D848", None]),
            "b": pa.array(["(1,1),(0,0)", None]),
            "v": pa.array(["1 2 3", None]),
            "c": pa.array(["<(1,2),3>", None]),
        },
        url_query="stringtype=unspecified",
        paths=ALL_PATHS,
    ),
    # a session told to read otherwise (client_encoding LATIN1, doubles' short text) by the URL's options, as by a
    # database's or role's settings: Spark's JDBC writer's startup parameters win, and xasink's branches now take
    # the same (text was garbled, 0.1 + 0.2 stored as 0.3: an adversary's review)
    "pg-session-settings-of-the-url": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, seq int, t text, f text, r varchar(20), d date",
        {
            "id": ints(0, 1),
            "seq": ints(0, 0),
            "t": pa.array(["café über", None]),
            "f": doubles(0.1 + 0.2, None),
            "r": pa.array([1.0000001, None], pa.float32()),
            "d": pa.array(["01/02/2024", None]),  # read alike by both writers, whatever the DateStyle asks
        },
        url_query="stringtype=unspecified&options=-c%20client_encoding%3DLATIN1%20-c%20extra_float_digits%3D0"
        "%20-c%20DateStyle%3DSQL%2CDMY",
        paths=ALL_PATHS,
    ),
    # settings a session may carry (the URL's options here, a database's or role's alike) that change how text
    # reads on the server: both writers send parameters and binary data, which none of them touches
    "pg-session-settings-both-writers-ignore": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, seq int, t text, b bytea, m money, a text[], iv interval, j jsonb",
        {
            "id": ints(0, 1),
            "seq": ints(0, 0),
            "t": pa.array(["a\\b'c\\n", None]),
            "b": pa.array([b"\\x00'", None]),
            "m": pa.array(["12.5", None]),
            "a": lists([["a\\b", "c'd", None], None], pa.string()),
            "iv": pa.array(["1 day 02:00:00", None]),
            "j": pa.array(['{"k": "a\\\\b"}', None]),
        },
        url_query="stringtype=unspecified&options=-c%20standard_conforming_strings%3Doff%20-c%20lc_monetary%3DC.utf8%20-c%20IntervalStyle%3Dsql_standard%20-c%20bytea_output%3Descape",
        paths=ALL_PATHS,
    ),
    # MariaDB's types SQLAlchemy does not reflect (inet6, inet4, uuid, a geometry): the server reads the strings;
    # an overwrite's or change-data's shadow was refused ("Can't generate DDL for NullType")
    "maria-strings-into-unreflected-types": Case(
        MARIADB,
        "id int PRIMARY KEY, seq int, u uuid, i6 inet6, i4 inet4, g point",
        {
            "id": ints(0, 1),
            "seq": ints(0, 0),
            "u": pa.array(["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", None]),
            "i6": pa.array(["::ffff:1.2.3.4", None]),
            "i4": pa.array(["10.0.0.1", None]),
            "g": pa.array([None, None], pa.string()),
        },
        paths=ALL_PATHS,
    ),
    # BinaryType into MariaDB text columns: the bytes, read by the server in the column's character set, as
    # Spark's JDBC writer sends them (they were refused; a new user's review); bytes that are no text in it are
    # refused by the server, for both writers
    "maria-binary-into-text": Case(
        MARIADB,
        "id int PRIMARY KEY, seq int, t text, v varchar(10), c char(5), l varchar(10) CHARACTER SET latin1",
        {
            "id": ints(0, 1, 2),
            "seq": ints(0, 0, 0),
            "t": pa.array([b"\xc3\xa9\xf0\x9f\x8e\x89", b"", None]),
            "v": pa.array([b"abc", b"x\ty", None]),
            "c": pa.array([b"ab", None, b"z "]),
            "l": pa.array([b"\xe9", b"a", None]),
        },
        paths=ALL_PATHS,
    ),
    "maria-invalid-utf8-into-text": Case(
        MARIADB, "id int PRIMARY KEY, t text", {"id": ints(0), "t": pa.array([b"\xff\xfe"])}, refused="for column"
    ),
    # PostgreSQL text holds no NUL: both refuse, xasink saying so and what to do (a new user's review)
    "pg-nul-in-text": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, t text",
        {"id": ints(0, 1), "t": pa.array(["ok", "a\x00b"])},
        refused="NUL character",
        paths=("bulk", "upsert"),
    ),
    # a TIMESTAMP column ends in 2038: xasink names that range and DATETIME(6), not "a number is out of range"
    # (the server's code 1264 alone; found by the values matrix)
    "maria-timestamp-past-2038": Case(
        MARIADB,
        "id int PRIMARY KEY, ts timestamp(6) NULL",
        {"id": ints(0, 1), "ts": pa.array([None, datetime(2040, 1, 1, tzinfo=UTC)], pa.timestamp("us", "UTC"))},
        refused="TIMESTAMP column holds 1970-01-01 00:00:01 to 2038",
        not_said="a number is",
        paths=("bulk", "upsert", "overwrite"),
    ),
    "maria-bit-too-long": Case(
        MARIADB, "id int PRIMARY KEY, b bit(8)", {"id": ints(0, 1), "b": ints(1, 256)}, refused="does not fit"
    ),
    "maria-bit-negative": Case(
        MARIADB, "id int PRIMARY KEY, b bit(8)", {"id": ints(0), "b": ints(-1)}, refused="does not fit"
    ),
    "maria-bit-beyond-its-bits": Case(
        MARIADB,
        "id int PRIMARY KEY, b bit(1), c bit(12)",
        {"id": ints(0, 1), "b": ints(1, 2), "c": ints(1, 1)},
        refused="for column 'b'",  # the server's: out of range (LOAD DATA), data too long (INSERT)
        paths=("bulk", "upsert"),
    ),
    # the conversions Spark's JDBC writer performs: numbers and booleans into text (the server's text of them)
    "pg-numbers-into-text": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, seq int, ti text, tl varchar(30), td text, tf text, tn text, tb text, tc char(4), tz text",
        {
            "id": ints(0, 1, 2, 3, 4, 5, 6),
            "seq": ints(0, 0, 0, 0, 0, 0, 0),
            "ti": ints(5, -7, None, 0, 2147483647, 1, 2),
            "tl": pa.array([2**63 - 1, None, 0, 1, 2, 3, 4], pa.int64()),
            "td": doubles(0.1, 1e300, float("nan"), -0.0, 1.0, 5e-324, float("-inf")),
            "tf": pa.array([0.1, 1e10, 3.4028235e38, None, 1.0, -2.5, 1e-45], pa.float32()),
            "tn": pa.array(
                [Decimal("1.50"), None, Decimal("-0.01"), Decimal("0.00"), Decimal("9999.99"), None, None],
                pa.decimal128(6, 2),
            ),
            "tb": bools(True, False, None, True, True, False, False),
            "tc": ints(5, None, 42, 1, 2, 3, 4),
            # plain digits, never Arrow's exponent (0E-18): a scale past 6 with a zero or a tiny value
            "tz": pa.array(
                [Decimal(0), Decimal("1E-18"), Decimal("-1E-18"), Decimal("123.45"), None, Decimal("1E-7"), Decimal(1)],
                pa.decimal128(38, 18),
            ),
        },
        paths=ALL_PATHS,
    ),
    "pg-number-too-long-for-varchar": Case(
        POSTGRESQL, "id int PRIMARY KEY, v varchar(3)", {"id": ints(0), "v": ints(123456)}, refused="too long"
    ),
    "maria-numbers-into-text": Case(
        MARIADB,
        "id int PRIMARY KEY, seq int, ti text, tl varchar(30), tn text, tb text, tb5 varchar(5), tz text",
        {
            "id": ints(0, 1, 2),
            "seq": ints(0, 0, 0),
            "ti": ints(5, -7, None),
            "tl": pa.array([2**63 - 1, None, -(2**63)], pa.int64()),
            "tn": pa.array([Decimal("1.50"), None, Decimal("-0.01")], pa.decimal128(6, 2)),
            "tb": bools(True, False, None),
            "tb5": bools(False, None, True),
            "tz": pa.array([Decimal(0), Decimal("1E-18"), Decimal("-1E-7")], pa.decimal128(38, 18)),
        },
        paths=ALL_PATHS,
    ),
    # a timestamp at midnight into a date: its date (a TimestampType's in the session zone)
    "pg-timestamp-into-date": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, seq int, d date, dn date",
        {
            "id": ints(0, 1),
            "seq": ints(0, 0),
            "d": pa.array([datetime(2024, 1, 15, 5, tzinfo=UTC), None], pa.timestamp("us", tz="UTC")),
            "dn": pa.array([None, datetime(2024, 7, 1)], NTZ),
        },
        paths=ALL_PATHS,
    ),
    # (a TimestampNTZType into DATE: JDBC shifts it by the zone's offset, as into DATETIME: see Differences)
    "maria-timestamp-into-date": Case(
        MARIADB,
        "id int PRIMARY KEY, seq int, d date",
        {
            "id": ints(0, 1),
            "seq": ints(0, 0),
            "d": pa.array([datetime(2024, 7, 1, 4, tzinfo=UTC), None], pa.timestamp("us", tz="UTC")),
        },
        paths=ALL_PATHS,
    ),
    # whole doubles and decimals into integer columns
    "pg-whole-numbers-into-integers": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, seq int, i int, l bigint, s smallint",
        {
            "id": ints(0, 1),
            "seq": ints(0, 0),
            "i": doubles(2.0, -3.0),
            "l": pa.array([Decimal("5.00"), None], pa.decimal128(6, 2)),
            "s": pa.array([None, -2.0], pa.float32()),
        },
        paths=ALL_PATHS,
    ),
    "maria-whole-numbers-into-integers": Case(
        MARIADB,
        "id int PRIMARY KEY, seq int, i int, l bigint, u int unsigned",
        {
            "id": ints(0, 1),
            "seq": ints(0, 0),
            "i": doubles(2.0, -3.0),
            "l": pa.array([Decimal("5.00"), None], pa.decimal128(6, 2)),
            "u": doubles(None, 4294967295.0),
        },
        paths=ALL_PATHS,
    ),
    "pg-double-out-of-int-range": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, i int",
        {"id": ints(0), "i": doubles(1e10)},
        refused="out of the column's range",
    ),
    "maria-double-out-of-unsigned-range": Case(
        MARIADB, "id int PRIMARY KEY, u int unsigned", {"id": ints(0), "u": doubles(-1.0)}, refused="0 to 4294967295"
    ),
    # strings into MariaDB DATE and VARBINARY, BLOB, BINARY: the server's reading, the string's bytes
    "maria-strings-into-date-and-bytes": Case(
        MARIADB,
        "id int PRIMARY KEY, seq int, d date, vb varbinary(10), bl blob, bn binary(5)",
        {
            "id": ints(0, 1, 2),
            "seq": ints(0, 0, 0),
            "d": pa.array(["2024-01-15", "2024-1-5 10:00:00", None]),  # (the server drops the time, for both)
            "vb": pa.array(["abc", "é", None]),
            "bl": pa.array(["", None, "a\tb\\"]),
            "bn": pa.array(["abc", None, "x"]),
        },
        paths=ALL_PATHS,
    ),
    # strings into MariaDB numbers, DATETIME, TIMESTAMP, TIME, YEAR, BOOLEAN: the server's reading, as of JDBC's
    "maria-strings-into-numbers-and-times": Case(
        MARIADB,
        "id int PRIMARY KEY, seq int, i int, bu bigint unsigned, n decimal(6,2), f double, dt datetime(3), "
        "ts timestamp(6) NULL, t time, y year, b boolean",
        {
            "id": ints(0, 1, 2),
            "seq": ints(0, 0, 0),
            "i": pa.array(["42", "-7", None]),
            "bu": pa.array(["18446744073709551615", None, "0"]),
            "n": pa.array(["1.005", "-9999.99", None]),  # (rounded by the server, for both)
            "f": pa.array(["0.1", "1e300", None]),
            "dt": pa.array(["2024-01-15 12:34:56.789", "2024-1-5", None]),
            "ts": pa.array(["2024-07-01 00:00:00.123456", None, "2024-01-15"]),
            "t": pa.array(["42", "12:34:56", None]),
            "y": pa.array(["0", "2024", "69"]),  # '0' is 2000, as a string (the number 0 is 0000)
            "b": pa.array(["1", "0", None]),
        },
        paths=ALL_PATHS,
    ),
    # a word is no number or date: the message says the type cannot read it, not "widen the column" (a new
    # user's review), on the LOAD DATA and the INSERT paths
    "maria-string-not-a-number": Case(
        MARIADB,
        "id int PRIMARY KEY, i int",
        {"id": ints(0), "i": pa.array(["forty-two"])},
        refused="type cannot read",
        not_said="widen the column",
        paths=("bulk", "upsert"),
    ),
    "maria-string-not-a-date": Case(
        MARIADB,
        "id int PRIMARY KEY, d datetime",
        {"id": ints(0), "d": pa.array(["not a date"])},
        refused="type cannot read",
        not_said="out of range",
        paths=("bulk", "upsert"),
    ),
    # a 4-byte character into a utf8mb3 column: the message names utf8mb4 (a new user's review)
    "maria-four-byte-character-into-utf8mb3": Case(
        MARIADB,
        "id int PRIMARY KEY, t varchar(10) CHARACTER SET utf8mb3",
        {"id": ints(0, 1), "t": pa.array(["é", "party 🎉"])},
        refused="utf8mb4",
        paths=("bulk", "upsert"),
    ),
    # NaN: the message counts this task's and names both servers (a new user's review)
    "maria-nan-into-double": Case(
        MARIADB,
        "id int PRIMARY KEY, d double",
        {"id": ints(0, 1), "d": doubles(1.5, float("nan"))},
        refused="(1 in this task's rows), which MySQL and MariaDB",
        paths=("bulk", "upsert"),
    ),
    # a date past the year 9999 (Spark's TimestampType reaches far beyond): the message names the ranges on both
    # load paths, not Python's "date value out of range" (a new user's review)
    "maria-timestamp-past-9999": Case(
        MARIADB,
        "id int PRIMARY KEY, ts datetime(6)",
        {"id": ints(0, 1), "ts": pa.array([1_704_067_200_000_000, 253_402_387_200_000_000], NTZ)},  # 10000-01-02
        refused="the years 1000 to 9999",
        not_said="date value out of range",
        paths=("bulk", "upsert"),
    ),
    "maria-string-too-long-for-varbinary": Case(
        MARIADB,
        "id int PRIMARY KEY, b varbinary(4)",
        {"id": ints(0), "b": pa.array(["abcdefgh"])},
        refused="for column",
    ),
    # strings into PostgreSQL columns of other types: the server's reading (JDBC: stringtype=unspecified)
    "pg-strings-into-date-and-numbers": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, seq int, d date, i int, n numeric(6,2), b boolean, by bytea, a int[]",
        {
            "id": ints(0, 1),
            "seq": ints(0, 0),
            "d": pa.array(["2024-01-15", None]),
            "i": pa.array([" 42 ", None]),
            "n": pa.array(["1.005", None]),
            "b": pa.array(["yes", "f"]),
            "by": pa.array(["\\x00ff", "abc"]),
            "a": pa.array(["{1,NULL}", None]),
        },
        url_query="stringtype=unspecified",
        paths=ALL_PATHS,
    ),
}

# arrays Spark's JDBC writer refuses and xasink writes (docs/types.md, Differences): what xasink stores
DIFFERENT: dict[str, tuple[Case, list[tuple[object, ...]]]] = {
    # JDBC: "Unable to find server array type for provided name TIMESTAMP WITH TIME ZONE"
    "pg-timestamp-array": (
        Case(
            POSTGRESQL,
            "id int PRIMARY KEY, a timestamptz[], w timestamp[]",
            {
                "id": ints(0),
                "a": lists([[datetime(2024, 1, 15, 17, tzinfo=UTC), None]], pa.timestamp("us", tz="UTC")),
                "w": lists([[datetime(2024, 1, 15, 17, tzinfo=UTC)]], pa.timestamp("us", tz="UTC")),
            },
        ),
        [(0, [datetime(2024, 1, 15, 17, tzinfo=UTC), None], [datetime(2024, 1, 15, 12)])],
    ),
    # JDBC: "byte[] nested inside Object[]"
    "pg-binary-array": (
        Case(
            POSTGRESQL,
            "id int PRIMARY KEY, a bytea[]",
            {"id": ints(0), "a": lists([[b"\x00\xff", None, b""]], pa.binary())},
            paths=("bulk", "upsert"),  # upsert: the array's text through unnest, its bytes in hex
        ),
        [(0, [b"\x00\xff", None, b""])],
    ),
    # JDBC: a NullPointerException for the NULL element of a TimestampNTZType array
    "pg-timestamp-ntz-array-null": (
        Case(
            POSTGRESQL,
            "id int PRIMARY KEY, a timestamp[]",
            {"id": ints(0), "a": lists([[datetime(2024, 1, 15), None]], NTZ)},
        ),
        [(0, [datetime(2024, 1, 15), None])],
    ),
    # JDBC: "column a is of type uuid[] but expression is of type text[]", stringtype=unspecified or not
    "pg-string-array-into-uuid-array": (
        Case(
            POSTGRESQL,
            "id int PRIMARY KEY, a uuid[]",
            {"id": ints(0), "a": lists([["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", None]], pa.string())},
        ),
        [(0, "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}")],
    ),
}


@pytest.mark.parametrize(
    ("name", "path"),
    [
        pytest.param(name, path, id=f"{name}-{path}", marks=[pytest.mark.mariadb] if case.kind == MARIADB else [])
        for name, case in CASES.items()
        for path in case.paths
    ],
)
def test_dropin_case_as_spark_jdbc_writes_it(
    values_driver: ValuesDriver, request: pytest.FixtureRequest, tmp_path: Path, name: str, path: str
) -> None:
    check_case(values_driver, request, tmp_path, CASES[name], path)


@pytest.mark.parametrize("name", list(DIFFERENT))
def test_dropin_case_jdbc_refuses_and_xasink_writes(
    values_driver: ValuesDriver, request: pytest.FixtureRequest, tmp_path: Path, name: str
) -> None:
    case, stored = DIFFERENT[name]
    db = request.getfixturevalue("pg" if case.kind == POSTGRESQL else "maria")
    twin = write_both(values_driver, db, case.columns, frame(case), tmp_path)
    answer, xasink_table = twin.answer, twin.xasink
    assert answer.get("writer") == "jdbc" and "xasink_error" not in answer, answer
    rows = [tuple(_bytes(v) for v in row) for row in db.rows(xasink_table, "id")]
    if name == "pg-string-array-into-uuid-array":  # (psycopg2 reads a uuid[] as its text)
        rows = [(row[0], str(row[1])) for row in rows]
    assert rows == stored


def _bytes(value: object) -> object:
    """psycopg2's bytea values (in arrays too) as bytes."""
    if isinstance(value, list):
        return [_bytes(v) for v in value]
    return bytes(value) if isinstance(value, memoryview) else value


@pytest.mark.parametrize("path", ALL_PATHS)
def test_a_null_array_element_stays_null_whatever_array_nulls_says(
    values_driver: ValuesDriver, pg: Target, tmp_path: Path, path: str
) -> None:
    """Under ``array_nulls = off`` (a database's, a role's, or here the URL's options) an array's text reads NULL
    as the string ``NULL``: JDBC, which sends arrays as text, stores the string into a text[] and is refused by
    an int[].  xasink's sessions set it on and keep the NULL on every path (before: an append kept it, an upsert
    stored the string and an overwrite's apply was refused; an adversary's review).  A deliberate difference
    (docs/types.md)."""
    off = "options=-c%20array_nulls%3Doff"
    data = {"id": ints(0), "seq": ints(0), "t": lists([["x", None]], pa.string())}
    twin = write_both(
        values_driver, pg, "id int PRIMARY KEY, seq int, t text[]", pa.table(data), tmp_path, path, url_query=off
    )
    assert twin.rows() == ([(0, 0, ["x", "NULL"])], [(0, 0, ["x", None])])
    data["n"] = lists([[1, None]], pa.int32())
    columns = "id int PRIMARY KEY, seq int, t text[], n int[]"
    twin = write_both(values_driver, pg, columns, pa.table(data), tmp_path, path, url_query=off)
    assert twin.answer["writer"] == "jdbc" and 'invalid input syntax for type integer: "NULL"' in twin.answer["error"]
    assert "xasink_error" not in twin.answer, twin.answer
    assert [r for r in pg.rows(twin.xasink, "id") if r[0] != -1] == [(0, 0, ["x", None], [1, None])]


def test_a_nested_array_is_refused_where_jdbc_writes_it(
    values_driver: ValuesDriver, pg: Target, tmp_path: Path
) -> None:
    """Spark's JDBC writer stores an array of arrays as a two-dimensional array; xasink writes one dimension only
    (docs/types.md, Differences) and refuses it before anything is written."""
    data = pa.table({"id": ints(0), "a": pa.array([[[1, 2]]], pa.list_(pa.list_(pa.int32())))})
    twin = write_both(values_driver, pg, "id int PRIMARY KEY, a int[]", data, tmp_path)
    answer, xasink_table = twin.answer, twin.xasink
    assert answer.get("writer") == "xasink", answer
    assert "one-dimensional arrays" in answer["error"], answer
    assert pg.rows(xasink_table) == []


# conversions Spark's JDBC writer makes with a loss (a fraction rounded, a time of day dropped) or into text it
# formats its own way: xasink refuses them (docs/types.md, Differences), before anything is written
REFUSED: dict[str, tuple[Case, str]] = {
    "pg-fraction-into-int": (
        Case(POSTGRESQL, "id int PRIMARY KEY, i int", {"id": ints(0), "i": doubles(2.5)}),
        "not a whole number",
    ),
    "pg-decimal-fraction-into-bigint": (
        Case(
            POSTGRESQL,
            "id int PRIMARY KEY, l bigint",
            {"id": ints(0), "l": pa.array([Decimal("5.50")], pa.decimal128(6, 2))},
        ),
        "not a whole number",
    ),
    "maria-fraction-into-int": (
        Case(MARIADB, "id int PRIMARY KEY, i int", {"id": ints(0), "i": doubles(2.5)}),
        "not a whole number",
    ),
    "pg-time-of-day-into-date": (
        Case(
            POSTGRESQL,
            "id int PRIMARY KEY, d date",
            {"id": ints(0), "d": pa.array([datetime(2024, 1, 16, 4, 30, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))},
        ),
        "has a time of day",
    ),
    "maria-time-of-day-into-date": (
        Case(
            MARIADB, "id int PRIMARY KEY, d date", {"id": ints(0), "d": pa.array([datetime(2024, 1, 15, 23, 30)], NTZ)}
        ),
        "has a time of day",
    ),
    "pg-date-into-text": (  # pgjdbc's text of it carries the JVM zone's offset: '2024-01-15 -05'
        Case(POSTGRESQL, "id int PRIMARY KEY, t text", {"id": ints(0), "t": pa.array([date(2024, 1, 15)])}),
        "format it in Spark first",
    ),
    "maria-timestamp-into-blob": (  # the wall time in the JVM's zone, as text
        Case(
            MARIADB,
            "id int PRIMARY KEY, b blob",
            {"id": ints(0), "b": pa.array([datetime(2024, 1, 16, 4, 30, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))},
        ),
        "format it in Spark first",
    ),
    "maria-zero-into-datetime": (  # the zero date 0000-00-00 00:00:00
        Case(MARIADB, "id int PRIMARY KEY, t datetime", {"id": ints(0), "t": ints(0)}),
        "a number is no date",
    ),
    "maria-double-into-text": (
        Case(MARIADB, "id int PRIMARY KEY, t text", {"id": ints(0), "t": doubles(0.1)}),
        "cast it in Spark first",
    ),
    "pg-binary-into-text": (  # the server's text of the bytea: '\\x0102'
        Case(POSTGRESQL, "id int PRIMARY KEY, t text", {"id": ints(0), "t": pa.array([b"\x01\x02"])}),
        "encode it in Spark first",
    ),
    "maria-number-into-varbinary": (  # the digits' bytes: 0x3432
        Case(MARIADB, "id int PRIMARY KEY, b varbinary(8)", {"id": ints(0), "b": ints(42)}),
        "a number's bytes are not its digits",
    ),
    "maria-timestamp-into-time": (  # its time of day, the date dropped
        Case(
            MARIADB, "id int PRIMARY KEY, t time", {"id": ints(0), "t": pa.array([datetime(2024, 1, 15, 23, 30)], NTZ)}
        ),
        "date_format(col, 'HH:mm:ss.SSSSSS')",
    ),
}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.mariadb] if c.kind == MARIADB else []) for n, (c, _) in REFUSED.items()],
)
def test_dropin_case_jdbc_writes_and_xasink_refuses(
    values_driver: ValuesDriver, request: pytest.FixtureRequest, tmp_path: Path, name: str
) -> None:
    case, said = REFUSED[name]
    db = request.getfixturevalue("pg" if case.kind == POSTGRESQL else "maria")
    twin = write_both(values_driver, db, case.columns, frame(case), tmp_path)
    answer, jdbc_table, xasink_table = twin.answer, twin.jdbc, twin.xasink
    assert answer.get("writer") == "xasink" and said in answer["error"], answer
    assert len(db.rows(jdbc_table)) == 1
    assert db.rows(xasink_table) == []


def test_created_array_columns_are_the_types_spark_jdbc_creates() -> None:
    """createTable: an array column of its element's type, as Spark's JDBC writer's PostgreSQL dialect creates it
    (compared once by hand: format_type of both writers' created tables, the frame's columns NOT NULL alike)."""
    types = PostgresDialect(make_url("postgresql://u@h/d"))

    def created_type(t: pa.DataType) -> str:
        sql_type = types.sql_type(pa.list_(t))
        assert sql_type is not None, t
        return str(sql_type.compile(dialect=postgresql.dialect()))

    created = {
        str(t): created_type(t)
        for t in (pa.int8(), pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.decimal128(7, 2), pa.string())
    }
    assert created == {
        "int8": "SMALLINT[]",
        "int32": "INTEGER[]",
        "int64": "BIGINT[]",
        "float": "REAL[]",
        "double": "DOUBLE PRECISION[]",
        "decimal128(7, 2)": "NUMERIC(7, 2)[]",
        "string": "TEXT[]",
    }
    assert types.sql_type(pa.list_(pa.list_(pa.int32()))) is None  # one dimension only
