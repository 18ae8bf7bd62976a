"""python -m bench: duo against its floor and its peers, side by side in one run.

Configurations, same model, prompts and placement: a raw llama-cpp-python greedy loop;
lead alone; lead + back (draft model); lead + back (n-gram); llama-cpp-python's
prompt-lookup decoding; a synchronous draft-model loop. Then the analytic bound from
the measured verify costs and acceptance, and a draft-length sweep (PNG + JSON).
`--sim` measures the protocol itself with simulated models of chosen cost instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import report
from bench.procs import Back, Lead, metric
from bench.runs import Result, via_lead

PROMPTS = json.loads((Path(__file__).parent / "prompts.json").read_text())


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b")
    p.add_argument("--lead-threads", type=int, default=2)
    p.add_argument("--back-threads", type=int, default=1)
    p.add_argument("--lead-cpus", help="CPU list for lead and the in-process loops (taskset)")
    p.add_argument("--back-cpus", help="CPU list for back (taskset)")
    p.add_argument("--lead-ngl", type=int, default=0, help="lead's --n-gpu-layers")
    p.add_argument("--back-ngl", type=int, default=0, help="back's --n-gpu-layers")
    p.add_argument("--tokens", type=int, default=64, help="tokens decoded per prompt")
    p.add_argument("--prompts", type=int, default=len(PROMPTS))
    p.add_argument("--sync-k", type=int, default=3, help="draft length of the synchronous loop")
    p.add_argument("--sweep", default="1,2,3,4,6,8,12,16",
                   help="fixed draft lengths to sweep ('' for none); auto is always added")
    p.add_argument("--sweep-prompts", type=int, default=3)
    p.add_argument("--no-peers", action="store_true", help="skip the llama-cpp-python peers")
    p.add_argument("--out", default="bench-results", help="folder for JSON and PNG")
    p.add_argument("--quick", action="store_true",
                   help="SmolLM2 as target and draft, 2 prompts, 24 tokens, a short sweep")
    p.add_argument("--sim", action="store_true", help="SIMULATION: fake models of chosen cost")
    p.add_argument("--sim-target", default="0.03,0.0005",
                   help="simulated target: seconds per call, per token (GPU-like: flat)")
    p.add_argument("--sim-draft", default="0.003", help="simulated draft: seconds per call")
    p.add_argument("--sim-agree", type=float, default=0.8, help="simulated draft agreement")
    a = p.parse_args(argv)
    if a.quick:
        a.target = a.draft = "smollm2-135m"
        a.prompts, a.tokens, a.sweep, a.sweep_prompts = 2, 24, "1,4", 1
    return a


@contextmanager
def pinned(cpus: str | None) -> Iterator[None]:
    """Run the in-process loops on the lead's CPUs, as lead itself runs."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(c) for part in cpus.split(",") for c in _cpu_range(part)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _cpu_range(part: str) -> range:
    lo, _, hi = part.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def lead_args(a: argparse.Namespace, *extra: str) -> list[str]:
    return ["--threads", str(a.lead_threads), "--n-gpu-layers", str(a.lead_ngl), *extra]


def back_args(a: argparse.Namespace, *extra: str) -> list[str]:
    return ["--threads", str(a.back_threads), "--n-gpu-layers", str(a.back_ngl), *extra]


def with_lead(a: argparse.Namespace, prompts: list[dict], config: str,
              lead_extra: list[str], back_model: str | None, back_extra: list[str]
              ) -> tuple[list[Result], dict[str, float]]:
    lead = Lead(a.target, *lead_args(a, *lead_extra), cpus=a.lead_cpus)
    back = None
    try:
        if back_model is not None:
            back = Back(lead, back_model, *back_args(a, *back_extra), cpus=a.back_cpus)
            back.wait_attached(300)
        results = []
        for i, prompt in enumerate(prompts):
            results.append(via_lead(config, lead, i, prompt["text"], a.tokens))
            progress(f"  {config} [{i + 1}/{len(prompts)}] {results[-1].tok_s:.1f} tok/s")
        gauges = {name: metric(lead, f"duo_{name}") for name in ("draft_len", "alpha")}
        return results, gauges
    finally:
        if back:
            back.stop()
        lead.stop()


