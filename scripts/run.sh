#!/usr/bin/env bash
# Start lead (target) and back (draft) on this machine, then chat; stop both on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PORT=${LEAD_PORT:-5555}
# Lead on the first half of the CPUs; the back (--cpus auto) takes the rest. On a single
# CPU lead takes it and the back sits out.
first=$("$PY" -c "import os; print(min(os.sched_getaffinity(0)))" 2>/dev/null || echo 0)
half=$(( $(nproc) / 2 )); [ "$half" -ge 1 ] || half=1
if [ "${GPU:-cpu}" = cpu ]; then
  export LEAD_CPUS=${LEAD_CPUS:-$first-$(( first + half - 1 ))}
else  # the target on the GPU (lead keeps one CPU); the back drafts on the other CPUs
  export LEAD_N_GPU_LAYERS=${LEAD_N_GPU_LAYERS:--1} LEAD_CPUS=${LEAD_CPUS:-all}
fi
mkdir -p logs
"$PY" -m lead -m "${TARGET:-qwen2.5-coder-1.5b}" --host 127.0.0.1 --port "$PORT" \
    >logs/lead.log 2>&1 &
lead=$!
back=
trap 'kill $lead $back 2>/dev/null || true; wait 2>/dev/null || true' EXIT
echo "starting lead on 127.0.0.1:$PORT (log: logs/lead.log) ..."
for _ in $(seq 1 240); do
  "$PY" -c "import httpx,sys; httpx.get('http://127.0.0.1:$PORT/health', timeout=1)" \
      2>/dev/null && break
  kill -0 "$lead" 2>/dev/null || { echo "lead failed to start:"; tail -5 logs/lead.log; exit 1; }
  sleep 0.5
done
"$PY" -m back --lead "127.0.0.1:$PORT" -m "${DRAFT:-qwen2.5-coder-0.5b}" >logs/back.log 2>&1 &
back=$!
echo "lead on CPUs $LEAD_CPUS${LEAD_N_GPU_LAYERS:+ and the GPU}, back on the rest (logs/lead.log, logs/back.log)."
echo "Tokens from accepted drafts show in green."
"$PY" chat.py --lead "127.0.0.1:$PORT"
