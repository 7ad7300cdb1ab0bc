"""A Spark driver that writes one DataFrame through Spark's JDBC writer and through xasink (tests/test_values.py).

Spark's JDBC writer converts values with the JVM's default time zone, and one JVM serves a whole pytest
process: so the comparison runs in this process of its own, with the session time zone and the JVM's
(``-Duser.timezone``) both set to ``VALUES_TZ`` and the two JDBC drivers on the class path.

It serves requests, one JSON object a line on stdin, and answers each with one line ``VALUES {json}`` on
stdout (Spark logs go to stderr).  A request names a Parquet file (read with its own schema: an Arrow
timestamp with a zone is Spark's TimestampType, one without is TimestampNTZType), and for each writer the
URL and table to write it into (into tables that exist); ``mode`` is both writers' save mode (``append``
by default, ``overwrite``: JDBC with ``truncate=true``); ``xasink_options`` are xasink's options of the
write path (``upsertKeyColumns``, ``deleteFlagColumn``), ``jdbc_drop`` the columns JDBC's frame leaves out
(the delete flag, which xasink does not store); ``select`` SQL expressions to select from the frame first;
``conf`` Spark SQL settings for this request only (``spark.sql.session.timeZone``: a session zone other than
the JVM's; null: unset, as a session that never set it).  The answer is ``{"ok": true}`` or
``{"ok": false, "writer": ..., "error": ...}``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any
from urllib.parse import unquote, urlsplit

TZ = "America/New_York"
JARS = "/usr/share/java/postgresql.jar,/usr/share/java/mariadb-java-client.jar"


def jdbc_target(url: str) -> tuple[str, dict[str, str]]:
    """(JDBC URL, options) for Spark's JDBC writer, from an xasink test URL of either database."""
    parts = urlsplit(url.removeprefix("jdbc:"))
    scheme = parts.scheme.split("+")[0]
    kind, driver = ("postgresql", "org.postgresql.Driver")
    if scheme in ("mysql", "mariadb"):
        kind, driver = ("mariadb", "org.mariadb.jdbc.Driver")
    options = {"driver": driver}
    query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
    user = parts.username or query.get("user")
    password = parts.password or query.get("password")
    if user:
        options["user"] = unquote(user)
    if password:
        options["password"] = unquote(password)
    if "stringtype" in query:  # pgjdbc's: strings sent untyped, for the server to convert (jsonb, uuid)
        options["stringtype"] = query["stringtype"]
    if "options" in query:  # libpq's and pgjdbc's: the session's settings (-c name=value), both writers'
        options["options"] = unquote(query["options"])
    if "sessionVariables" in query:  # Connector/J's: SET after connecting (sql_mode, time_zone), both writers'
        options["sessionVariables"] = unquote(query["sessionVariables"])
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (5432 if kind == "postgresql" else 3306)
    # Spark picks its MySQL dialect (backquoted names) for jdbc:mysql only; the MariaDB driver takes that too
    scheme = "postgresql" if kind == "postgresql" else "mysql"
    return f"jdbc:{scheme}://{host}:{port}{parts.path}", options


def _cause(exc: Exception) -> str:
    """The JDBC writer's reason: the Java exception's root cause (a task's ``Caused by:``, the server's error),
    else its first line that names one (py4j's first line names none)."""
    lines = str(exc).splitlines()
    causes = [line.strip().removeprefix("Caused by: ") for line in lines if line.startswith("Caused by: ")]
    named = [line.strip() for line in lines if "Exception:" in line or "Error:" in line]
    return (causes[-1] if causes else named[0] if named else lines[0])[:2000]


def serve(spark: Any) -> None:
    import xasink

    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        conf = request.get("conf") or {}
        before = {key: spark.conf.get(key, None) for key in conf}
        for key, value in conf.items():  # before the read: a frame with columns ID and id needs caseSensitive
            if value is None:  # a setting the session never made (spark.sql.session.timeZone: Spark's default)
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
        if conf:  # as a user's session is when it registers xasink (an unset zone: set to its value then)
            xasink.register(spark)
        df = spark.read.parquet(request["parquet"])
        if request.get("select"):
            df = df.selectExpr(*request["select"])
        df = df.cache()
        df.count()
        answer: dict[str, Any] = {"ok": True}
        mode = request.get("mode", "append")
        try:
            url, options = jdbc_target(request["jdbc_url"])
            if mode == "overwrite":
                options["truncate"] = "true"  # keep the twin table's definition, as xasink does
            (
                df.drop(*request.get("jdbc_drop", []))
                .write.format("jdbc")
                .options(**options)
                .option("url", url)
                .option("dbtable", request["jdbc_table"])
                .mode(mode)
                .save()
            )
        except Exception as exc:  # noqa: BLE001 - reported to the test
            answer = {"ok": False, "writer": "jdbc", "error": _cause(exc)}
        try:
            writer = df.write.format("xasink").option("url", request["xasink_url"])
            writer = writer.option("dbtable", request["xasink_table"])
            writer.options(**request.get("xasink_options", {})).mode(mode).save()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            if answer["ok"]:
                answer = {"ok": False, "writer": "xasink", "error": str(exc)[:4000]}
            else:
                answer["xasink_error"] = str(exc)[:4000]
        for key, value in before.items():  # as before: an unset spark.sql.session.timeZone is another case
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
        df.unpersist()
        print("VALUES " + json.dumps(answer), flush=True)


def main() -> int:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    import xasink
    from tests.jvm import driver_java_options, local_spark

    spark = local_spark(
        "xasink-values",
        java_options=f"{driver_java_options()} -Duser.timezone={TZ}",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": TZ,
            "spark.jars": JARS,
            "spark.executor.extraJavaOptions": f"-Duser.timezone={TZ}",
        },
    )
    xasink.register(spark)
    print("VALUES " + json.dumps({"ready": True}), flush=True)
    try:
        serve(spark)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
