"""Grants that work as written: a writer set up exactly as docs/operations.md and ``xasink ddl`` say.

A DBA creates the decision log from ``xasink ddl postgres`` / ``xasink ddl mysql`` in a database of its own and
runs the GRANT lines of its header for the writing user, plus INSERT on the target table (docs/operations.md,
Privileges); the writer may not CREATE anything.  It writes alone (``xasink.write``) and in a multi-target
transaction (``xasink.transaction``, which needs the fifth table, ``xasink_parts``).  Without one of the
documented grants, a write is refused before any branch opens with a :class:`PreflightError` naming the grant,
never a :class:`BatchAbortedError` ("run it again", which could never succeed).  On PostgreSQL and MariaDB.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

import xasink
from tests import targets
from tests.doc_cases import raises
from tests.harness import cli, expected, frame
from tests.targets import Target
from xasink.ops.ddl import ddl

pytestmark = [pytest.mark.spark]

PASSWORD = "Gr4nt-pw"


@dataclass
class Writer:
    url: str  # the writing user's URL of the DBA's database
    table: str
    revoke: str  # a statement that takes the parts table's grant away again (%s: the table)
    admin: Target  # the DBA's view of the database


def grant_lines(dialect: str) -> list[str]:
    """The GRANT statements of the header ``xasink ddl`` prints, as a DBA copies them."""
    lines = [ln.removeprefix("--").strip() for ln in ddl(dialect).splitlines() if ln.startswith("--   GRANT")]
    assert lines, "the DDL's header lists the grants"
    return [ln.split(";")[0] for ln in lines if "MySQL 8 only" not in ln]  # MariaDB has no XA_RECOVER_ADMIN


def statements(text: str) -> list[str]:
    return [s.strip() for s in re.sub(r"--[^\n]*", "", text).split(";") if s.strip()]


@contextmanager
def documented_writer(db: Target) -> Iterator[Writer]:
    """A database of the test's own, its log made from the DDL by the administrator, and a writing user with
    exactly the documented grants (and no CREATE: PostgreSQL 15's public schema gives PUBLIC none)."""
    name, user = f"xsg_{uuid.uuid4().hex[:8]}", f"xsg_w_{uuid.uuid4().hex[:6]}"
    table = "orders"
    if db.kind == targets.POSTGRESQL:
        admin_base = targets.libpq_url(db.url)
        db.execute(f'CREATE DATABASE "{name}"')
        admin_url = re.sub(r"/[^/?]*$", f"/{name}", admin_base)
        db.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{PASSWORD}'")
        with targets.connect(admin_url) as conn, conn.cursor() as cur:
            cur.execute(ddl("postgres"))
            for grant in grant_lines("postgres"):
                cur.execute(re.sub(r"\bTO etl$", f"TO {user}", grant))
            cur.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
            cur.execute(f"GRANT INSERT ON {table} TO {user}")  # Privileges: INSERT on the target table
        host = re.search(r"@([^:/]+):(\d+)", admin_base)
        assert host is not None
        url = f"postgresql://{user}:{PASSWORD}@{host.group(1)}:{host.group(2)}/{name}"
        revoke = f"REVOKE ALL ON xasink_parts FROM {user}"
    else:
        admin = targets.mariadb_params(db.admin_url)  # type: ignore[attr-defined]
        who = f"'{user}'@'{admin['host']}'"
        with targets.mariadb_connect(db.admin_url, database=False) as conn, conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
            cur.execute(f"USE `{name}`")
            for statement in statements(ddl("mysql")):
                cur.execute(statement)
            cur.execute(f"CREATE USER {who} IDENTIFIED BY '{PASSWORD}'")
            for grant in grant_lines("mysql"):
                cur.execute(grant.replace("shop.", f"`{name}`.").replace("'etl'@'%'", who))
            cur.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text) ENGINE=InnoDB")
            cur.execute(f"GRANT INSERT ON `{name}`.{table} TO {who}")
            # the owner wait reads INNODB_TRX with it (docs/operations.md, MariaDB); without it, two branches
            # committed at once met a race in that wait's fallback (reported to its owner, dialects/mysql/owner.py)
            cur.execute(f"GRANT PROCESS ON *.* TO {who}")
        url = f"mysql://{user}:{PASSWORD}@{admin['host']}:{admin['port']}/{name}"
        admin_url = db.admin_url.rsplit("/", 1)[0] + "/" + name  # type: ignore[attr-defined]
        revoke = f"REVOKE ALL PRIVILEGES ON `{name}`.xasink_parts FROM {who}"
    try:
        yield Writer(url, table, revoke, targets.make_target(db.kind, admin_url))
    finally:
        if db.kind == targets.POSTGRESQL:
            db.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            db.execute(f"DROP ROLE {user}")
        else:
            with targets.mariadb_connect(db.admin_url, database=False) as conn, conn.cursor() as cur:  # type: ignore[attr-defined]
                cur.execute(f"DROP DATABASE `{name}`")
                cur.execute(f"DROP USER {who}")


def written(w: Writer) -> list[tuple[int, str]]:
    return [(int(i), str(n)) for i, n in w.admin.rows(w.table, "id")]


def test_a_writer_granted_as_the_docs_say_writes_alone_and_in_a_transaction(db: Target, spark: SparkSession) -> None:
    with documented_writer(db) as w:
        sink = f"g{uuid.uuid4().hex[:8]}"
        result = xasink.write(frame(spark, range(10), 2), w.url, w.table, sink_id=sink, batch_id=1)
        assert (result.rows, result.skipped) == (10, False)
        with xasink.transaction(sink_id=sink + "tx", batch_id=1) as tx:
            tx.write(frame(spark, range(10, 20), 2), w.url, w.table)
        assert tx.result is not None and tx.result.rows == 10
        assert written(w) == expected(range(20))
        assert w.admin.prepared(sink) == [] and w.admin.prepared(sink + "tx") == []