def run_models(a: argparse.Namespace) -> dict:
    from bench.peers import sync_speculative, verify_costs
    from bench.raw import prompt_lookup
    from shared.llm import LlamaModel
    from shared.presets import resolve_model

    prompts = PROMPTS[: a.prompts]
    target_path = resolve_model(a.target)
    ids = [_chat_ids(target_path, p["text"]) for p in prompts]
    results: dict[str, list[Result]] = {}
    progress("raw loop and lead alone, interleaved raw/lead/lead/raw per prompt")
    results["raw loop"], results["lead alone"] = _raw_and_lead(a, prompts, ids, target_path)
    progress("lead + back (draft model, cost-aware draft length)")
    results["duo: lead + back (model)"], gauges = with_lead(
        a, prompts, "duo model", [], a.draft, [])
    progress("lead + back (n-gram)")
    results["duo: lead + back (n-gram)"], _ = with_lead(
        a, prompts, "duo ngram", [], "unused", ["--drafter", "ngram"])
    with pinned(a.lead_cpus):
        if not a.no_peers:
            progress("peer: llama-cpp-python LlamaPromptLookupDecoding")
            results["peer: prompt lookup (llama-cpp-python)"] = [
                Result("pld", i, *prompt_lookup(target_path, a.lead_threads, ids[i], a.tokens))
                for i in range(len(prompts))]
            progress(f"peer: synchronous draft model, k={a.sync_k}")
            target = LlamaModel(target_path, a.lead_threads, a.lead_ngl, 2048)
            draft = LlamaModel(resolve_model(a.draft), a.lead_threads, a.back_ngl, 2048)
            results[f"peer: synchronous draft loop (k={a.sync_k})"] = [
                sync_speculative("sync", i, target, draft, ids[i], a.tokens, a.sync_k)
                for i in range(len(prompts))]
            draft.close()
        else:
            target = LlamaModel(target_path, a.lead_threads, a.lead_ngl, 2048)
        progress("verify cost per batch size")
        costs = verify_costs(target, ids[0], list(range(1, 18)))
        target.close()
    sweep = run_sweep(a, prompts[: a.sweep_prompts])
    return {"results": results, "costs": costs, "gauges": gauges, "sweep": sweep}


def _chat_ids(path: Path, text: str) -> list[int]:
    from shared.llm import LlamaModel

    m = LlamaModel(path, threads=1, n_ctx=512)
    try:
        return m.tokenize(m.format_chat([{"role": "user", "content": text}]), special=True,
                          add_bos=False)
    finally:
        m.close()


def _raw_and_lead(a: argparse.Namespace, prompts: list[dict], ids: list[list[int]],
                  path: Path) -> tuple[list[Result], list[Result]]:
    from bench.raw import RawLoop

    lead = Lead(a.target, *lead_args(a, "--max-draft", "0"), cpus=a.lead_cpus)
    with pinned(a.lead_cpus):
        raw = RawLoop(path, a.lead_threads)
    raws, leads = [], []
    try:
        for i, prompt in enumerate(prompts):
            for who in ("raw", "lead", "lead", "raw"):  # ABBA: cancels drift over time
                if who == "lead":
                    leads.append(via_lead("lead", lead, i, prompt["text"], a.tokens))
                    continue
                with pinned(a.lead_cpus):
                    raws.append(raw.measure(i, ids[i], a.tokens))
            progress(f"  [{i + 1}/{len(prompts)}] raw {raws[-1].tok_s:.1f} tok/s, "
                     f"lead {leads[-1].tok_s:.1f} tok/s")
    finally:
        lead.stop()
        raw.close()
    return raws, leads


def run_sweep(a: argparse.Namespace, prompts: list[dict]) -> dict[str, float]:
    lengths = [k for k in a.sweep.split(",") if k.strip()] + ["auto"]
    sweep: dict[str, float] = {}
    for k in lengths:
        extra = [] if k == "auto" else ["--draft-len", k, "--max-draft", str(max(8, int(k)))]
        progress(f"sweep: draft length {k}")
        results, _ = with_lead(a, prompts, f"k={k}", extra, a.draft, [])
        sweep[k] = report.summarise(k, results, None).tok_s
    return sweep


