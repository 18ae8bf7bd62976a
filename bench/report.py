"""Aggregate results per configuration; the bounds and ideals; Markdown, JSON and a PNG."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
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
    ready_after_rejection: float | None = None  # share of steps after a rejection


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
                   differing, len({r.prompt for r in results}), ready_after_rejection(results))


FIRST_ROUND = ("every prompt new to every server; in later rounds lead and llama-server "
               "--spec-default may draft a reply from the same reply before")


def first_round(results: dict[str, list[Result]]) -> dict[str, list[Result]]:
    """Each configuration's results of the first round."""
    return {name: [r for r in rs if r.round == 0] for name, rs in results.items()}


def ready_after_rejection(results: list[Result]) -> float | None:
    """Share of lead's steps after a rejection that found a draft ready (branches off the
    rejected draft); None where no step followed a rejection or lead does not count them."""
    counted = [r for r in results if r.after_rejection is not None]
    after = sum(r.after_rejection or 0 for r in counted)
    return sum(r.ready_after_rejection or 0 for r in counted) / after if after else None


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


def per_prompt(results: dict[str, list[Result]], baseline: str, configs: list[str],
               label: str = "lead alone") -> str:
    """Each configuration against the baseline (`label` in the header: lead alone unless
    told), prompt by prompt (measured side by side)."""
    base = speed_by_prompt(results[baseline])
    speeds = [speed_by_prompt(results[c]) for c in configs]
    lines = [f"| prompt | {label} tok/s | " + " | ".join(configs) + " |",
             "|---|---|" + "---|" * len(configs)]
    for prompt, tps in sorted(base.items()):
        cells = [f"{by[prompt] / tps:.2f}x" if tps and prompt in by else "-" for by in speeds]
        lines.append(f"| {prompt} | {tps:.2f} | " + " | ".join(cells) + " |")
    worst = [min((by[p] / base[p] for p in by if base.get(p)), default=0.0) for by in speeds]
    lines.append("| **worst** | | " + " | ".join(f"**{w:.2f}x**" for w in worst) + " |")
    return "\n".join(lines)


def markdown(summaries: list[Summary], baseline: str, peers: Sequence[str] = ()) -> str:
    """The summary table: each configuration against lead alone and against each of `peers`
    (llama-server plain, with its n-gram drafts) that ran."""
    speeds = {s.config: s.tok_s for s in summaries}
    against = [baseline] + [peer for peer in peers if peer in speeds]
    titles = " | ".join(["vs lead alone"] + [f"vs {peer.removeprefix('peer: ')}"
                                             for peer in against[1:]])
    lines = [f"| configuration | tok/s | {titles} | acceptance | tokens/step | TTFT s | "
             "replies differing from lead alone | ready after rejection |",
             "|---|---|" + "---|" * len(against) + "---|---|---|---|---|"]
    bases = [speeds.get(name, 0.0) for name in against]
    return "\n".join(lines + [_row(s, bases) for s in summaries])


def prefill_line(reference: list[Result], summaries: list[Summary]) -> str | None:
    """The limit drafting works toward: `reference`'s prompts evaluated per second (prompt
    tokens over time to first token, each prompt new to its server), and each decode rate
    over it. None where the server did not count its prompts' tokens."""
    counted = [r for r in reference if r.prompt_tokens > 0 and r.ttft_s > 0]
    if not counted:
        return None
    rate = sum(r.prompt_tokens for r in counted) / sum(r.ttft_s for r in counted)
    shares = ", ".join(f"{s.config} {s.tok_s / rate:.2f}" for s in summaries)
    return (f"prefill (the limit: drafted tokens verified in batches at best run at it): "
            f"{rate:.1f} tok/s, {reference[0].config}'s prompts over their time to first "
            f"token; each decode rate over it: {shares}")


