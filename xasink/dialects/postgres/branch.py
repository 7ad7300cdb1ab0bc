"""The executor's PostgreSQL branch: one ADBC connection, rows by binary COPY (or an unnest upsert), PREPAREd."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa

from xasink.dialects.branch_session import BranchSession
from xasink.dialects.decimal_text import decimal_text
from xasink.dialects.postgres.arrays import array_text
from xasink.dialects.postgres.sql import (
    SLOT_CAPACITY,
    SLOT_MARK,
    SLOT_MARKS,
    advisory_key,
    insert_sql,
    string_literal,
    upsert_sql,
)
from xasink.dialects.spare import Spare
from xasink.dialects.values import BranchSettings, TargetPlan, check_upsert_keys
from xasink.errors import BranchError, PreflightError
from xasink.protocol.xid import Xid

log = logging.getLogger("xasink.dialects.postgres")


class BranchHost(Protocol):
    """What a branch uses of its dialect (:class:`.dialect.PostgresDialect`), which imports this module."""

    settings: BranchSettings
    spare: Spare[Any] | None
    upsert_chunk_rows: int

    def adbc_connect(self) -> Any: ...

    def where(self) -> str: ...

    def branch_error(self, exc: BaseException, xid: Xid, plan: TargetPlan) -> BranchError: ...


def set_time_zone(zone: str | None) -> str | None:
    """The statement that sets a session to Spark's zone: a region ID (America/New_York, UTC) by name, an
    offset (+08:00) as ISO 8601 reads it (PostgreSQL reads '+08:00' the POSIX way, west of Greenwich); None for
    a name whose offset the two read differently (GMT+08:00): the session keeps the server's zone then."""
    if not zone:
        return None
    if re.fullmatch(r"[+-]\d\d:\d\d", zone):
        return f"SET TIME ZONE INTERVAL '{zone}' HOUR TO MINUTE"  # (its characters checked just above)
    java_offset = re.search(r"[+-]\d", zone) is not None and not zone.startswith("Etc/")  # GMT+08:00: ISO's sign
    if re.fullmatch(r"[A-Za-z][A-Za-z0-9_+/-]*", zone) and not java_offset:
        return f"SET TimeZone = {string_literal(zone)}"
    return None


