"""What speculation could reach, from measured costs and acceptance.

`free_draft_bound`: drafts of any length are ready at every step, for free. The
classic analytic bound, max_k E(k) c(1) / c(k+1); no real draft reaches it.

`async_ideal`: the same target and acceptance, with a draft that costs `draft_s` per
token and runs beside the target, as duo's back does, but with everything else ideal:
lead and back hear of each other at once, and lead verifies min(K, drafted) tokens at
every step for the best fixed K. A draft token is right with probability alpha given
its predecessors were (tokens are i.i.d. in that sense: a geometric model). After a
rejection the draft must start over from lead's correction, so the next step finds
little or nothing to verify: this is the price of not waiting for drafts, and what
separates this ideal from the free-draft bound. Measured / async ideal is then the
efficiency of duo's protocol itself (HTTP, polling, the cost model's choices).

`branch_ideal`: the async ideal with a branch ready after a rejection. A back that drafts
its next m choices at each draft position as branches holds lead's correction with
probability `cover` (measured by `python -m bench.coverage`); then the path after a
rejection at position p is that branch, drafted beside the main chain since the draft's
row at p was known, instead of a path started when lead's correction arrives. A miss past
the draft's end has no branch and starts over. Branch tokens are free here (spare draft
time): where the draft has little spare time, this overstates what branches can give.
At cover 0 it is the async ideal exactly.

`replayed_ideal`: the same ideal back, but its tokens go wrong where the real draft's did
(measured per position against the target's reply), not independently at random; given
where the draft's runner-up is the target's token, with a branch ready after exactly
those rejections (a branch's root is the draft's runner-up at its site). A reply's first
draft is ready at once, as a back drafts while lead evaluates the prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lead.policy.acceptance import MAX_ALPHA, expected_accepted

Cost = Callable[[int], float]  # seconds to verify a batch of b tokens


def padded(costs: dict[int, float]) -> Cost:
    """Verify cost where a batch may be padded to any larger measured one that is cheaper,
    as lead does (on one CPU 4 tokens cost 1.5x one, 3 tokens 2x): the bound must allow
    what lead does, or measured / bound would flatter duo."""
    return lambda b: min(c for size, c in costs.items() if size >= b)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per verify step when each draft token is accepted with probability alpha."""
    return 1.0 + expected_accepted([min(alpha, MAX_ALPHA)] * k)


def free_draft_bound(cost: Cost, alpha: float, max_draft: int) -> tuple[float, int]:
    """(speedup over plain decoding, best k) with free, always-ready drafts."""
    return max((expected_tokens(alpha, k) * cost(1) / cost(k + 1), k)
               for k in range(max_draft + 1))


@dataclass
class _Draft:
    """The back's current path: it starts at lead position `start`, its token i is ready
    at time t0 + (i + 1) * draft_s, and token `wrong` is its first wrong one."""

    start: int
    t0: float
    wrong: int

    def ready(self, now: float, draft_s: float, limit: int) -> int:
        made = int((now - self.t0) / draft_s) if draft_s > 0 else limit
        return max(0, min(made, limit))


def _never(_at: int) -> bool:
    return False


def _all(_n: int, ready: int) -> int:
    return ready


def simulate(cost: Cost, wrong_from: Callable[[int], int], draft_s: float, k_max: int,
             n_tokens: int, max_ahead: int = 16, covered: Callable[[int], bool] = _never,
             primed: bool = False, length: Callable[[int, int], int] = _all) -> float:
    """Seconds for lead to emit `n_tokens` verifying min(k_max, ready) draft tokens per step.
    `wrong_from(n)`: how many tokens a draft path started at lead position n gets right;
    `covered(at)`: whether a branch holds lead's token at `at` where the draft reached it
    and was wrong; `primed`: the first path is drafted `max_ahead` tokens before lead's first
    step (while it evaluated the prompt); `length(n, k)`: how many of the k ready tokens
    from position n lead verifies (all, by default)."""
    now, n = 0.0, 0
    path = _Draft(0, -max_ahead * draft_s if primed else 0.0, wrong_from(0))
    while n < n_tokens:
        # The path's tokens before n are all lead's (else it would have restarted).
        ready = path.ready(now, draft_s, n - path.start + max_ahead) - (n - path.start)
        k = length(n, min(k_max, max(ready, 0)))
        accepted = min(k, path.wrong - (n - path.start))
        now += cost(k + 1)
        n += accepted + 1
        if path.wrong < n - path.start:  # lead emitted a token the path got wrong
            path = _after_rejection(path, n, now, draft_s, wrong_from(n), covered)
    return now


def _after_rejection(path: _Draft, n: int, now: float, draft_s: float, wrong: int,
                     covered: Callable[[int], bool]) -> _Draft:
    """The path from lead position n, after lead's correction at n - 1 (the old path's miss):
    a branch drafted since the draft's row at the miss was known, if the draft had reached
    it and a branch holds the correction; else a path that starts now."""
    miss_known = path.t0 + (path.wrong + 1) * draft_s
    if miss_known <= now and covered(path.start + path.wrong):
        return _Draft(n, miss_known, wrong)
    return _Draft(n, now, wrong)


def geometric(alpha: float, rng: np.random.Generator) -> Callable[[int], int]:
    """Draft paths whose tokens are each right with probability alpha."""
    return lambda _: int(rng.geometric(1 - alpha)) - 1 if alpha < 1 else 1 << 30


