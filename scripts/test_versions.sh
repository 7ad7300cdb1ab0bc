#!/usr/bin/env bash
# The core suite (pytest -m core) on an older PySpark line, in a virtualenv of its own next to .venv:
#   bash scripts/test_versions.sh 3.5          # .venv-spark35: PySpark 3.5.x
#   bash scripts/test_versions.sh 4.0 -x       # .venv-spark40: PySpark 4.0.x; extra arguments go to pytest
# The virtualenv is made anew each run (XASINK_KEEP_VERSION_VENV=1 keeps an existing one), with xasink and
# its test dependencies, the PySpark line pinned; docs/spark-versions.md says what each line runs.
# One pytest process: it runs beside the main suite in .ci/run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

LINE="${1:?usage: scripts/test_versions.sh 3.5|4.0 [pytest args]}"
shift
case "$LINE" in
    # PySpark 3.5 predates pandas 2.3 (its pandas API is tested up to 2.2); numpy 2 and pyarrow >= 16 work
    3.5) PINS=("pyspark>=3.5.0,<3.6" "pandas>=2.2,<2.3") ;;
    4.0) PINS=("pyspark>=4.0.0,<4.1") ;;
    *) echo "error: no version suite for PySpark $LINE (3.5 or 4.0)" >&2; exit 2 ;;
esac
VENV="$ROOT/.venv-spark${LINE/./}"
PY="$VENV/bin/python"

source "$ROOT/scripts/python.sh"
if [[ "${XASINK_KEEP_VERSION_VENV:-0}" != "1" || ! -x "$PY" ]]; then
    echo "== PySpark $LINE: fresh virtualenv in $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    # one editable install at a time: each writes xasink.egg-info in this tree (.ci/run runs both lines at once)
    exec {lock}>"$ROOT/.venv-spark-install.lock"
    flock "$lock"
    "$PY" -m pip install -q "${PINS[@]}" -e '.[test]'
    flock -u "$lock"
fi
echo "== PySpark $LINE: $("$PY" -c 'import pyspark, pyarrow, pandas, numpy; print("pyspark", pyspark.__version__, "pyarrow", pyarrow.__version__, "pandas", pandas.__version__, "numpy", numpy.__version__)')"

export PYSPARK_PYTHON="$PY"
# a core case run on both databases runs on one per older line, the other on the other line (tests/conftest.py)
export XASINK_VERSION_LINE="$LINE"
export PYSPARK_DRIVER_PYTHON="$PY"
"$PY" -m compileall -q xasink tests >/dev/null  # see scripts/test.sh
# -p no:cacheprovider: the main suite, running beside this one, owns .pytest_cache
"$PY" -m pytest -n 0 -m core -p no:cacheprovider "$@"