class PostgresBranch(BranchSession):
    """A branch: one ADBC connection in a transaction, rows loaded by binary COPY, then PREPAREd."""

    def __init__(self, dialect: BranchHost, xid: Xid, plan: TargetPlan) -> None:
        super().__init__(xid, plan)
        self.dialect = dialect
        spare = dialect.spare.take() if dialect.spare is not None else None
        self.conn = spare if spare is not None else dialect.adbc_connect()
        self.cursor = self.conn.cursor()
        settings = [f"SET lock_timeout = {int(dialect.settings.lock_timeout) * 1000}"]
        zone = set_time_zone(plan.time_zone)
        if zone is not None:  # the Spark session's zone, as Spark's JDBC writer's sessions take the JVM's: defaults
            # and triggers that read the zone (localtimestamp, now()::text) store what they store for JDBC
            settings.append(zone)
        try:
            try:
                self.cursor.execute(settings[0])
            except Exception as exc:  # noqa: BLE001 - a spare the server dropped: nothing written, connect anew
                if spare is None:
                    raise
                log.debug("spare branch connection unusable (%s): connecting anew", exc)
                self._close()
                self.conn = dialect.adbc_connect()
                self.cursor = self.conn.cursor()
                self.cursor.execute(settings[0])
            for statement in settings[1:]:
                self.cursor.execute(statement)
        except Exception as exc:
            self.rollback()
            raise dialect.branch_error(exc, xid, plan) from None
        if dialect.spare is not None:
            dialect.spare.refill()

    def reserve_slot(self) -> None:
        try:
            self.cursor.execute(SLOT_MARK)
            self.cursor.fetchall()  # held until the connection closes, just after its PREPARE
            self.cursor.execute(SLOT_MARKS)
            marks = int(self.cursor.fetchone()[0])
            self.cursor.execute(SLOT_CAPACITY)
            limit, prepared = (int(v) for v in self.cursor.fetchone())
        except Exception as exc:
            raise self.dialect.branch_error(exc, self.xid, self.plan) from None
        if prepared + marks > limit:  # this branch is one of the marks
            raise PreflightError(
                f"PostgreSQL at {self.dialect.where()} has no free prepared-transaction slot for partition "
                f"{self.xid.partition} of this write (max_prepared_transactions = {limit}: {prepared} prepared, "
                f"{marks} branches being written): the write has more partitions than free slots. Coalesce it "
                "(numPartitions) or raise max_prepared_transactions; 'xasink recover' finishes what earlier runs "
                "left prepared. Nothing of this write is visible."
            )

    def load(self, batches: Iterator[pa.RecordBatch]) -> int:
        count = 0
        source_error: list[BaseException] = []

        def counted() -> Iterator[pa.RecordBatch]:
            nonlocal count
            try:
                for batch in batches:
                    count += batch.num_rows
                    yield batch
            except BaseException as exc:
                source_error.append(exc)
                raise

        try:
            if self.plan.upsert_keys:
                self._upsert(counted())
            elif self.plan.server_casts:  # COPY takes each column's own type only: insert, the server casts
                self._insert(counted(), insert_sql(self.plan), keys=None)
            else:
                reader = pa.RecordBatchReader.from_batches(self.plan.arrow_schema, counted())
                self.cursor.adbc_ingest(self.plan.table, reader, mode="append", db_schema_name=self.plan.schema)
        except BranchError:
            raise
        except Exception as exc:
            if source_error:  # the rows' own iterator failed (e.g. a value that does not fit): ADBC wraps it
                raise source_error[0] from None
            raise self.dialect.branch_error(exc, self.xid, self.plan) from None
        return count

    def _upsert(self, batches: Iterator[pa.RecordBatch]) -> None:
        """Merge each chunk with one INSERT ... SELECT FROM unnest(arrays) ... ON CONFLICT DO UPDATE.

        Chosen over a staging table (temporary tables cannot be PREPAREd; an UNLOGGED one needs
        CREATE on the schema and churns the catalog) after measuring both: the merge dominates
        either way (benchmarks/upsert_strategies.py).  Duplicate keys in a partition: the last row wins.
        """
        keys = [self.plan.arrow_schema.get_field_index(k) for k in self.plan.upsert_keys]
        self._insert(batches, upsert_sql(self.plan), keys)

    def _insert(self, batches: Iterator[pa.RecordBatch], sql: str, keys: list[int] | None) -> None:
        """Run sql once per chunk, each column an array parameter; a column the server casts goes as it came
        (a double) or as text (a decimal: its display scale, which a binary numeric loses); an array column as
        array text, which the statement reads back (postgres/arrays.py)."""
        step = self.dialect.upsert_chunk_rows
        as_text = {n for n, _ in self.plan.server_casts}
        for batch in batches:
            if keys is not None:
                check_upsert_keys(batch, self.plan, keys, self.xid.partition)
            columns = [
                array_text(col)
                if pa.types.is_list(col.type)
                else decimal_text(col)
                if name in as_text and pa.types.is_decimal(col.type)
                else col
                for name, col in zip(batch.schema.names, batch.columns, strict=True)
            ]
            for start in range(0, batch.num_rows, step):
                offsets = pa.array([0, min(step, batch.num_rows - start)], type=pa.int32())
                params = pa.RecordBatch.from_arrays(
                    [pa.ListArray.from_arrays(offsets, col.slice(start, step)) for col in columns],
                    names=[f"p{i}" for i in range(len(columns))],
                )
                self.cursor.execute(sql, parameters=params)

    def hold_prepare_lock(self, names: list[str]) -> None:
        # shared: the run's tasks never wait for each other; a session-level lock outlives PREPARE TRANSACTION
        try:
            self.cursor.execute("SELECT pg_advisory_lock_shared($1)", parameters=(advisory_key(names[0]),))
            self.cursor.fetchall()
        except Exception as exc:
            raise self.dialect.branch_error(exc, self.xid, self.plan) from None

    def prepare(self) -> None:
        try:
            self.cursor.execute(f"PREPARE TRANSACTION {string_literal(self.xid.gid)}")
            self.cursor.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", parameters=(self.xid.gid,))
            row = self.cursor.fetchone()
        except Exception as exc:
            raise self.dialect.branch_error(exc, self.xid, self.plan) from None
        finally:
            self._close()
        if not row or row[0] != 1:
            raise BranchError(f"branch {self.xid} was not prepared (the server rolled it back); nothing of it remains")

    def rollback(self) -> None:
        try:
            self.conn.rollback()
        except Exception as exc:  # noqa: BLE001 - the connection may be gone; the server rolls back then
            log.debug("rollback of %s: %s", self.xid, exc)
        self._close()

    def _close(self) -> None:
        for obj in (self.cursor, self.conn):
            try:
                obj.close()
            except Exception:  # noqa: BLE001,S110 - closing a dead connection
                pass
