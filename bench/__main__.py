"""python -m bench: lead alone against a raw llama-cpp-python loop, side by side.

For each prompt, the raw loop and lead (a real process, over HTTP, streaming) decode
the same number of greedy tokens with the same model and threads, one after the
other; decode speed excludes prompt evaluation. Prints a Markdown table and writes
JSON. Ratios are taken within the run, since these machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

from bench.procs import Lead
from bench.raw import RawLoop
from shared.presets import resolve_model

PROMPTS = json.loads((Path(__file__).parent / "prompts.json").read_text())


def lead_decode(lead: Lead, text: str, n: int) -> tuple[int, float, str]:
    """Tokens and seconds from first to last streamed token (prefill excluded)."""
    t_first = t_last = None
    tokens = 0
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": n, "stream": True}
    with httpx.stream("POST", f"{lead.url}/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["duo"]["tokens"]:
                now = time.perf_counter()
                t_first = t_first or now
                t_last = now
                tokens += event["duo"]["tokens"]
            finish = event["choices"][0]["finish_reason"]
    return tokens - 1, (t_last or 0) - (t_first or 0), finish or ""


def run_one(who: str, raw: RawLoop, lead: Lead, text: str, ids: list[int],
            n: int) -> tuple[int, float]:
    """Decode n tokens (after the first) one way; tokens and seconds, prefill excluded."""
    if who == "lead":
        tokens, seconds, _ = lead_decode(lead, text, n + 1)
        return tokens, seconds
    out, seconds = raw.decode(ids, n + 1)
    return len(out) - 1, seconds * (len(out) - 1) / max(len(out), 1)


def chat_prompt_ids(text: str, model: str) -> list[int]:
    from shared.llm import LlamaModel

    m = LlamaModel(resolve_model(model), threads=1, n_ctx=512)
    try:
        return m.tokenize(m.format_chat([{"role": "user", "content": text}]), special=True,
                          add_bos=False)
    finally:
        m.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64, help="tokens decoded per prompt")
    p.add_argument("--prompts", type=int, default=len(PROMPTS))
    p.add_argument("--quick", action="store_true", help="SmolLM2, 3 prompts, 32 tokens")
    p.add_argument("--out", default="bench-results/lead_vs_raw.json")
    a = p.parse_args(argv)
    if a.quick:
        a.model, a.prompts, a.tokens = "smollm2-135m", 3, 32
    prompts = PROMPTS[: a.prompts]
    raw = RawLoop(resolve_model(a.model), a.threads)
    lead = Lead(a.model, "--threads", str(a.threads), "--max-draft", "0")
    rows = []
    try:
        for i, prompt in enumerate(prompts, 1):
            ids = chat_prompt_ids(prompt["text"], a.model)
            row = {"kind": prompt["kind"], "raw_tokens": 0, "raw_s": 0.0, "lead_tokens": 0,
                   "lead_s": 0.0}
            for who in ("raw", "lead", "lead", "raw"):  # ABBA: cancels drift over time
                n, seconds = run_one(who, raw, lead, prompt["text"], ids, a.tokens)
                row[f"{who}_tokens"] += n
                row[f"{who}_s"] += seconds
            rows.append(row)
            print(f"[{i}/{len(prompts)}] {prompt['kind']}: raw "
                  f"{row['raw_tokens'] / row['raw_s']:.1f} tok/s, lead "
                  f"{row['lead_tokens'] / row['lead_s']:.1f} tok/s", file=sys.stderr, flush=True)
    finally:
        lead.stop()
        raw.close()
    report(rows, a)


def report(rows: list[dict], a: argparse.Namespace) -> None:
    print(f"\nmodel {a.model}, {a.threads} threads, {a.tokens} tokens per prompt\n")
    print("| prompt | raw loop tok/s | lead alone tok/s | lead / raw |")
    print("|---|---|---|---|")
    for r in rows:
        raw_tps, lead_tps = r["raw_tokens"] / r["raw_s"], r["lead_tokens"] / r["lead_s"]
        print(f"| {r['kind']} | {raw_tps:.2f} | {lead_tps:.2f} | {lead_tps / raw_tps:.3f} |")
    raw_all = sum(r["raw_tokens"] for r in rows) / sum(r["raw_s"] for r in rows)
    lead_all = sum(r["lead_tokens"] for r in rows) / sum(r["lead_s"] for r in rows)
    print(f"| **all** | {raw_all:.2f} | {lead_all:.2f} | **{lead_all / raw_all:.3f}** |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": a.model, "threads": a.threads, "rows": rows,
                               "ratio": lead_all / raw_all}, indent=1))


if __name__ == "__main__":
    main()
