"""python -m bench.acceptance: draft acceptance when sampling (temperature > 0).

Lead (target) and back (draft) as real processes; the same prompts and seeds twice:
back posting its draft distributions (lead verifies by rejection sampling, min(1, p/q))
and back withholding them (lead verifies by sample-and-compare). Both are exact; the
first accepts more. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys

import httpx

from bench import prompts as bench_prompts
from bench.procs import Back, Lead


def run_mode(lead: Lead, draft: str, send_dists: bool, prompts: list[dict], tokens: int,
             temperature: float) -> tuple[int, int]:
    flag = "--send-dists" if send_dists else "--no-send-dists"
    back = Back(lead, draft, flag)
    drafted = accepted = 0
    try:
        back.wait_attached()
        for i, prompt in enumerate(prompts):
            r = httpx.post(f"{lead.url}/v1/chat/completions", timeout=600, json={
                "messages": [{"role": "user", "content": prompt["text"]}], "max_tokens": tokens,
                "temperature": temperature, "seed": 1000 + i})
            usage = r.json()["usage"]
            drafted += usage["drafted_tokens"]
            accepted += usage["accepted_tokens"]
            print(f"  {'rejection' if send_dists else 'compare'} [{i + 1}/{len(prompts)}] "
                  f"drafted {usage['drafted_tokens']} accepted {usage['accepted_tokens']}",
                  file=sys.stderr, flush=True)
    finally:
        back.stop()
    return drafted, accepted


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.acceptance",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b",
                   help="target model: preset name or GGUF path")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model of the back")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="sampling temperature, above 0")
    p.add_argument("--tokens", type=int, default=64, help="tokens per reply")
    p.add_argument("--prompts", type=int, default=4,
                   help="use the first N prompts of bench/prompts.json")
    p.add_argument("--draft-len", type=int, default=4, help="lead's fixed draft length")
    a = p.parse_args(argv)
    if a.temperature <= 0 or min(a.tokens, a.prompts, a.draft_len) < 1:
        p.error("--temperature must be above 0; --tokens, --prompts, --draft-len at least 1")
    prompts = bench_prompts.load()[: a.prompts]
    lead = Lead(a.target, "--draft-len", str(a.draft_len))
    try:
        results = {mode: run_mode(lead, a.draft, mode == "rejection", prompts, a.tokens,
                                  a.temperature) for mode in ("rejection", "compare")}
    finally:
        lead.stop()
    print(f"\n{a.target} + {a.draft}, temperature {a.temperature}, draft length {a.draft_len},"
          f" {len(prompts)} prompts x {a.tokens} tokens\n")
    print("| verification | drafted | accepted | acceptance |")
    print("|---|---|---|---|")
    for mode, (drafted, accepted) in results.items():
        name = "rejection sampling (draft q posted)" if mode == "rejection" else \
            "sample-and-compare (no q)"
        share = accepted / drafted if drafted else 0.0
        print(f"| {name} | {drafted} | {accepted} | {share:.3f} |")


if __name__ == "__main__":
    main()
