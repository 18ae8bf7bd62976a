#!/usr/bin/env bash
# make device-rehearsal: scripts/device-check.sh end to end on this machine (DEVICE=cpu,
# small shapes) from the pack in .device/, in a scratch folder under .device-work/, with a
# Python 3.12 that holds only what the device's image holds of duo's needs; then CMake's
# configuration of the CUDA build where nvcc and cuBLAS are here. Exits 1 if a step failed.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
START=$(date +%s)
CACHE=${DUO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/duo}/device
VENV=$CACHE/py312
# what the device's image holds of duo's dependencies (KINDS.md); the pack brings the rest
HAS="numpy httpx jinja2 pyyaml tqdm prometheus-client uvloop requests packaging click annotated-doc"
# a python3.12 that runs (pyenv's shim is on PATH even where 3.12 is not its version)
find_py312() {
  local c
  for c in "${PY312:-}" "$(command -v python3.12)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 \
      /usr/bin/python3.12 /usr/local/bin/python3.12; do
    [ -n "$c" ] && [ -x "$c" ] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' \
      2> /dev/null && { echo "$c"; return 0; }
  done
  return 1
}
if [ ! -x "$VENV/bin/python" ]; then
  PY312=$(find_py312) ||
    { echo "device-rehearsal: no python3.12 (the pack's wheels are for CPython 3.12)"; exit 2; }
  echo "device-rehearsal: a Python 3.12 like the device's in $VENV"
  "$PY312" -m venv "$VENV" && "$VENV/bin/pip" install -q $HAS || exit 2
fi
mkdir -p "$ROOT/.device-work"
WORK=${REHEARSAL_WORK:-$(mktemp -d "$ROOT/.device-work/rehearsal.XXXXXX")}
# ccache (where installed) keeps the CPU build for the next rehearsal: cold it takes 15-40
# minutes on this machine's 2 busy cores
# (paths under WORK hashed relative to it: another scratch folder hits the same entries)
if command -v ccache > /dev/null; then
  export CCACHE_DIR=${CCACHE_DIR:-$CACHE/ccache} CCACHE_BASEDIR=$WORK CCACHE_NOHASHDIR=1
fi
DEVICE=cpu WORK="$WORK" OUT="$WORK/out" PY="$VENV/bin/python" BUDGET=${BUDGET:-3000} \
  BUILD_LIMIT=${BUILD_LIMIT:-2700} PREDICT_LIMIT=${PREDICT_LIMIT:-120} scripts/device-check.sh
# cuBLAS for the CUDA configuration: the device's is found in PyTorch's venv; here, where
# nvidia-cublas's wheel was unzipped into the cache (docs/gpu.md), or DUO_CUBLAS_ROOT
[ -d "$CACHE/cuda/site/nvidia" ] && export DUO_CUBLAS_ROOT=${DUO_CUBLAS_ROOT:-$CACHE/cuda/site/nvidia}
if command -v nvcc > /dev/null; then
  t0=$(date +%s)
  if PYTHONPATH="$ROOT" "$VENV/bin/python" -m device.build --device cuda --configure-only \
      --src "$WORK/llama.cpp" --build "$WORK/build-cuda" --site "$WORK/site" \
      --log "$WORK/logs/cuda-configure.log" --json "$WORK/results/cuda-configure.json" \
      > "$WORK/logs/cuda-configure.out" 2>&1; then
    echo "device-rehearsal: CUDA configuration ok in $(( $(date +%s) - t0 ))s (CMake only)"
  else
    echo "device-rehearsal: CUDA configuration: $(tail -n 1 "$WORK/logs/cuda-configure.out")"
  fi
fi
FAILED=$(grep -v '"status": "ok"' "$WORK/results/steps.jsonl" | wc -l)
echo "device-rehearsal: total $(( $(date +%s) - START ))s in $WORK; pack $(du -sh .device | cut -f1); $FAILED step(s) not ok"
[ "$FAILED" -eq 0 ]
