"""Which of a back's branches to verify beside its draft: a tree priced as chains are.

A branch at draft position `at` is followed only where the draft is rejected there and
the token lead emits instead is the branch's root: with per-token acceptance alpha that
is alpha^at (1 - alpha) times `cover`, the measured share of rejections whose correction
a branch's root held. Followed, a branch of n tokens adds the continuation it gets
accepted, alpha + ... + alpha^(n-1) tokens on average (its root lead emits either way).
Each branch costs its tokens in the verify batch. A branch is verified, cut to the length
that pays best, where it raises expected tokens per second; on hardware where a wider
batch costs about b times a token, none does and the step stays a chain.
Only the first branch at a position is priced: `cover` is measured for one root per
position (the draft's 2nd choice), and a 3rd choice holds the correction far less often.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lead.policy.acceptance import expected_yield


def branch_lengths(k: int, offered: Sequence[tuple[int, int]], alpha: float, cover: float,
                   expected: float, price: Callable[[int], float], most: int) -> list[int]:
    """Per offered branch (at, tokens), how many of its tokens to verify beside a draft of
    k tokens (0: none): in turn, the length that most raises expected tokens per second
    (`expected` tokens for the chain alone, `price(b)` seconds for a batch of b tokens),
    kept where it raises them; at most `most` tokens in the batch in all."""
    lengths = [0] * len(offered)
    batch, value = k + 1, expected
    seen: set[int] = set()
    for j, (at, n_tokens) in enumerate(offered):
        if at >= k or at in seen:
            continue
        seen.add(at)
        reach = alpha ** at * (1.0 - alpha) * cover
        rate, best = value / price(batch), 0
        for n in range(2, min(n_tokens, most - batch) + 1):  # a root alone adds nothing
            gained = (value + reach * expected_yield([alpha] * (n - 1))) / price(batch + n)
            if gained > rate:
                rate, best = gained, n
        if best:
            lengths[j] = best
            batch += best
            value += reach * expected_yield([alpha] * (best - 1))
    return lengths
