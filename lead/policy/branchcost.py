"""Which of a back's branches to verify beside its draft: a tree priced as chains are
(the formulas: docs/cost-model.md, `branches`). A branch at draft position `at` is followed
only where the draft is rejected there and lead emits its root instead, which `cover`
measures for one root per position (the draft's 2nd choice; a 3rd holds the correction far
less often): so only the first branch at a position is priced. Where a wider batch costs
about b times a token, no branch pays and the step stays a chain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lead.policy.acceptance import yield_curve


def branch_lengths(k: int, offered: Sequence[tuple[int, int]], alpha: float, cover: float,
                   expected: float, price: Callable[[int], float], most: int) -> list[int]:
    """Per offered branch (at, tokens), how many of its tokens to verify beside a draft of
    k tokens (0: none): in turn, the length that most raises expected tokens per second
    (`expected` tokens for the chain alone, `price(b)` seconds for a batch of b tokens),
    kept where it raises them; at most `most` tokens in the batch in all."""
    lengths = [0] * len(offered)
    batch, value = k + 1, expected
    for j, (at, n_tokens) in enumerate(offered):
        if at >= k or at in (earlier for earlier, _ in offered[:j]):  # a position's first only
            continue
        reach = alpha ** at * (1.0 - alpha) * cover
        more = yield_curve([alpha] * (min(n_tokens, most - batch) - 1))  # n tokens: more[n - 1]
        rates = {n: (value + reach * more[n - 1]) / price(batch + n)
                 for n in range(2, len(more) + 1)}  # a root alone adds nothing
        best = max(rates, key=rates.__getitem__, default=0)
        if best and rates[best] > value / price(batch):
            lengths[j] = best
            batch += best
            value += reach * more[best - 1]
    return lengths