def replayed(agrees: Sequence[bool]) -> Callable[[int], int]:
    """Draft paths as measured: agrees[j] says whether the draft's greedy token for
    position j, given lead's tokens before it, is lead's."""
    def wrong_from(n: int) -> int:
        return next((j - n for j in range(n, len(agrees)) if not agrees[j]), 1 << 30)
    return wrong_from


def async_ideal(cost: Cost, alpha: float, draft_s: float, max_draft: int,
                n_tokens: int = 2000, runs: int = 5, seed: int = 0, cover: float = 0.0
                ) -> tuple[float, int]:
    """(speedup over plain decoding, best fixed K) for an ideal asynchronous back; with
    `cover` > 0, one with a branch ready after that share of rejections (branch_ideal)."""
    rng = np.random.default_rng(seed)
    coins = np.random.default_rng([seed, 1])  # apart: cover 0 draws the same paths
    covered = (lambda _: bool(coins.random() < cover)) if cover > 0 else _never
    plain = cost(1) * n_tokens
    best = (1.0, 0)
    for k_max in range(1, max_draft + 1):
        seconds = np.mean([simulate(cost, geometric(alpha, rng), draft_s, k_max, n_tokens,
                                    covered=covered) for _ in range(runs)])
        best = max(best, (plain / float(seconds), k_max))
    return best


def branch_ideal(cost: Cost, alpha: float, draft_s: float, max_draft: int, cover: float,
                 n_tokens: int = 2000, runs: int = 5, seed: int = 0) -> tuple[float, int]:
    """(speedup, best fixed K) for an ideal back whose branches hold the correction of a
    rejection with probability `cover`: between the async ideal (cover 0) and free drafts."""
    if not 0.0 <= cover <= 1.0:
        raise ValueError(f"cover must be a share in [0, 1], not {cover}")
    return async_ideal(cost, alpha, draft_s, max_draft, n_tokens, runs, seed, cover)


def replayed_ideal(cost: Cost, agrees: Sequence[bool], draft_s: float, max_draft: int,
                   covers: Sequence[bool] | None = None) -> tuple[float, int]:
    """async_ideal on one reply's measured agreement instead of i.i.d. tokens: where the
    draft goes wrong in runs (prose), fewer steps find a right draft than alpha suggests.
    With `covers` (per position: the draft's runner-up is the target's token), a branch is
    ready after exactly the rejections it covers."""
    if not agrees:
        return 1.0, 0
    plain = cost(1) * len(agrees)
    covered = (lambda at: bool(covers[at])) if covers else _never
    return max([(1.0, 0)] + [
        (plain / simulate(cost, replayed(agrees), draft_s, k, len(agrees), covered=covered,
                          primed=True), k)
        for k in range(1, max_draft + 1)])


def best_length(cost: Cost, p_accept: Sequence[float]) -> int:
    """The length of a draft whose tokens are right with `p_accept` (each given the ones before
    it) that emits the most tokens a second (0: plain decoding pays best)."""
    best, chosen, reach, expected = 1.0 / cost(1), 0, 1.0, 1.0
    for k, p in enumerate(p_accept, 1):
        reach *= p
        expected += reach
        if expected / cost(k + 1) > best:
            best, chosen = expected / cost(k + 1), k
    return chosen


def per_token_ideal(cost: Cost, agrees: Sequence[bool], p_accept: Sequence[float], draft_s: float,
                    max_draft: int, covers: Sequence[bool] | None = None) -> float:
    """replayed_ideal with acceptance per token: each step verifies as much of the ready
    draft as pays for its own tokens' probabilities (`p_accept[j]`: that the draft's token at reply
    position j is right, as lead would price it), not the best fixed K for all steps."""
    if not agrees:
        return 1.0
    covered = (lambda at: bool(covers[at])) if covers else _never
    return cost(1) * len(agrees) / simulate(
        cost, replayed(agrees), draft_s, max_draft, len(agrees), covered=covered, primed=True,
        length=lambda n, k: best_length(cost, p_accept[n:n + k]))


def band_p_accept(agrees: Sequence[Sequence[bool]], probs: Sequence[Sequence[float]],
              bands: Sequence[float]) -> list[list[float]]:
    """Per reply and position, the share of all replies' draft tokens right in the band of
    the draft's probability of that token (its lower end in `bands`): probabilities as lead learns
    them per band of q (lead/drafts/board.py `Q`), measured on the replies themselves."""
    def band(q: float) -> float:
        return max([b for b in bands if b <= q], default=min(bands))
    counts: dict[float, list[int]] = {}
    for reply, qs in zip(agrees, probs, strict=True):
        for right, q in zip(reply, qs, strict=True):
            counts.setdefault(band(q), [0, 0])[right] += 1
    share = {b: c[1] / (c[0] + c[1]) for b, c in counts.items()}
    return [[share[band(q)] for q in qs] for qs in probs]


def pooled_speedup(seconds: dict[int, float], speedup: dict[int, float]) -> float:
    """Speedup over several prompts, each with its own: total plain time over total
    sped-up time (prompts where plain decoding took longer weigh more)."""
    sped_up = sum(t / speedup[p] for p, t in seconds.items())
    return sum(seconds.values()) / sped_up if sped_up else 1.0
