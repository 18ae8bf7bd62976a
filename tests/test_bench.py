"""The benchmark's --quick mode runs end to end and writes its table, JSON and plot;
--advise --quick measures every placement and ends with a recommendation.

It asserts on what was produced, never on speed (these machines are shared and noisy).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.procs import ROOT

pytestmark = pytest.mark.real
HANG_S = 1800  # catches a hang only: a quick run takes minutes, more beside other work

CONFIGS = ["raw loop", "lead alone", "lead alone, own drafts off (--no-ngram)",
           "lead alone, not streamed", "duo: lead + back (model)", "duo: lead + back (n-gram)",
           "peer: prompt lookup (llama-cpp-python)", "peer: synchronous draft loop (k=3)"]
# where llama-server is on PATH, the run sets duo beside it too
SERVER_CONFIGS = ["peer: llama-server (its defaults)", "peer: llama-server --spec-default",
                  "peer: llama-server + draft model (-md, draft-simple)"]


def test_quick_benchmark_produces_every_figure(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = CONFIGS + (SERVER_CONFIGS if shutil.which("llama-server") else [])
    for name in expected:
        assert f"| {name} |" in done.stdout, name
    assert "analytic bound" in done.stdout and "Per prompt" in done.stdout
    assert "lead alone against the raw loop: " in done.stdout  # like for like, and streamed
    assert ("vs llama-server" in done.stdout) == (expected != CONFIGS)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {s["config"] for s in data["summaries"]} == set(expected)
    assert all(s["tok_s"] > 0 for s in data["summaries"])
    assert set(data["sweep"]) == {"1", "4", "auto"}
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    # The raw loop's replies, replayed against the draft (here the same model): the draft's
    # greedy token is the target's at (nearly) every position, and the bound says so.
    raw = {r["prompt"]: r["token_ids"] for r in data["results"]["raw loop"] if r["round"] == 0}
    agree = {int(p): a for p, a in data["agreement"].items()}
    assert {p: len(a) for p, a in agree.items()} == {p: len(ids) for p, ids in raw.items()}
    assert sum(map(sum, agree.values())) >= 0.9 * sum(map(len, agree.values()))
    assert "replaying each reply's measured draft agreement" in done.stdout


def test_simulation_mode_is_labelled_and_reports_efficiency(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--sim", "--prompts", "2",
                           "--tokens", "40", "--repeat", "2", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SIMULATION" in done.stdout and "of the async ideal" in done.stdout
    assert "of the ideal with branches" in done.stdout
    data = json.loads((tmp_path / "sim.json").read_text())
    assert data["free_bound"] >= data["bound"] >= 1.0 and data["speedup"] > 0
    assert 1.01 * data["free_bound"] >= data["branch_bound"] >= data["bound"]  # Monte Carlo
    ready = data["ready_after_rejection"]  # lead's counters: a share, or None without any
    assert ready is None or 0 <= ready <= 1
    assert data["bound_per_prompt"] >= 1.0 and "each prompt's own acceptance" in done.stdout
    assert 0.5 < data["alpha"] < 1.0  # the simulated draft agrees 80 % of the time
    rows = data["results"]["SIM duo: lead + back"]
    assert sorted((r["prompt"], r["round"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # each prompt its own reply (every prompt ends alike: a fake of the last few tokens
    # gave all the same one), and the simulated draft replayed on each
    alone = {r["prompt"]: r["text"] for r in data["results"]["SIM lead alone"]}
    assert alone[0][:20] != alone[1][:20]
    assert [len(data["agreement"][str(p)]) for p in (0, 1)] == [40, 40]
    assert 0.5 < sum(data["agreement"]["0"] + data["agreement"]["1"]) / 80 < 1.0
    assert 0.2 < data["cover_replayed"] <= 1.0  # the simulated runner-up covers 70 %
    assert data["branch_bound_replayed"] >= 0.98 * data["bound_replayed"]
    assert "replaying each reply's draft" in done.stdout
    # the draft's q per token, and the ideal that verifies as far as each draft's odds pay
    assert [len(data["draft_q"][str(p)]) for p in (0, 1)] == [40, 40]
    assert all(0 < q <= 1 for p in (0, 1) for q in data["draft_q"][str(p)])
    assert 1.0 <= data["branch_bound_per_token"] <= 1.01 * data["free_bound"]
    assert "acceptance per token" in done.stdout


def test_quick_advice_prices_every_placement_and_recommends_one() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--advise", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    names = [line.split(" | ")[0] for line in lines if line.startswith("| ") and "x |" in line]
    n_cpus = len(os.sched_getaffinity(0))
    assert names[0] == f"| lead alone, every core ({n_cpus} CPUs)"
    assert any("free (upper bound)" in name for name in names)
    assert n_cpus == 1 or any(name.startswith("| duo split: lead on CPU") for name in names)
    # SmolLM2 drafting for itself: its greedy token is the target's at (nearly) every position
    agreement = re.search(r"greedy replies \(2 prompts, \d+ tokens\): ([\d.]+)", done.stdout)
    assert agreement and float(agreement.group(1)) >= 0.9
    assert any(line.startswith("recommendation: ") for line in lines)
    assert "every core: target reply 1/2" in done.stderr  # progress, one line per phase


def test_every_edit_is_a_whole_file_the_default_reply_length_covers() -> None:
    from bench import prompts
    from shared.llama.model import LlamaModel
    from shared.presets import resolve_model

    target = LlamaModel(resolve_model("qwen2.5-coder-1.5b"), threads=1, n_ctx=512)
    try:  # the default target's own tokenizer
        sizes = {e["file"]: len(target.tokenize(e["code"], add_bos=False))
                 for e in prompts.load("edit")}
    finally:
        target.close()
    assert min(sizes.values()) >= 300, sizes
    assert max(sizes.values()) + 64 <= prompts.EDIT_TOKENS, sizes  # room for the change


def test_the_agent_prompt_is_about_7k_tokens_of_the_default_target() -> None:
    from bench import promptbench
    from shared.llama.model import LlamaModel
    from shared.presets import resolve_model

    prompt = promptbench.load()
    target = LlamaModel(resolve_model("qwen2.5-coder-1.5b"), threads=1, n_ctx=512)
    try:  # the default target's own tokenizer and chat template, tools rendered
        text = target.format_chat(prompt["messages"], prompt["tools"])
        tokens = len(target.tokenize(text, special=True, add_bos=False))
    finally:
        target.close()
    assert 6_500 <= tokens <= 7_500, tokens  # 7,204 when recorded
