"""The odds that a drafted token is right, learned per band of what its drafter knows of
it (pure): lead's own drafts by the length of the match they were copied after, a back's
model drafts by the draft model's probability of the token.

Each band starts from a prior worth a few outcomes and follows decayed counts of the
outcomes since, so that it tracks a change of work within a few hundred tokens.
"""

from __future__ import annotations

from collections.abc import Mapping


class BandOdds:
    def __init__(self, prior: Mapping[float, float], weight: float, decay: float) -> None:
        """`prior`: per band (its lower end) the odds to start from, counted as `weight`
        outcomes; each outcome in a band weighs the ones before by `decay`."""
        self.lowest, self.decay = min(prior), decay
        self.counts = {band: (p * weight, (1 - p) * weight) for band, p in prior.items()}

    def band(self, x: float) -> float:
        return max(b for b in self.counts if b <= max(x, self.lowest))

    def odds(self, x: float) -> float:
        right, wrong = self.counts[self.band(x)]
        return right / (right + wrong)

    def record(self, x: float, right: bool) -> None:
        band = self.band(x)
        r, w = self.counts[band]
        self.counts[band] = (r * self.decay + right, w * self.decay + (not right))
