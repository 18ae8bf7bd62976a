"""Aggregate results per configuration; the analytic bound; Markdown, JSON and a PNG."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bench.runs import Result


@dataclass
class Summary:
    config: str
    tok_s: float
    ttft_s: float
    acceptance: float | None
    tokens_per_step: float | None
    differing: int | None
    prompts: int


def summarise(config: str, results: list[Result], reference: list[Result] | None) -> Summary:
    tokens = sum(r.tokens - 1 for r in results)
    seconds = sum(r.decode_s for r in results)
    drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
    steps = sum(r.steps for r in results)
    differing = None
    if reference is not None:  # prompts where a reply differs from lead alone's, same round
        texts = {(r.prompt, r.round): r.text for r in reference}
        differing = len({r.prompt for r in results
                         if r.text != texts.get((r.prompt, r.round), r.text)})
    return Summary(config, tokens / seconds if seconds else 0.0,
                   sum(r.ttft_s for r in results) / max(len(results), 1),
                   accepted / drafted if drafted else None,
                   sum(r.tokens for r in results) / steps if steps else None,
                   differing, len({r.prompt for r in results}))


def speed_by_prompt(results: list[Result]) -> dict[int, float]:
    """Decode tok/s per prompt over all its repetitions (total tokens / total seconds)."""
    tokens: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for r in results:
        tokens[r.prompt] = tokens.get(r.prompt, 0) + r.tokens - 1
        seconds[r.prompt] = seconds.get(r.prompt, 0.0) + r.decode_s
    return {p: tokens[p] / seconds[p] if seconds[p] else 0.0 for p in tokens}


def alpha(results: list[Result]) -> float | None:
    """Per-token acceptance (censored geometric MLE): accepted / (accepted + rejections)."""
    accepted = sum(r.accepted for r in results)
    observed = accepted + sum(r.rejections for r in results)
    return accepted / observed if observed else None


def alpha_by_prompt(results: list[Result]) -> dict[int, float | None]:
    return {p: alpha([r for r in results if r.prompt == p]) for p in {r.prompt for r in results}}


def seconds_by_prompt(results: list[Result]) -> dict[int, float]:
    seconds: dict[int, float] = {}
    for r in results:
        seconds[r.prompt] = seconds.get(r.prompt, 0.0) + r.decode_s
    return seconds


def per_prompt(results: dict[str, list[Result]], baseline: str, configs: list[str]) -> str:
    """Each configuration against lead alone, prompt by prompt (measured side by side)."""
    base = speed_by_prompt(results[baseline])
    speeds = [speed_by_prompt(results[c]) for c in configs]
    lines = ["| prompt | lead alone tok/s | " + " | ".join(configs) + " |",
             "|---|---|" + "---|" * len(configs)]
    for prompt, tps in sorted(base.items()):
        cells = [f"{by[prompt] / tps:.2f}x" if tps and prompt in by else "-" for by in speeds]
        lines.append(f"| {prompt} | {tps:.2f} | " + " | ".join(cells) + " |")
    worst = [min((by[p] / base[p] for p in by if base.get(p)), default=0.0) for by in speeds]
    lines.append("| **worst** | | " + " | ".join(f"**{w:.2f}x**" for w in worst) + " |")
    return "\n".join(lines)


def markdown(summaries: list[Summary], baseline: str) -> str:
    base = next((s.tok_s for s in summaries if s.config == baseline), 0.0)
    lines = ["| configuration | tok/s | vs lead alone | acceptance | tokens/step | TTFT s | "
             "replies differing from lead alone |", "|---|---|---|---|---|---|---|"]
    for s in summaries:
        speed = f"{s.tok_s / base:.2f}x" if base else "-"
        acc = f"{s.acceptance:.2f}" if s.acceptance is not None else "-"
        tps = f"{s.tokens_per_step:.2f}" if s.tokens_per_step is not None else "-"
        diff = f"{s.differing}/{s.prompts}" if s.differing is not None else "-"
        lines.append(f"| {s.config} | {s.tok_s:.2f} | {speed} | {acc} | {tps} | "
                     f"{s.ttft_s:.2f} | {diff} |")
    return "\n".join(lines)


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=lambda o: o.__dict__))


def client_note(tok_s: dict[str, float]) -> str | None:
    """Lead alone against the raw loop, like for like (not streamed, lead's own clock: no
    client works while either decodes) and as streamed to this benchmark's client, which
    shares the CPU with lead."""
    from bench.configs import LEAD_ALONE, LEAD_UNSTREAMED, RAW

    raw = tok_s.get(RAW)
    if not raw or LEAD_UNSTREAMED not in tok_s or LEAD_ALONE not in tok_s:
        return None
    return (f"lead alone against the raw loop: {tok_s[LEAD_UNSTREAMED] / raw:.2f}x like for "
            f"like (not streamed, timed by lead's own clock: no client works while either "
            f"decodes), {tok_s[LEAD_ALONE] / raw:.2f}x streamed to this benchmark's client, "
            "which takes CPU beside lead on this machine")


def plot_sweep(path: Path, sweep: dict[str, tuple[float, float]], title: str) -> bool:
    """Speed against lead alone (measured side by side) for each draft length; False where
    matplotlib is not installed (it is an optional extra: duo[bench])."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fixed = sorted((int(k), tps / alone) for k, (tps, alone) in sweep.items() if k.isdigit())
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([k for k, _ in fixed], [v for _, v in fixed], "o-", label="duo, fixed draft length")
    if "auto" in sweep:
        ax.axhline(sweep["auto"][0] / sweep["auto"][1], color="tab:green", ls="--",
                   label="duo, cost-aware (auto)")
    ax.axhline(1.0, color="tab:gray", ls=":", label="lead alone")
    ax.set_xlabel("draft length k")
    ax.set_ylabel("decode speed / lead alone (side by side)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
