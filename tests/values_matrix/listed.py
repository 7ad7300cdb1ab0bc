"""The differences from Spark's JDBC writer the matrix accepts, as data: the source of docs/types.md's
"Differences from Spark's JDBC writer" table (tests/test_values_matrix.py checks the two are one).

An entry matches cells by database, Spark type, column type, edge value, zone, path and kind of difference
(``*``: any).  ``docs`` is its row in docs/types.md (Spark type, column, what JDBC stores, what xasink stores).
A difference no entry names fails the matrix: there is no catch-all.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.values_matrix.cells import COLUMNS, Cell

ANY = ("*",)


@dataclass(frozen=True)
class Listed:
    key: str
    db: tuple[str, ...]
    spark: tuple[str, ...]
    column: tuple[str, ...]
    kind: tuple[str, ...] = ("value",)
    edge: tuple[str, ...] = ANY
    zone: tuple[str, ...] = ANY
    path: tuple[str, ...] = ANY
    docs: tuple[str, str, str, str] | None = None

    def matches(self, cell: Cell, kind: str) -> bool:
        fields = (
            (self.db, cell.db),
            (self.spark, cell.spark),
            (self.column, cell.column),
            (self.kind, kind),
            (self.edge, cell.edge),
            (self.zone, cell.zone),
            (self.path, cell.path),
        )
        return all(want == ANY or got in want for want, got in fields)


ZONE_READERS = ("zone-default", "local-default", "trigger-zone")
NTZ_GAP = (
    "TimestampNTZType",
    "PostgreSQL timestamp",
    "a wall time in a DST gap an hour later (02:30 → 03:30)",
    "the wall time",
)
LISTED: list[Listed] = [
    Listed("ntz-gap", ("pg",), ("ntz",), ("timestamp",), edge=("dst-gap",), docs=NTZ_GAP),
    Listed(
        "ntz-other-zone",
        ("pg",),
        ("ntz",),
        ("timestamptz",),
        zone=("other",),
        docs=(
            "TimestampNTZType",
            "PostgreSQL timestamptz, the Spark session's zone set other than the JVM's",
            "the wall time as the JVM zone's instant (in that zone's DST gap, an hour later: 02:30 → 03:30 New "
            "York, though the session's zone has no gap there)",
            "the wall time's instant in the session's zone, as Spark's cast to TimestampType",
        ),
    ),
    Listed(
        "ntz-overlap",
        ("pg",),
        ("ntz",),
        ("timestamptz",),
        edge=("dst-overlap",),
        zone=("same", "unset"),  # (a session that never set its zone runs in the JVM's)
        docs=(
            "TimestampNTZType",
            "PostgreSQL timestamptz",
            "a wall time in a DST overlap as the later instant",
            "the earlier one, as Spark's cast to TimestampType",
        ),
    ),
    Listed(
        "ntz-maria",
        ("mariadb",),
        ("ntz",),
        ("date", "datetime", "datetime3", "datetime6", "timestamp", "timestamp6"),
        docs=(
            "TimestampNTZType",
            "MariaDB DATETIME(6), TIMESTAMP(6), DATE",
            "the wall time shifted by the session's UTC offset (in a DATE, midnight west of UTC is the day before)",
            "the wall time (its date)",
        ),
    ),
    Listed(
        "ts-other-zone",
        ("pg", "mariadb"),
        ("ts",),
        ("timestamp", "datetime", "datetime3", "datetime6", "timestamp6"),
        zone=("other",),
        docs=(
            "TimestampType",
            "PostgreSQL timestamp, MariaDB DATETIME(6), TIMESTAMP(6)",
            "the instant's wall time in the JVM's default zone",
            "its wall time in the session zone",
        ),
    ),
    Listed(
        "ts-date-other-zone",
        ("pg", "mariadb"),
        ("ts",),
        ("date",),
        zone=("other",),
        docs=(
            "TimestampType at midnight in the session zone",
            "PostgreSQL date, MariaDB DATE, the Spark session's zone set other than the JVM's",
            "the instant's date in the JVM's default zone (its time of day dropped)",
            "its date in the session zone (a time of day there is refused)",
        ),
    ),
    Listed(
        "string-other-zone",
        ("pg",),
        ("string",),
        ("timestamptz",),
        zone=("other",),
        docs=(
            "StringType without an offset (`2024-01-15 10:00:00`), with `stringtype=unspecified` in the URL",
            "PostgreSQL timestamptz, the Spark session's zone set other than the JVM's",
            "the server's reading of it in the JVM's zone (the session's `TimeZone`)",
            "the server's reading of it in the Spark session's zone (the branch session's `TimeZone`)",
        ),
    ),
    Listed(
        "date-other-zone",
        ("pg",),
        ("date",),
        ("timestamptz",),
        zone=("other",),
        docs=(
            "DateType",
            "PostgreSQL timestamptz, the Spark session's zone set other than the JVM's",
            "midnight in the JVM's default zone",
            "midnight in the session zone, as Spark's cast to TimestampType",
        ),
    ),
    Listed(
        "ts-other-zone-range",
        ("mariadb",),
        ("ts",),
        ("datetime", "datetime3", "datetime6", "timestamp", "timestamp6"),
        kind=("xasink-refuses", "jdbc-refuses"),
        edge=("far-max", "far-min", "epoch", "y2038"),
        zone=("other",),
        docs=(
            "TimestampType at the ends of the column's range",
            "MariaDB DATETIME, TIMESTAMP, with the Spark session's zone set other than the JVM's",
            "its wall time in the JVM's zone, refused where that is past the range (the epoch in New York is "
            "before a TIMESTAMP's first second)",
            "its wall time in the session zone, refused where that is past the range (DATETIME: year 10000; "
            "TIMESTAMP: 2038-01-19 03:14:07 read in the server's zone), naming the range",
        ),
    ),
    Listed(
        "string-into-other-types",
        ("pg",),
        ("string",),
        tuple(c for c in COLUMNS["pg"] if c not in ("text", "varchar10", "char5")),
        kind=("jdbc-refuses",),
        docs=(
            "StringType",
            "PostgreSQL columns of every type but text, varchar and char: numbers, boolean, bytea, dates, jsonb, "
            "uuid, inet, an enum, an array (a URL without `stringtype=unspecified`)",
            'refuses ("column is of type jsonb but expression is of type character varying"), its NULLs too',
            "the server's reading of the string: xasink takes `stringtype=unspecified` in the URL and needs it not",
        ),
    ),
    Listed(
        "null-of-another-type",
        ANY,
        ANY,
        ANY,
        kind=("xasink-refuses",),
        edge=("null",),
        docs=(
            "a type xasink does not write into the column (a timestamp into an integer)",
            "any",
            "NULLs, where the server takes a NULL of the setter's type (it refuses values, not types); values "
            "where a row of this table names the pair",
            "refuses the column before anything is written, whatever its values",
        ),
    ),
    Listed(
        "calendar-edges",
        ANY,
        ("date", "ts", "ntz"),
        ANY,
        edge=("gap-1582", "far-min", "lmt-1850"),
        docs=(
            "DateType, TimestampType, TimestampNTZType",
            "date and timestamp columns",
            "a date before 1582-10-15 as `java.sql`'s Julian calendar reads it (one in the 1582 gap ten days "
            "later), a time before 1883 with its zone's standard offset",
            "Spark's value: the proleptic Gregorian date, the zone's local mean time",
        ),
    ),
    Listed(
        "temporal-into-bytea",
        ("pg",),
        ("date", "ts", "ntz"),
        ("bytea",),
        kind=("xasink-refuses",),
        docs=(
            "DateType, TimestampType, TimestampNTZType",
            "PostgreSQL bytea",
            "the value's text as bytes (pgjdbc sends it untyped, and bytea reads any text)",
            "refuses the column",
        ),
    ),
    Listed(
        "temporal-into-text",
        ("pg", "mariadb"),
        ("date", "ts", "ntz"),
        ("text", "varchar10", "char5", "binary4", "varbinary8", "blob"),
        kind=("xasink-refuses",),
        docs=(
            "DateType, TimestampType, TimestampNTZType",
            "PostgreSQL text, varchar, char; MariaDB CHAR, VARCHAR, TEXT, BINARY, VARBINARY, BLOB",
            "the JDBC driver's text of the value in the JVM's zone (pgjdbc adds its offset: `2024-01-15 -05`, "
            "`2026-01-15 12:00:00.123456-05`)",
            'refuses it ("format it in Spark first"): the Python workers cannot see the JVM\'s zone; '
            "`date_format` or a cast to string gives the text you choose",
        ),
    ),
    Listed(
        "number-into-temporal",
        ("mariadb",),
        ("bool", "byte", "short", "int", "long", "float", "double", "dec10_2", "dec38_18", "dec38_0"),
        ("date", "datetime", "datetime3", "datetime6", "timestamp", "timestamp6", "time"),
        kind=("xasink-refuses",),
        docs=(
            "BooleanType, the integer, floating and decimal types",
            "MariaDB DATE, DATETIME, TIMESTAMP, TIME",
            "the server's reading of the number as `YYYYMMDDhhmmss` digits (0 is the zero date "
            "`0000-00-00 00:00:00`), or it refuses the value",
            "refuses the column: a number is no date. Convert it in Spark first (`to_date`, `timestamp_seconds`)",
        ),
    ),
    Listed(
        "bool-into-year",
        ("mariadb",),
        ("bool",),
        ("year",),
        kind=("xasink-refuses",),
        docs=("BooleanType", "MariaDB YEAR", "the year 2001 for true, 0000 for false", "refuses the column"),
    ),
    Listed(
        "zone-readers-other-zone",
        ("pg",),
        ("feature",),
        ZONE_READERS,
        zone=("other",),
        path=("bulk", "upsert"),
        docs=(
            "any",
            "PostgreSQL: a default or trigger reading the session's zone (`current_setting('TimeZone')`, "
            "`localtimestamp`), with the Spark session's zone set other than the JVM's",
            "its value in the JVM's zone",
            "its value in the Spark session's zone",
        ),
    ),
    Listed(
        "zone-readers-apply",
        ("pg",),
        ("feature",),
        ZONE_READERS,
        path=("overwrite", "changes"),
        docs=(
            "any",
            "PostgreSQL, modes overwrite, replaceWhere and change-data: a default or trigger reading the "
            "session's zone",
            "its value in the JVM's zone",
            "its value in the server's zone: the rows reach the table in the apply, a session of the driver or "
            "of `xasink recover`, which no Spark session's zone reaches",
        ),
    ),
    Listed(
        "auto-increment-overwrite",
        ("mariadb",),
        ("feature",),
        ("auto", "auto-zero", "auto-null"),
        path=("overwrite",),
        docs=(
            "any",
            "MariaDB AUTO_INCREMENT, mode overwrite",
            "values from 1 again (`truncate=true` truncates, which restarts the counter)",
            "values going on from the table's counter (the old rows are deleted, the table never truncated)",
        ),
    ),
    # issue 38's drop-in conversions: where xasink refuses what JDBC writes, on purpose (tests/test_values_dropin.py)
    Listed(
        "fraction-into-int",
        ("pg", "mariadb"),
        ("float", "double", "dec10_2", "dec38_18"),
        ("smallint", "integer", "bigint", "tinyint", "tinyint-u", "smallint-u", "int", "int-u", "bigint-u", "year"),
        kind=("xasink-refuses",),
        docs=(
            "DoubleType, FloatType, DecimalType with a fraction",
            "an integer column, MariaDB YEAR",
            "the number rounded by the server (2.5 is 2 on PostgreSQL, 3 on MariaDB; 5.50 is 6)",
            "refuses it, naming the value: the rounding loses the fraction and differs between the databases. "
            "Round it in Spark first",
        ),
    ),
    Listed(
        "time-into-date",
        ANY,
        ("ts", "ntz"),
        ("date",),
        kind=("xasink-refuses",),
        docs=(
            "TimestampType, TimestampNTZType with a time of day",
            "a date column",
            "its date (the time dropped)",
            "refuses it, naming the value: the time is lost. Truncate it in Spark first (`to_date`)",
        ),
    ),
    Listed(
        "double-into-maria-text",
        ("mariadb",),
        ("float", "double"),
        ("text", "varchar10", "char5", "json"),
        kind=("xasink-refuses",),
        docs=(
            "FloatType, DoubleType",
            "MariaDB CHAR, VARCHAR, TEXT, JSON",
            "the server's text of the literal Java prints (`1.0` for 1.0, `1e300` for 1.0E300, `0.00001` for 1.0E-5)",
            "refuses it (\"cast it in Spark first\"): that text follows Java's and the server's formatting rules, "
            "not the value's; format it in Spark (`format_number`, a cast to string)",
        ),
    ),
    Listed(
        "float-max-maria",
        ("mariadb",),
        ("float",),
        ANY,
        kind=("value", "jdbc-refuses"),
        edge=("max",),
        docs=(
            "FloatType, the largest float (3.4028235E38)",
            "MariaDB FLOAT, DOUBLE",
            "the double nearest Java's text of it, 3.4028235e38; a FLOAT column refuses that text (out of range)",
            "the float's exact value, 3.4028234663852886e38, as Spark casts it to double (a FLOAT column stores it)",
        ),
    ),
    Listed(
        "float-subnormal-maria",
        ("mariadb",),
        ("float",),
        ANY,
        edge=("subnormal",),
        docs=(
            "FloatType, the smallest subnormal float",
            "MariaDB DOUBLE",
            "1.4e-45, the double nearest Java 17's text of it (`1.4E-45`)",
            "1e-45, the double nearest its shortest text (both are the same float in a FLOAT column)",
        ),
    ),
    # arrays: no cell of the matrix yet (its array cells are ints and strings into int[] and text[]);
    # tests/test_values_dropin.py writes each
    Listed(
        "timestamp-arrays",
        (),
        ANY,
        ANY,
        docs=(
            "ArrayType of TimestampType",
            "PostgreSQL timestamptz[], timestamp[]",
            'refuses ("Unable to find server array type for provided name TIMESTAMP WITH TIME ZONE")',
            "the instants (timestamp[]: their wall times in the session zone), as for a TimestampType value",
        ),
    ),
    Listed(
        "ntz-array-null",
        (),
        ANY,
        ANY,
        docs=(
            "ArrayType of TimestampNTZType with a NULL element",
            "PostgreSQL timestamp[], timestamptz[]",
            "refuses (a NullPointerException)",
            "the wall times and the NULL",
        ),
    ),
    Listed(
        "binary-arrays",
        (),
        ANY,
        ANY,
        docs=(
            "ArrayType of BinaryType",
            "PostgreSQL bytea[]",
            'refuses ("byte[] nested inside Object[]")',
            "the bytes",
        ),
    ),
    Listed(
        "string-arrays-into-other-types",
        ("pg",),
        ("strings",),
        ("int[]",),
        kind=("jdbc-refuses",),
        docs=(
            "ArrayType of StringType",
            "PostgreSQL arrays of numbers, jsonb, uuid, inet, an enum...",
            'refuses ("column is of type uuid[] but expression is of type text[]"), with `stringtype=unspecified` too',
            "the server's reading of each string, as for a string into such a column",
        ),
    ),
    Listed(
        "array-into-text",
        ("pg",),
        ("ints", "strings"),
        ("text", "varchar10", "char5"),
        kind=("xasink-refuses",),
        docs=(
            "ArrayType",
            "PostgreSQL text, varchar",
            "the array's text (`{1,2}`)",
            "refuses it (an array goes into an array column; write `to_json()` or `array_join()` for text)",
        ),
    ),
    Listed(
        "nested-arrays",
        (),
        ANY,
        ANY,
        docs=(
            "ArrayType of ArrayType",
            "PostgreSQL arrays",
            "a multi-dimensional array",
            "refuses it (xasink writes one dimension; flatten it, or write it as text with to_json())",
        ),
    ),
    Listed(  # column matching: tests/test_values_cases.py (pg-both-cases-*), no cell of the matrix
        "both-cases",
        (),
        ANY,
        ANY,
        docs=(
            "any",
            'a table with columns `"ID"` and `id`, the DataFrame\'s `id`',
            'the table\'s first column whose name is equal without case (`"ID"` if it comes first)',
            "the column spelled exactly (`id`)",
        ),
    ),
]

NUMBERS = ("bool", "byte", "short", "int", "long", "float", "double", "dec10_2", "dec38_18", "dec38_0")
LISTED += [
    Listed(
        "numbers-into-maria-enum-set",
        ("mariadb",),
        NUMBERS,
        ("enum", "set"),
        kind=("xasink-refuses",),
        docs=(
            "BooleanType, the integer, floating and decimal types",
            "MariaDB ENUM, SET",
            "the member at that index (ENUM: 1 is the first member; SET: the members of the number's bits)",
            'refuses it ("cast it in Spark first"): a number is almost never meant as an index; write the '
            "member's name as a string",
        ),
    ),
    Listed(  # shard 2 of stop 60: the matrix's binary edges are no member's name but the empty bytes, the empty set
        "binary-into-maria-enum-set",
        ("mariadb",),
        ("binary",),
        ("enum", "set"),
        kind=("xasink-refuses",),
        docs=(
            "BinaryType",
            "MariaDB ENUM, SET",
            "the member named by the bytes read as text (empty bytes into a SET: the empty set); other bytes are "
            "refused by the server (in strict mode)",
            "refuses the column (\"encode it in Spark first\": `decode(col, 'UTF-8')` for bytes that are a member's "
            "name)",
        ),
    ),
    Listed(
        "other-into-maria-bit",
        ("mariadb",),
        ("float", "double", "dec10_2", "dec38_18", "dec38_0", "string", "binary", "date", "ts", "ntz"),
        ("bit1", "bit8"),
        kind=("xasink-refuses",),
        docs=(
            "FloatType, DoubleType, DecimalType, StringType, BinaryType, DateType, TimestampType",
            "MariaDB BIT",
            "the server's conversion of the value (a number with a fraction rounded to a whole one)",
            "refuses the column: a BIT column takes BooleanType and the integer types, their bits as Spark's JDBC "
            "writer sends them",
        ),
    ),
]

# the gaps `python -m tests.values_matrix --refused` found once the list above was settled (stop 55: 379 cells,
# 347 refused by Spark's JDBC writer too, these 32 written by it); every other refusal by type is refused by both
LISTED += [
    Listed(
        "binary-into-pg-text",
        ("pg",),
        ("binary",),
        ("text", "varchar10", "char5"),
        kind=("xasink-refuses",),
        docs=(
            "BinaryType",
            "PostgreSQL text, varchar, char",
            "the server's text of the bytes (`\\x0102`, as the server's `bytea_output` has it)",
            "refuses it (\"encode it in Spark first\": `hex()`, `base64()`, or `decode(col, 'UTF-8')` for bytes "
            "that are text)",
        ),
    ),
    Listed(
        "numbers-into-maria-binary",
        ("mariadb",),
        NUMBERS,
        ("binary4", "varbinary8", "blob"),
        kind=("xasink-refuses",),
        docs=(
            "BooleanType, the integer, floating and decimal types",
            "MariaDB BINARY, VARBINARY, BLOB",
            "the bytes of the number's text (1 as `0x31`, in BINARY(4) `0x31000000`)",
            "refuses it: a number's bytes are not its digits. Cast it in Spark to the bytes you mean "
            "(`col.cast('string')` gives the digits)",
        ),
    ),
    Listed(
        "timestamp-into-time",
        ("mariadb", "pg"),
        ("ts", "ntz"),
        ("time", "timetz"),
        kind=("xasink-refuses",),
        docs=(
            "TimestampType, TimestampNTZType",
            "MariaDB TIME; PostgreSQL time, timetz (no matrix column: a new user's review)",
            "its time of day (the date dropped)",
            "refuses the column: the date would be lost. Format it in Spark first "
            "(`date_format(col, 'HH:mm:ss.SSSSSS')`)",
        ),
    ),
    Listed(
        "numbers-into-money",
        ("pg",),
        NUMBERS[1:],
        ("money",),
        kind=("xasink-refuses",),
        docs=(
            "the integer, floating and decimal types",
            "PostgreSQL money (no matrix column: a new user's review)",
            "the amount, rounded to the server's `lc_monetary` fraction digits",
            "refuses the column: money's scale and text follow the server's locale; write a numeric column",
        ),
    ),
]


def match(cell: Cell, kind: str) -> Listed | None:
    """The first entry of :data:`LISTED` that accepts this cell's difference, or None."""
    return next((entry for entry in LISTED if entry.matches(cell, kind)), None)


def docs_table() -> str:
    """docs/types.md's table of deliberate differences, rendered from :data:`LISTED`."""
    lines = ["| Spark type | column | Spark's JDBC writer stores | xasink stores |", "|---|---|---|---|"]
    for entry in LISTED:
        if entry.docs is not None:
            row = "| " + " | ".join(entry.docs) + " |"
            if row not in lines:
                lines.append(row)
    return "\n".join(lines)
