#!/usr/bin/env bash
# Run the xasink demo: it starts its own throwaway PostgreSQL and a local Spark session.
#   bash scripts/demo.sh [--rows N] [--partitions N]
# pip prints errors only (-qq: no build-backend deprecation notices, root-user or new-version notices): what a
# user reads is the demo, and any real error.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
PY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

if [[ ! -x "$PY" ]]; then
    source "$ROOT/scripts/python.sh"
    if ! command -v java >/dev/null 2>&1; then
        echo "error: 'java' not found on PATH; Spark needs a Java runtime (17 or 21)" >&2
        exit 2
    fi
    echo "== creating $VENV and installing xasink with its dependencies (the first run takes a few minutes)"
    "$PYTHON" -m venv "$VENV"
    "$PY" -m pip install -qq --upgrade pip
    "$PY" -m pip install -qq -e '.[test]'
elif [[ "${XASINK_SKIP_INSTALL:-0}" != "1" ]]; then
    "$PY" -m pip install -qq -e '.[test]'
fi

export PYSPARK_PYTHON="$PY"
export PYSPARK_DRIVER_PYTHON="$PY"

exec "$VENV/bin/xasink" demo "$@"