def _row(s: Summary, bases: list[float]) -> str:
    ratios = " | ".join(f"{s.tok_s / base:.2f}x" if base else "-" for base in bases)
    acc = f"{s.acceptance:.2f}" if s.acceptance is not None else "-"
    tps = f"{s.tokens_per_step:.2f}" if s.tokens_per_step is not None else "-"
    diff = f"{s.differing}/{s.prompts}" if s.differing is not None else "-"
    ready = f"{s.ready_after_rejection:.0%}" if s.ready_after_rejection is not None else "-"
    return (f"| {s.config} | {s.tok_s:.2f} | {ratios} | {acc} | {tps} | {s.ttft_s:.2f} | "
            f"{diff} | {ready} |")


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=_plain))


def _plain(o: object) -> object:
    """JSON for what json cannot write itself: paths (in the args) and dataclasses."""
    return str(o) if isinstance(o, Path) else o.__dict__


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


def show_bounds(a: argparse.Namespace, data: dict, results: dict[str, list[Result]],
                summaries: list[Summary], base_name: str, duo_name: str) -> dict:
    """Print the free-draft bound, the async ideal and the ideal with branches (a branch
    ready after a.cover of rejections) for this placement against duo; return them."""
    from bench.ideal import async_ideal, branch_ideal, free_draft_bound, padded
    from lead.server.settings import LeadSettings

    costs: dict[int, float] = data["costs"]
    drafting = [n for n in results if n == duo_name or n.startswith("peer: synchronous")]
    measured = alpha([r for n in drafting for r in results[n]])
    tok_s = {s.config: s.tok_s for s in summaries}
    speedup = tok_s[duo_name] / tok_s[base_name] if tok_s[base_name] else 0.0
    cost, draft_s = padded(costs), data["draft_s"]
    max_draft = LeadSettings().max_draft  # what lead verifies at most per step
    free, free_k = free_draft_bound(cost, measured or 0.0, max_draft)
    ideal, ideal_k = async_ideal(cost, measured or 0.0, draft_s, max_draft)
    branched, branched_k = branch_ideal(cost, measured or 0.0, draft_s, max_draft, a.cover)
    ready = ready_after_rejection(results[duo_name])
    print("\nverify cost / single token: " + ", ".join(
        f"b={b} {c / costs[1]:.2f}x" for b, c in sorted(costs.items())
        if b in (2, 3, 4, 5, 8, 16, 17)) + f"; draft {draft_s * 1e3:.1f} ms/token, "
        f"target {costs[1] * 1e3:.1f} ms/token")
    print(f"acceptance per draft token (accepted / (accepted + rejections), {', '.join(drafting)}"
          "): " + (f"{measured:.2f}" if measured is not None else
                   "- (no draft was verified: the back sat out, or lead asked for none)"))
    print(f"analytic bound with free drafts: {free:.2f}x (k={free_k}); ideal async back at "
          f"the measured draft speed: {ideal:.2f}x (k={ideal_k}); with a branch ready after "
          f"{a.cover:.0%} of rejections (--cover): {branched:.2f}x (k={branched_k})")
    print(f"duo measured {speedup:.2f}x = {speedup / ideal:.2f} of the async ideal, "
          f"{speedup / branched:.2f} of the ideal with branches, {speedup / free:.2f} of the "
          "free-draft bound")
    print("steps after a rejection that found a draft ready (duo): " + (
        f"{ready:.0%}" if ready is not None else
        "- (no step followed a rejection, or this lead does not count them)"))
    if getattr(a, "back_sits_out", False) and not a.sim:
        print("(in this placement the back sits out: lead uses every core, so the ideals, "
              "which price the draft at its own speed on cores of its own, do not apply)")
    return {"alpha": measured or 0.0, "free_bound": free, "bound": ideal, "speedup": speedup,
            "cover": a.cover, "branch_bound": branched, "ready_after_rejection": ready,
            **_per_prompt_ideals(a.cover, data, results, drafting, base_name, speedup)}


