#!/usr/bin/env bash
# Run the xasink demo (starts its own PostgreSQL unless told otherwise).
#   bash scripts/demo.sh [demo options]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
PY="$VENV/bin/python"

if [[ ! -x "$PY" ]]; then
    PYTHON="${PYTHON:-python3}"
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        echo "error: $PYTHON not found on PATH (xasink needs Python >= 3.10)" >&2
        exit 2
    fi
    if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
        echo "error: $("$PYTHON" --version 2>&1) is too old; xasink needs Python >= 3.10" >&2
        exit 2
    fi
    if ! command -v java >/dev/null 2>&1; then
        echo "error: 'java' not found on PATH; Spark needs a Java runtime (17 or 21)" >&2
        exit 2
    fi
    echo "== creating $VENV"
    "$PYTHON" -m venv "$VENV"
    "$PY" -m pip install --upgrade pip
    "$PY" -m pip install -e '.[test]'
elif [[ "${XASINK_SKIP_INSTALL:-0}" != "1" ]]; then
    "$PY" -m pip install -q -e '.[test]'
fi

export PYSPARK_PYTHON="$PY"
export PYSPARK_DRIVER_PYTHON="$PY"

exec "$VENV/bin/xasink" demo "$@"
