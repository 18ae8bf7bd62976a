#!/usr/bin/env bash
# The GPU check (docs/gpu.md). From the repository root:
#
#   make gpu-check                              # on a machine with an NVIDIA GPU and nvcc
#   scripts/device-check.sh                     # DEVICE=cuda, offline, from the pack alone
#   DEVICE=cpu PY=... scripts/device-check.sh   # the rehearsal (make device-rehearsal)
#
# Steps, one line each: probe, install (the pack's wheels and Python files), unpack (the
# llama.cpp source), build (the models generated beside it), serve (diagnose where it
# fails), price, predict, report.
# Each runs under a limit cut to what is left of BUDGET seconds; a step that fails or runs
# out of time is recorded and the next goes on; report always runs.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
DEVICE=${DEVICE:-cuda}
PACK=$(cd "${PACK:-$ROOT/.device}" && pwd) || { echo "no pack: make device-pack"; exit 2; }
WORK=${WORK:-/tmp/duo-device}
BUILD=${BUILD:-$WORK/build}
OUT=${OUT:-$WORK/out}
BUDGET=${BUDGET:-540}   # seconds for everything (a device call may run 600)
RESERVE=${RESERVE:-15}  # kept for the report
PY=${PY:-python3}
JOBS=${JOBS:-$(nproc)}
START=$(date +%s)
DEADLINE=$((START + BUDGET))
mkdir -p "$WORK/results" "$WORK/logs" "$WORK/models" "$OUT"
: > "$WORK/results/steps.jsonl"
export PYTHONUNBUFFERED=1 DUO_TEST_LOGS="$WORK/logs" DUO_HUGE_PAGES=0
export PYTHONPATH="$ROOT:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export LLAMA_CPP_LIB_PATH="$WORK/site/llama_cpp/lib"

say() { echo "[device-check $(($(date +%s) - START))s] $*"; }

record() {  # NAME STATUS SECONDS LIMIT RC LINE: one line here, one JSON line in steps.jsonl
  say "$1: $2 in $3s (limit $4s) - $6"
  "$PY" -c 'import json, sys; n, st, s, l, rc, line = sys.argv[1:]
print(json.dumps(dict(step=n, status=st, seconds=int(s), limit=int(l), rc=int(rc), line=line)))' \
    "$@" >> "$WORK/results/steps.jsonl"
}

last_line() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-200; }

status_of() { case $1 in 0) echo ok ;; 124|137) echo timeout ;; *) echo failed ;; esac; }

# step NAME LIMIT CMD...: CMD (a command or a function below) under a limit cut to what is
# left of the budget, its output in logs/NAME.log
step() {
  local name=$1 limit=$2 left t0 rc=0
  shift 2
  left=$((DEADLINE - $(date +%s) - RESERVE))
  [ "$name" = report ] && left=$((left + RESERVE))
  [ "$left" -lt "$limit" ] && limit=$left
  t0=$(date +%s)
  if [ "$limit" -lt 3 ]; then
    record "$name" skipped 0 "$limit" 0 "no time left"
    return 0
  fi
  STEP_LIMIT=$limit timeout -k 5 "$limit" bash -c '"$@"' _ "$@" > "$WORK/logs/$name.log" 2>&1
  rc=$?
  record "$name" "$(status_of $rc)" "$(( $(date +%s) - t0 ))" "$limit" "$rc" \
    "$(last_line "$WORK/logs/$name.log")"
  return "$rc"
}

probe() {
  local gpu="none"
  if [ "$DEVICE" = cuda ]; then
    gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader) || return 1
  fi
  "$PY" -m device.probe "$gpu" "$WORK/results/device.json"
}

install() {  # the pack's wheels, unless PY has duo's packages (make gpu-check: its venv)
  if "$PY" -c 'import fastapi, uvicorn, pydantic_settings, httpx_ws' 2>/dev/null; then
    echo "$PY has duo's packages: the pack's wheels are not needed"
  else
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$WORK/site" "$PACK"/wheels/*.whl || return 1
  fi
  untar python && mkdir -p "$WORK/site" && cp -r "$WORK/python/." "$WORK/site/" || return 1
  "$PY" -c 'import fastapi, uvicorn, pydantic, pydantic_settings, httpx_ws, httpx_sse, gguf
import prompt_toolkit, diskcache
print("imports ok: fastapi", fastapi.__version__, "pydantic", pydantic.__version__)'
}