def _per_prompt_ideals(cover: float, data: dict, results: dict[str, list[Result]],
                       drafting: list[str], base_name: str, speedup: float) -> dict:
    """The ideals from each prompt's own acceptance, and replaying each reply's measured
    agreement where the run measured it; printed and returned."""
    from bench.ideal import async_ideal, branch_ideal, padded, replayed_ideal
    from lead.server.settings import LeadSettings

    cost, draft_s = padded(data["costs"]), data["draft_s"]
    max_draft = LeadSettings().max_draft
    alphas = alpha_by_prompt([r for n in drafting for r in results[n]])
    per_prompt = pooled_ideal(results[base_name], lambda p: async_ideal(
        cost, alphas.get(p) or 0.0, draft_s, max_draft)[0])
    branched = pooled_ideal(results[base_name], lambda p: branch_ideal(
        cost, alphas.get(p) or 0.0, draft_s, max_draft, cover)[0])
    print(f"async ideal from each prompt's own acceptance (one acceptance for all prompts "
          f"credits prose with code's): {per_prompt:.2f}x; duo = {speedup / per_prompt:.2f} "
          f"of it; with branches: {branched:.2f}x; duo = {speedup / branched:.2f} of it")
    ideals = {"bound_per_prompt": per_prompt, "branch_bound_per_prompt": branched}
    if data.get("agreement"):
        replayed = pooled_ideal(results[base_name], lambda p: replayed_ideal(
            cost, data["agreement"].get(p, []), draft_s, max_draft)[0])
        print(f"async ideal replaying each reply's measured draft agreement (where the draft "
              f"goes wrong as it did, not at random): {replayed:.2f}x; duo = "
              f"{speedup / replayed:.2f} of it")
        ideals["bound_replayed"] = replayed
    if data.get("covers"):
        ideals |= _replayed_branches(data, results[base_name], speedup)
    return ideals


def _replayed_branches(data: dict, alone: list[Result], speedup: float) -> dict:
    """The ideal with branches on each reply's own draft agreement and runner-up (a branch
    ready after exactly the rejections the draft's runner-up holds); printed and returned."""
    from bench.ideal import padded, replayed_ideal
    from lead.server.settings import LeadSettings

    cost, draft_s = padded(data["costs"]), data["draft_s"]
    agreement, covers = data["agreement"], data["covers"]
    branched = pooled_ideal(alone, lambda p: replayed_ideal(
        cost, agreement.get(p, []), draft_s, LeadSettings().max_draft, covers.get(p))[0])
    missed = [c for p, a in agreement.items() for c, ok in zip(covers[p], a, strict=True)
              if not ok]
    cover = sum(missed) / len(missed) if missed else 0.0
    print(f"ideal with branches replaying each reply's draft (a branch ready where the "
          f"draft's runner-up is the target's token: {cover:.0%} of its misses here): "
          f"{branched:.2f}x; duo = {speedup / branched:.2f} of it")
    ideals = {"branch_bound_replayed": branched, "cover_replayed": cover}
    if data.get("draft_q"):
        ideals["branch_bound_per_token"] = per_token = _per_token(data, alone)
        print(f"the same with acceptance per token (each step verifies as far as pays for "
              f"its draft's own probabilities, by band of the draft's q as lead prices a back's): "
              f"{per_token:.2f}x; duo = {speedup / per_token:.2f} of it")
    return ideals


def _per_token(data: dict, alone: list[Result]) -> float:
    """The replayed ideal with branches, each step's length chosen by its tokens' probabilities."""
    from bench.ideal import band_p_accept, padded, per_token_ideal
    from lead.drafts.board import Q
    from lead.server.settings import LeadSettings

    prompts = sorted(data["agreement"])
    p_accept = dict(zip(prompts, band_p_accept([data["agreement"][p] for p in prompts],
                                       [data["draft_q"][p] for p in prompts],
                                       [low for low, _ in Q.priors]),
                    strict=True))
    return pooled_ideal(alone, lambda p: per_token_ideal(
        padded(data["costs"]), data["agreement"].get(p, []), p_accept.get(p, []), data["draft_s"],
        LeadSettings().max_draft, data["covers"].get(p)))


def pooled_ideal(alone: list[Result], ideal_of: Callable[[int], float]) -> float:
    """An ideal computed for each prompt on its own (`ideal_of(prompt)`), pooled over lead
    alone's time."""
    from bench.ideal import pooled_speedup

    seconds = seconds_by_prompt(alone)
    return pooled_speedup(seconds, {p: ideal_of(p) for p in seconds})
