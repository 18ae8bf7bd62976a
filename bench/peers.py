"""The classic method duo must beat: draft and target in turns (synchronous), and a
direct measurement of what verifying a batch of b tokens costs on this placement."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from bench.runs import Result
from lead.decode.verify import verify
from shared.model import Model, sync_cache
from shared.wire.protocol import SamplingParams

GREEDY = SamplingParams()


def sync_speculative(config: str, index: int, target: Model, draft: Model,
                     prompt_ids: list[int], n: int, k: int) -> Result:
    """Draft k tokens, verify them in one target batch, keep the agreeing prefix, repeat."""
    for m in (target, draft):
        m.truncate(0)
    t0 = time.perf_counter()
    for m in (target, draft):
        sync_cache(m, prompt_ids[:-1])
    out: list[int] = []
    drafted = accepted = steps = rejections = 0
    t_first = None
    rng = np.random.default_rng(0)
    while len(out) < n:
        context_len = len(prompt_ids) + len(out)
        last = (prompt_ids + out)[-1]
        guesses = _draft_greedy(draft, last, k)
        rows = target.evaluate([last, *guesses], len(guesses) + 1)
        verdict = verify(guesses, rows, GREEDY, rng)
        target.truncate(context_len + len(verdict.accepted))
        out += verdict.emitted
        # the draft never evaluated its last guess: bring it to all but the newest token
        sync_cache(draft, (prompt_ids + out)[:-1])
        drafted, accepted, steps = drafted + len(guesses), accepted + len(verdict.accepted), \
            steps + 1
        rejections += int(len(verdict.accepted) < len(guesses))
        t_first = t_first or time.perf_counter()
        if any(t in target.eos_token_ids for t in verdict.emitted):
            break
    t_end = time.perf_counter()
    text = b"".join(target.token_bytes(t) for t in out[:n]).decode("utf-8", "replace")
    return Result(config, index, min(len(out), n), t_end - (t_first or t_end),
                  (t_first or t_end) - t0, drafted, accepted, steps, text, rejections)


def _draft_greedy(draft: Model, last: int, k: int) -> list[int]:
    guesses: list[int] = []
    token = last
    for _ in range(k):
        token = int(np.argmax(draft.evaluate([token], 1)[-1]))
        guesses.append(token)
    return guesses


def verify_costs(model: Model, prompt_ids: list[int], sizes: list[int],
                 repeats: int = 3) -> dict[int, float]:
    """Median seconds to evaluate b tokens (with logits for all b) after the prompt."""
    sync_cache(model, prompt_ids)
    base = len(model.cached)
    filler = prompt_ids[-1:] * max(sizes)
    costs: dict[int, float] = {}
    for b in sizes:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.evaluate(filler[:b], b)
            times.append(time.perf_counter() - t0)
            model.truncate(base)
        costs[b] = float(np.median(times))
    return costs


def agreement(draft: Model, prompt_ids: list[int], target_ids: list[int]) -> list[bool]:
    """Whether the draft's greedy token for each of the target's reply tokens, given the
    prompt and the target's tokens before it, is the target's (one batch, no decoding)."""
    return replay(draft, prompt_ids, target_ids).agrees


class Replay(NamedTuple):
    """Per token of the target's reply, the draft's row given the prompt and the target's
    tokens before it: whether its greedy token is the target's, whether its runner-up is
    (where a back's branch, rooted at the draft's runner-up, holds lead's correction), and
    its probability of its greedy token (the q a back sends with its draft)."""

    agrees: list[bool]
    covers: list[bool]
    probs: list[float]


def replay(draft: Model, prompt_ids: list[int], target_ids: list[int]) -> Replay:
    """The draft's rows on the target's reply, in one batch (no decoding)."""
    if not target_ids:
        return Replay([], [], [])
    draft.truncate(0)
    rows = draft.evaluate(prompt_ids + target_ids[:-1], len(target_ids))
    draft.truncate(0)
    top2 = [_first_two(row) for row in rows]
    return Replay([first == want for (first, _), want in zip(top2, target_ids, strict=True)],
                  [second == want for (_, second), want in zip(top2, target_ids, strict=True)],
                  [_top_prob(row) for row in rows])


def _top_prob(row: np.ndarray) -> float:
    shifted = np.exp(row.astype(np.float64) - float(np.max(row)))
    return float(1.0 / shifted.sum())  # the likeliest token's exp is 1


def _first_two(row: np.ndarray) -> tuple[int, int]:
    """The likeliest token and the runner-up (ties: the lower id, as argmax)."""
    first = int(np.argmax(row))
    rest = row.copy()
    rest[first] = -np.inf
    return first, int(np.argmax(rest))