untar() {  # FOLDER of src.tar.xz into WORK (Python's lzma: no xz binary needed)
  "$PY" -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], [m for m in t if m.name.startswith(sys.argv[3] + "/")],
                 filter="data")' \
    "$PACK/src.tar.xz" "$WORK" "$1"
}

unpack() {
  rm -rf "$WORK/llama.cpp" && untar llama.cpp &&
    echo "llama.cpp: $(find "$WORK/llama.cpp" -type f | wc -l) files"
}

build() {
  "$PY" -m device.build --src "$WORK/llama.cpp" --build "$BUILD" --site "$WORK/site" \
    --device "$DEVICE" --jobs "$JOBS" --timeout "$((STEP_LIMIT - 10))" \
    --arch "${CUDA_ARCH:-90-real}" \
    --log "$WORK/logs/build-full.log" --json "$WORK/results/build.json" || return 1
  "$PY" -c 'import llama_cpp, sys
info = llama_cpp.llama_print_system_info().decode()
cuda = "CUDA" in info
print("llama_cpp loads", llama_cpp.llama_cpp._base_path, "- backends:",
      " / ".join(part.split(":")[0].strip() for part in info.split("|") if ":" in part))
sys.exit(0 if cuda or sys.argv[1] == "cpu" else 1)' "$DEVICE"
}

check() {  # python -m device.check STEP, told the step's deadline
  "$PY" -m device.check "$1" --device "$DEVICE" --work "$WORK" --pack "$PACK" --out "$OUT" \
    --build "$BUILD" --deadline "$(( $(date +%s) + STEP_LIMIT - 5 ))"
}

# the built libraries' cuBLAS (the shim's links), for every process after the build
libpath() {
  local shim
  shim=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("shim") or "")' \
    "$WORK/results/build.json" 2>/dev/null)
  [ -n "$shim" ] && export LD_LIBRARY_PATH="$shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  return 0
}

export ROOT DEVICE PACK WORK BUILD OUT PY JOBS
export -f probe untar install unpack build check

say "DEVICE=$DEVICE WORK=$WORK OUT=$OUT budget ${BUDGET}s"
step probe 30 probe
step install 60 install
step unpack 30 unpack
# the models are written while llama.cpp compiles (numpy and the disk: one core)
GEN_LIMIT=${GEN_LIMIT:-240}
t_gen=$(date +%s)
rm -f "$WORK/logs/generate.end"  # a warm machine's last run's
# (its own end time kept: the wait below returns only once the build is done)
STEP_LIMIT=$GEN_LIMIT timeout -k 5 "$GEN_LIMIT" bash -c \
  'check generate; rc=$?; date +%s > "$WORK/logs/generate.end"; exit $rc' \
  > "$WORK/logs/generate.log" 2>&1 &
GEN=$!
step build "${BUILD_LIMIT:-330}" build
libpath
wait "$GEN"
rc=$?
t_end=$(cat "$WORK/logs/generate.end" 2> /dev/null || date +%s)
record generate "$(status_of $rc)" "$(( t_end - t_gen ))" "$GEN_LIMIT" "$rc" \
  "$(last_line "$WORK/logs/generate.log")"
step serve "${SERVE_LIMIT:-90}" check serve ||
  step diagnose "${DIAGNOSE_LIMIT:-150}" check diagnose  # why not: one process per probe
step price "${PRICE_LIMIT:-170}" check price
step predict "${PREDICT_LIMIT:-60}" check predict
step report 30 check report
cp "$WORK/logs/build-full.log" "$OUT/build.log" 2>/dev/null
for f in "$WORK"/logs/*.log; do echo "== $f"; tail -c 40000 "$f"; done > "$OUT/logs.txt"
say "total $(($(date +%s) - START))s; $OUT: $(ls "$OUT" | tr '\n' ' ')"
cat "$OUT/summary.md" 2>/dev/null
