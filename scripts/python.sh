# Sourced by scripts/demo.sh and scripts/test.sh: the Python that makes the virtualenv, checked once.
# Sets PYTHON (default python3); exits 2 with what to do when it is missing or older than 3.10.
PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "error: $PYTHON not found on PATH (xasink needs Python >= 3.10)" >&2
    exit 2
fi
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
    echo "error: $("$PYTHON" --version 2>&1) is too old; xasink needs Python >= 3.10" >&2
    exit 2
fi