def run_sim(a: argparse.Namespace) -> dict:
    from bench.procs import SimBack, SimLead

    call, per_token = (float(x) for x in a.sim_target.split(","))
    target = ["--call-s", str(call), "--token-s", str(per_token), "--max-tokens", "4096"]
    draft = ["--call-s", a.sim_draft, "--agree", str(a.sim_agree)]
    prompts = PROMPTS[: a.prompts]
    results: dict[str, list[Result]] = {}
    for config, with_back in (("SIM lead alone", False), ("SIM duo: lead + back", True)):
        lead = SimLead(None, *target)
        back = SimBack(lead, *draft) if with_back else None
        try:
            if back:
                back.wait_attached()
            results[config] = [via_lead(config, lead, i, p["text"], a.tokens)  # type: ignore[arg-type]
                               for i, p in enumerate(prompts)]
        finally:
            if back:
                back.stop()
            lead.stop()
    costs = {b: call + per_token * b for b in range(1, 18)}
    return {"results": results, "costs": costs, "gauges": {}, "sweep": {}}


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    data = run_sim(a) if a.sim else run_models(a)
    out = Path(a.out)
    show(a, data, out)


def show(a: argparse.Namespace, data: dict, out: Path) -> None:
    results: dict[str, list[Result]] = data["results"]
    base_name = "SIM lead alone" if a.sim else "lead alone"
    reference = results[base_name]
    summaries = [report.summarise(name, rs, reference) for name, rs in results.items()]
    where = "SIMULATION (fake models, chosen costs)" if a.sim else \
        f"target {a.target}, draft {a.draft}"
    print(f"\n{where}; {a.tokens} tokens x {len(reference) // (1 if a.sim else 2)} prompts; "
          f"lead threads {a.lead_threads} cpus {a.lead_cpus or 'any'}, back threads "
          f"{a.back_threads} cpus {a.back_cpus or 'any'}\n")
    print(report.markdown(summaries, base_name))
    duo = next(s for s in summaries if s.config.startswith(("duo: lead + back (model)",
                                                             "SIM duo")))
    lead_alone = next(s for s in summaries if s.config == base_name)
    alpha = duo.acceptance or 0.0
    best, k = report.bound(data["costs"], alpha)
    speedup = duo.tok_s / lead_alone.tok_s if lead_alone.tok_s else 0.0
    print("\nverify cost / single token: " + ", ".join(
        f"b={b} {c / data['costs'][1]:.2f}x" for b, c in sorted(data["costs"].items())
        if b in (2, 3, 4, 5, 8, 16, 17)))
    print(f"analytic bound at acceptance {alpha:.2f}: {best:.2f}x (k={k}); duo measured "
          f"{speedup:.2f}x = {speedup / best:.2f} of the bound")
    if data["sweep"]:
        print("\n| draft length | tok/s |\n|---|---|")
        for k_name, tps in data["sweep"].items():
            print(f"| {k_name} | {tps:.2f} |")
        same_prompts = [r for r in reference if r.prompt < a.sweep_prompts]
        base = report.summarise(base_name, same_prompts, None).tok_s  # same prompts as sweep
        print(f"| lead alone, same prompts | {base:.2f} |")
        report.plot_sweep(out / "sweep.png", data["sweep"], base, f"{a.target} + {a.draft}")
    report.write_json(out / ("sim.json" if a.sim else "bench.json"), {
        "args": vars(a), "summaries": summaries, "costs": data["costs"],
        "bound": best, "speedup": speedup, "sweep": data["sweep"], "gauges": data["gauges"],
        "results": {n: [r.row() for r in rs] for n, rs in results.items()}})
    print(f"\nwrote {out}/{'sim.json' if a.sim else 'bench.json, sweep.png'}")


if __name__ == "__main__":
    main()
