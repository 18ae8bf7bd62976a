"""The odds that lead accepts a back's draft token, per token, from the draft model's own
probability of it (pure).

A draft model sure of a token (q near 1) is usually right; one choosing among near-ties
often is not. How often depends on the pair of models and the work, so lead learns it per
back and per band of q, from every token a back offered compared with what lead then
emitted (up to the first miss: past it a token's odds given the ones before are not
observed). A back's numbers are only as good as they turn out: one that claims q = 1 for
junk teaches lead what its q = 1 is worth within a few outcomes.
"""

from __future__ import annotations

from collections.abc import Sequence

from lead.policy.acceptance import Bands, Rate, agreement
from shared.bounded import Lru

# Bands of q (their lower ends). A band holds decayed counts of right and wrong tokens;
# its odds start from the back's measured acceptance (lead/drafts/rank.py), worth WEIGHT
# outcomes, and move from there as the band's own outcomes come in: where q says nothing
# (or a back sends noise) every band stays near the back's acceptance.
BANDS = (0.0, 0.3, 0.5, 0.7, 0.85, 0.95, 0.99)
WEIGHT = 4.0
DECAY = 0.99  # per outcome in a band
KEPT = 256  # backs whose odds are kept (least recently updated dropped first)


def bands() -> Bands:
    return Bands({b: Rate((0.0, 0.0), DECAY) for b in BANDS})


class BackOdds:
    def __init__(self, kept: int = KEPT) -> None:
        self.bands: Lru[str, Bands] = Lru(kept)  # per back

    def odds(self, key: str, probs: Sequence[float], alpha: float) -> tuple[float, ...]:
        """Per token of a draft whose draft-model probabilities are `probs`: the odds that
        lead accepts it, given the ones before it; `alpha`: the back's acceptance."""
        rates, prior = self.bands.get(key) or bands(), (WEIGHT * alpha, WEIGHT * (1 - alpha))
        return tuple(rates[q].given(prior) for q in probs)

    def record(self, key: str, probs: Sequence[float], offered: Sequence[int],
               emitted: Sequence[int]) -> None:
        """Score what a back offered (with its q per token) against what lead emitted."""
        rates = self.bands.get(key) or bands()
        for q, right in zip(probs, agreement(offered, emitted), strict=False):
            rates[q].record(right, not right)
        self.bands[key] = rates  # the least recently updated back goes first
