"""python -m bench.replay: lead's own drafts replayed over recorded replies, without a model.

`record` asks a running lead for a workload's replies (greedy; the edits, or the bench
prompts, `--rounds 2`: each asked again) and keeps each prompt and reply; `run` replays
them: at each step lead's own drafters (lead/drafts/own.py) propose as lead would, on a
board ranked by the scoreboard, the cost model (lead/policy/cost.py) picks the length to
verify at the
relative prices given, and the recorded reply says how much of it was right. It prints per
reply the steps, the simulated time in one-token steps, the speedup over plain decoding
and the draft tokens verified in vain, beside an oracle that verifies exactly what is
right at each step (what better drafting alone could reach at those prices). Every figure
is a count, so two commits compare exactly (`DUO=path` is not needed: run it in each
checkout), whatever the machine is doing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import prompts as bench_prompts
from lead.drafts.board import Candidate, Draft, DraftBoard
from lead.drafts.own import OWN, OwnDrafts
from lead.policy.acceptance import agreement
from lead.policy.cost import CostModel
from lead.server.settings import parse_costs

LONGEST = 64  # lead's --ngram-max default
# A 2-core AMD EPYC (family 25) calibrated on the default target: b=2 .. 9, then 24, 32,
# 48, 65 (docs/benchmarks.md, "Replays without a model"); sizes between are interpolated.
EPYC_25 = {1: 1.0, 2: 1.62, 3: 2.09, 4: 2.26, 5: 2.94, 6: 3.51, 7: 4.12, 8: 4.70, 9: 6.63,
           24: 12.96, 32: 13.70, 48: 20.05, 65: 29.09}
# A 2-core AMD EPYC (family 26), where batches are cheaper: b=48 at about 12 single steps.
FAMILY_26 = {1: 1.0, 2: 1.6, 3: 2.2, 4: 2.4, 5: 2.9, 9: 4.9, 17: 7.0, 24: 8.0, 32: 9.0,
             48: 12.0, 65: 15.0}
SHAPES = {"epyc-25": EPYC_25, "family-26": FAMILY_26}


@dataclass(frozen=True)
class Replayed:
    tokens: int
    steps: int
    time: float  # in one-token steps
    wasted: int  # draft tokens verified and rejected

    @property
    def speedup(self) -> float:
        return self.tokens / self.time if self.time else 0.0


def relative(points: dict[int, float]) -> Callable[[int], float]:
    """A batch of b tokens' price over one token's, interpolated between `points`."""
    sizes = sorted(points)

    def price(b: int) -> float:
        for lo, hi in zip(sizes, sizes[1:], strict=False):
            if lo <= b <= hi:
                return points[lo] + (points[hi] - points[lo]) * (b - lo) / (hi - lo)
        return points[sizes[-1]] * b / sizes[-1]
    return price


def replay(prompt: Sequence[int], reply: Sequence[int], own: OwnDrafts, cost: CostModel,
           price: Callable[[int], float], sid: str, oracle: bool = False) -> Replayed:
    """One reply decoded greedily with lead's own drafts (`oracle`: each verified as far as
    it is right)."""
    tokens, i, time, steps, wasted = list(prompt), 0, 0.0, 0, 0
    board = DraftBoard(scores=cost.scores)
    while i < len(reply):
        draft = _offered(board, own, cost, sid, tokens)
        right = sum(agreement(draft.token_ids, reply[i:])) if draft else 0
        k = min(right, LONGEST) if oracle else \
            cost.allocate([list(draft.p_accept or []) if draft else []], 1)[0]
        accepted = min(k, right)
        emitted = min(accepted + 1, len(reply) - i)
        time, steps, wasted = time + price(k + 1), steps + 1, wasted + k - accepted
        tokens += reply[i:i + emitted]
        i += emitted
        cost.scores.settle(sid, tokens)
    cost.scores.settle(sid, tokens, final=True)
    own.forget(sid, tokens)
    return Replayed(len(reply), steps, time, wasted)


def _offered(board: DraftBoard, own: OwnDrafts, cost: CostModel, sid: str, tokens: list[int]
             ) -> Draft | None:
    """As lead's engine offers: each kind's proposal on the board, every offer watched on
    the scoreboard, the draft expected to yield most."""
    for kind, p in own.propose(sid, tokens).items():
        board.post(tokens, Candidate(OWN, len(tokens), p.token_ids, known=p.known,
                                     scale=p.scale, kind=kind))
    cost.scores.offered(sid, tokens, False, board.offers(tokens))
    return board.best(tokens, LONGEST)


def replay_all(pairs: Sequence[tuple[list[int], list[int]]], points: dict[int, float],
               oracle: bool = False) -> list[Replayed]:
    """Every reply in order, one lead: what earlier replies taught it carries over."""
    own, cost = OwnDrafts(LONGEST, 65536), CostModel(max_draft=8, longest=LONGEST)
    price = relative(points)
    cost.fix_prices([price(b) for b in range(2, 2 * LONGEST + 2)])
    return [replay(p, r, own, cost, price, f"s{i}", oracle) for i, (p, r) in enumerate(pairs)]


def record(lead: str, out: Path, workload: str = "edit", rounds: int = 1) -> None:
    """Each prompt's reply, `rounds` times over the prompts (a later round's replies are
    drafted from lead's memory of the earlier, and part from them where batches tip a
    near-tie), in the order asked."""
    import httpx

    from shared.wire.httpclient import lead_url
    prompts, kept = bench_prompts.load(workload), []
    most = bench_prompts.EDIT_TOKENS if workload == "edit" else 128
    for n in range(rounds * len(prompts)):
        prompt = prompts[n % len(prompts)]
        r = httpx.post(f"{lead_url(lead)}/v1/chat/completions", timeout=1800, json={
            "messages": [{"role": "user", "content": prompt["text"]}],
            "max_tokens": most, "temperature": 0})
        r.raise_for_status()
        kept.append({"prompt": prompt["text"], "reply": r.json()["choices"][0]["message"]
                     ["content"]})
        print(f"{n + 1}/{rounds * len(prompts)}", file=sys.stderr, flush=True)
    out.write_text(json.dumps(kept))


def tokenized(path: Path, model: str) -> list[tuple[list[int], list[int]]]:
    import llama_cpp

    vocab = llama_cpp.Llama(model, vocab_only=True, verbose=False)
    return [(vocab.tokenize(e["prompt"].encode(), add_bos=False),
             vocab.tokenize(e["reply"].encode(), add_bos=False))
            for e in json.loads(path.read_text())]


def report(policy: list[Replayed], best: list[Replayed]) -> str:
    lines = ["| reply | tokens | steps | time (one-token steps) | speedup | wasted | oracle "
             "speedup |", "|---|---|---|---|---|---|---|"]
    for i, (a, b) in enumerate(zip(policy, best, strict=True)):
        lines.append(f"| {i} | {a.tokens} | {a.steps} | {a.time:.0f} | {a.speedup:.2f} | "
                     f"{a.wasted} | {b.speedup:.2f} |")
    total = Replayed(*(sum(getattr(r, f) for r in policy) for f in ("tokens", "steps",
                                                                    "time", "wasted")))
    oracle = sum(r.tokens for r in best) / sum(r.time for r in best)
    lines.append(f"| all | {total.tokens} | {total.steps} | {total.time:.0f} | "
                 f"{total.speedup:.3f} | {total.wasted} | {oracle:.3f} |")
    return "\n".join(lines)


def prices_arg(text: str) -> dict[int, float]:
    """'1.6,2.1,...' (batches of 2, 3, ... over one token, as --verify-cost)."""
    return {1: 1.0, **{b: c for b, c in enumerate(parse_costs(text), start=2)}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="a workload's replies from a running lead")
    rec.add_argument("--lead", default="127.0.0.1:5555")
    rec.add_argument("--out", type=Path, default=Path("replies.json"))
    rec.add_argument("--workload", choices=sorted(bench_prompts.WORKLOADS), default="edit")
    rec.add_argument("--rounds", type=int, default=1, help="times over the prompts (2: "
                     "each question asked again, drafted from lead's memory)")
    run = sub.add_parser("run", help="replay recorded replies")
    run.add_argument("replies", type=Path)
    run.add_argument("--model", default=None, help="the target GGUF whose tokenizer the "
                     "replies are read with (default: the default pair's target)")
    run.add_argument("--shape", choices=sorted(SHAPES), default="epyc-25", help="the "
                     "relative prices of a CPU measured before (default: %(default)s)")
    run.add_argument("--verify-cost", type=prices_arg, default=None, help="a batch of 2, "
                     "3, ... tokens over one token, as lead's flag (instead of --shape)")
    a = parser.parse_args(argv)
    if a.command == "record":
        return record(a.lead, a.out, a.workload, max(a.rounds, 1))
    from shared.presets import PRESETS, cache_dir
    model = a.model or str(cache_dir() / PRESETS["qwen2.5-coder-1.5b"].filename)
    pairs, points = tokenized(a.replies, model), a.verify_cost or SHAPES[a.shape]
    print(report(replay_all(pairs, points), replay_all(pairs, points, oracle=True)))


if __name__ == "__main__":
    main()
