#!/usr/bin/env bash
# The single test command: lint, type-check and run the test suite.
#   bash scripts/test.sh                 # everything except soak tests
#   bash scripts/test.sh -m 'not spark'  # extra arguments go to pytest
#   bash scripts/test.sh -n 0            # one process (default: XASINK_TEST_WORKERS=4 pytest-xdist workers)
# The tests start their own PostgreSQL (see tests/conftest.py); set
# XASINK_TEST_PG_URL to use an existing server instead.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
PY="$VENV/bin/python"

if [[ ! -x "$PY" ]]; then
    source "$ROOT/scripts/python.sh"
    echo "== creating $VENV"
    "$PYTHON" -m venv "$VENV"
    "$PY" -m pip install --upgrade pip
    "$PY" -m pip install -e '.[test]'
elif [[ "${XASINK_SKIP_INSTALL:-0}" != "1" ]]; then
    "$PY" -m pip install -q -e '.[test]'
fi

if ! command -v java >/dev/null 2>&1; then
    echo "warning: 'java' not found on PATH; Spark tests need a Java runtime (17 or 21) and will fail" >&2
fi

# Spark's JDBC writer, which tests/test_values.py compares xasink with cell by cell, needs the drivers' jars
if [[ ! -f /usr/share/java/postgresql.jar || ! -f /usr/share/java/mariadb-java-client.jar ]]; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing the JDBC drivers' jars (libpostgresql-jdbc-java, libmariadb-java)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java libmariadb-java
    else
        echo "warning: /usr/share/java/postgresql.jar or mariadb-java-client.jar is missing; tests/test_values.py" \
            "needs them: apt-get install libpostgresql-jdbc-java libmariadb-java" >&2
    fi
fi

export PYSPARK_PYTHON="$PY"
export PYSPARK_DRIVER_PYTHON="$PY"

echo "== ruff"
"$VENV/bin/ruff" check xasink tests
echo "== mypy"
"$VENV/bin/mypy"
echo "== pytest"
# The machine may set PYTHONDONTWRITEBYTECODE: then every Python process of the run (Spark's workers, the
# drivers, the CLI) compiled xasink and the test helpers from source again.  Compiled once here, they load.
"$PY" -m compileall -q xasink tests >/dev/null
# Four workers (docs/testing.md, issues 30 and 37), whole modules each (their clusters and crash drivers are module-
# or session-scoped): each worker is a test session of its own, with its own PostgreSQL and MariaDB database.
# A later -n in the arguments wins.  --no-loadscope-reorder: the modules go out slowest first, in the order
# tests/conftest.py gives them (SLOW_MODULES), not xdist's order by number of tests.
"$PY" -m pytest -n "${XASINK_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder "$@"
