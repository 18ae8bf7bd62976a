#!/usr/bin/env bash
# Start lead (target) and back (draft) on this machine, then chat; stop both on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PORT=${LEAD_PORT:-5555}
# What is fastest here. CPU only: lead on every core with its own drafts; the back
# attaches and sits out (drafting on lead's cores would slow it; measured: a split of one
# core each ran 0.69x of lead on both), ready for a device of its own. With a GPU: the
# target there (lead keeps one CPU), the back drafting on the other CPUs.
if [ "${GPU:-cpu}" = cpu ]; then
  export LEAD_CPUS=${LEAD_CPUS:-all}
  chose="lead on every CPU with its own drafts; the back attached, sitting out (no GPU)"
else
  export LEAD_N_GPU_LAYERS=${LEAD_N_GPU_LAYERS:--1} LEAD_CPUS=${LEAD_CPUS:-all}
  chose="the target on the GPU, the draft on the CPUs lead leaves"
fi
mkdir -p logs
"$PY" -m lead -m "${TARGET:-qwen2.5-coder-1.5b}" --host 127.0.0.1 --port "$PORT" \
    >logs/lead.log 2>&1 &
lead=$!
back=
trap 'kill $lead $back 2>/dev/null || true; wait 2>/dev/null || true' EXIT
echo "starting lead on 127.0.0.1:$PORT (log: logs/lead.log) ..."
for _ in $(seq 1 240); do
  "$PY" -c "import httpx; httpx.get('http://127.0.0.1:$PORT/health', timeout=1).raise_for_status()" \
      2>/dev/null && break
  kill -0 "$lead" 2>/dev/null || { echo "lead failed to start:"; tail -5 logs/lead.log; exit 1; }
  sleep 0.5
done
"$PY" -m back --lead "127.0.0.1:$PORT" -m "${DRAFT:-qwen2.5-coder-0.5b}" >logs/back.log 2>&1 &
back=$!
echo "$chose (logs/lead.log, logs/back.log)."
echo "Tokens from accepted drafts show in green."
"$PY" chat.py --lead "127.0.0.1:$PORT"
