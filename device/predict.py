"""Each placement priced: duo (the ideal with branches, and `python -m bench --sim` at the
measured prices), llama-server's synchronous draft and plain llama-server, all from the same
price table, the default pair's acceptance and each server's own overhead per step.

- plain: one token per step, cost(1) + overhead;
- synchronous draft (llama-server -md): k draft tokens one after another, then the target
  verifies k + 1: E(k) tokens per k * draft + cost(k + 1) + overhead, the best k;
- duo's ideal: bench/ideal.py's branch_ideal (a back drafting beside lead, a branch ready
  after `cover` of rejections) at cost(b) + lead's overhead;
- duo simulated: bench.sim's lead and back (real processes, the real protocol) with a target
  costing call + token * b (the least-squares fit of cost(b) over the batches lead verifies)
  and a draft costing the measured token; lead's own overhead is real there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.ideal import branch_ideal, expected_tokens, padded
from device.prices import linear_fit, medians

Cost = Callable[[int], float]
MAX_DRAFT = 8  # lead's default --max-draft
SYNC_MAX = 16  # llama-server's --draft-max default


def with_overhead(table: dict[int, float], overhead: float) -> dict[int, float]:
    return {b: c + overhead for b, c in table.items()}


def plain_rate(table: dict[int, float], overhead: float) -> float:
    return 1.0 / (table[1] + overhead)


def sync_rate(table: dict[int, float], alpha: float, draft_s: float, overhead: float,
              max_k: int = SYNC_MAX) -> tuple[float, int]:
    """(tokens per second, best k) of a synchronous draft loop: draft k, verify k + 1."""
    cost = padded(with_overhead(table, overhead))
    best = (1.0 / cost(1), 0)
    for k in range(1, max_k + 1):
        if k + 1 > max(table):
            break
        best = max(best, (expected_tokens(alpha, k) / (k * draft_s + cost(k + 1)), k))
    return best


def duo_ideal_rate(table: dict[int, float], alpha: float, cover: float, draft_s: float,
                   overhead: float) -> tuple[float, int]:
    """(tokens per second, best K) of the ideal back with branches at these prices."""
    priced = with_overhead(table, overhead)
    speedup, k = branch_ideal(padded(priced), alpha, draft_s, MAX_DRAFT, cover, n_tokens=1500,
                              runs=3)
    return speedup / priced[1], k


def sim_args(table: dict[int, float], draft_s: float, alpha: float, cover: float,
             prompts: int, tokens: int, out: Path) -> list[str]:
    call, per_token = linear_fit(table)
    return ["-m", "bench", "--sim", "--sim-target", f"{call:.6f},{per_token:.6f}",
            "--sim-draft", f"{draft_s:.6f}", "--sim-agree", f"{alpha:.4f}", "--cover",
            f"{cover:.4f}", "--prompts", str(prompts), "--tokens", str(tokens), "--sweep", "",
            "--out", str(out)]


SIM_START_S = 20  # bench --sim starts three simulated leads and two backs, one by one


def sim_size(table: dict[int, float], budget_s: float, tokens: int = 64) -> int:
    """Prompts a simulation can run in its budget after its processes start: a prompt costs
    lead alone's decode of it, the two duos' (faster), each run's start and lead's Python
    per step; six steps of the fitted price a token covers it with room (on a busy 2-core
    machine four did not)."""
    call, per = linear_fit(table)
    per_prompt = 6 * tokens * max(table[1], call + per) + 2.0
    return max(1, min(8, int((budget_s - SIM_START_S) / per_prompt)))


def run_sims(jobs: dict[str, list[str]], timeout: float) -> dict[str, dict]:
    """bench --sim per placement, at once (they sleep their models' costs: a core each is
    plenty); each one's summaries, or why there are none."""
    procs = {name: subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for name, args in jobs.items()}
    deadline = time.monotonic() + timeout
    out = {}
    for name, p in procs.items():
        try:
            text, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            out[name] = {"error": f"over {timeout:.0f} s", "tail": text[-1500:]}
            continue
        out[name] = read_sim(Path(jobs[name][-1]) / "sim.json", p.returncode, text)
    return out


def read_sim(path: Path, code: int, text: str) -> dict:
    if code or not path.exists():
        return {"error": f"exit {code}", "tail": text[-1500:]}
    data = json.loads(path.read_text())
    rates = {s["config"]: s["tok_s"] for s in data["summaries"]}
    return {"lead_alone_tok_s": rates.get("SIM lead alone"),
            "duo_tok_s": rates.get("SIM duo: lead + back"),
            "duo_chains_tok_s": next((v for k, v in rates.items() if "chains" in k), None),
            "alpha": data.get("alpha"), "branch_bound": data.get("branch_bound")}


def predict(tables: dict[str, dict[int, float]], placements: list[dict], accept: dict,
            overheads: dict[str, float]) -> list[dict]:
    """One row per placement (without the simulation's figures)."""
    alpha, cover = accept["agreement"], accept["cover"]
    rows = []
    for p in placements:
        if p["target"] not in tables or p["draft"] not in tables:
            rows.append({**p, "error": "not priced (its price run failed or ran out of time)"})
            continue
        table, draft_s = tables[p["target"]], tables[p["draft"]][1]
        ls_plain = plain_rate(table, overheads["llama_server"])
        ls_sync, sync_k = sync_rate(table, alpha, draft_s, overheads["llama_server"])
        lead_alone = plain_rate(table, overheads["lead"])
        duo, duo_k = duo_ideal_rate(table, alpha, cover, draft_s, overheads["lead"])
        rows.append({**p, "target_ms": table[1] * 1e3, "draft_ms": draft_s * 1e3,
                     "llama_server": ls_plain, "llama_server_draft": ls_sync, "sync_k": sync_k,
                     "lead_alone": lead_alone, "duo_ideal": duo, "duo_k": duo_k,
                     "duo_ideal_vs_llama_server": duo / ls_plain,
                     "duo_ideal_vs_llama_server_draft": duo / ls_sync})
    return rows


def load_tables(prices: dict[str, dict]) -> dict[str, dict[int, float]]:
    return {label: medians(run["samples"]) for label, run in prices.items()
            if run.get("rounds")}