def test_a_missing_grant_is_a_preflight_error_naming_it(db: Target, spark: SparkSession) -> None:
    """The parts table's grant taken away: a transaction's write (which records its part there) and a single
    write (whose trim and recovery read it) are refused before any branch, saying which GRANT is missing."""
    with documented_writer(db) as w:
        w.admin.execute(w.revoke)
        sink = f"g{uuid.uuid4().hex[:8]}"
        with raises(xasink.PreflightError) as info:
            with xasink.transaction(sink_id=sink, batch_id=1) as tx:
                tx.write(frame(spark, range(10), 2), w.url, w.table)
        message = str(info.value)
        assert "xasink_parts" in message and "GRANT" in message, message
        with raises(xasink.PreflightError, match="xasink_parts"):
            xasink.write(frame(spark, range(10), 2), w.url, w.table, sink_id=sink + "w", batch_id=1)
        assert written(w) == [] and w.admin.prepared(sink) == [] and w.admin.prepared(sink + "w") == []
        assert PASSWORD not in message


def test_a_database_error_of_the_checks_no_rerun_cures_is_a_preflight_error(db: Target, spark: SparkSession) -> None:
    """The log's batches table taken away from the writer: the checks before the write fail on the server's
    "permission denied", which running again cannot cure.  A PreflightError with the cause (it was the raw
    error), never BatchAbortedError's "run it again"; nothing written, nothing prepared."""
    with documented_writer(db) as w:
        w.admin.execute(w.revoke.replace("xasink_parts", "xasink_batches"))
        sink = f"g{uuid.uuid4().hex[:8]}"
        with raises(xasink.PreflightError) as info:
            xasink.write(frame(spark, range(10), 2), w.url, w.table, sink_id=sink, batch_id=1)
        message = str(info.value)
        assert not isinstance(info.value, xasink.BatchAbortedError), message
        assert "checking the server and table" in message and "xasink_batches" in message, message
        assert PASSWORD not in message
        assert written(w) == [] and w.admin.prepared(sink) == []


def test_a_missing_table_is_a_preflight_error_for_a_writer_with_the_documented_grants(
    db: Target, spark: SparkSession
) -> None:
    """MariaDB answers DESCRIBE of a table the user holds no privilege on (a missing one) with "SELECT command
    denied" (1142), not "no such table": the writer got BatchAbortedError (xasink.write) and Spark's
    AnalysisException with the raw OperationalError (format), where the DBA's root got the PreflightError
    docs/errors.md promises.  Refused before any branch, with createTable=false and by default (no CREATE)."""
    with documented_writer(db) as w:
        sink = f"g{uuid.uuid4().hex[:8]}"
        creates: tuple[dict[str, Any], ...] = ({"createTable": False}, {})
        for create in creates:
            with raises(xasink.PreflightError, match=r"no_such_table.*create it") as info:
                xasink.write(frame(spark, range(10), 2), w.url, "no_such_table", sink_id=sink, batch_id=1, **create)
            assert PASSWORD not in str(info.value)
            with raises(xasink.PreflightError, match=r"no_such_table.*create it"):
                with xasink.spark_errors():
                    writer = frame(spark, range(10), 2).write.format("xasink").option("url", w.url)
                    writer.option("dbtable", "no_such_table").options(**create).mode("append").save()
        assert w.admin.prepared(sink) == []


def test_a_typo_in_the_log_options_is_not_found_for_the_writer_user(db: Target) -> None:
    """Status and recover run as the writer (the documented grants): a --journal-prefix or --journal-schema
    typo said "SELECT command denied ... XA_RECOVER_ADMIN" on MariaDB (it answers DESCRIBE of a table the user
    has no right on so, a missing one too) instead of the missing log that docs/monitoring.md describes."""
    with documented_writer(db) as w:
        for typo in (("--journal-prefix", "xasnk_"), ("--journal-schema", "nosuch")):
            code, out, err = cli("status", "--url", w.url, *typo)
            assert code == 3 and "decision log" in err and "not found" in err, out + err
            assert "denied" not in out + err and PASSWORD not in out + err, out + err
            code, out, err = cli("recover", "--url", w.url, *typo)
            assert code == 2 and "decision log" in err and "not found" in err, out + err
        assert cli("status", "--url", w.url)[0] == 0


@pytest.mark.parametrize("dialect", ["postgres", "mysql"])
def test_the_ddl_header_and_the_docs_grant_every_table_of_the_log(dialect: str) -> None:
    """Five tables: what ``xasink ddl`` creates is what its header and docs/operations.md grant."""
    created = set(re.findall(r"^CREATE TABLE IF NOT EXISTS (\w+)", ddl(dialect), flags=re.M))
    assert created == {f"xasink_{t}" for t in ("log", "sinks", "batches", "claims", "parts")}
    granted = {name for line in grant_lines(dialect) for name in re.findall(r"\b(?:\w+\.)?(xasink_\w+)", line)}
    assert granted == created
    docs = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text(encoding="utf-8")
    [row] = [ln for ln in docs.splitlines() if ln.startswith("| writer, decision log |")]
    assert set(re.findall(r"`(xasink_\w+)`", row)) == created
