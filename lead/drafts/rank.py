"""Which back's draft a step verifies: each back's own acceptance, and per token the odds
its draft model's probability q of it turns out to be worth (pure; docs/protocol.md, "Which
draft a step verifies"). Every back's best candidate is compared with what lead then emits,
verified or not: junk loses within a step or two and stays lost while it posts junk, and a
good back that joins late is measured (and wins) without lead first verifying its drafts.
How often a q is right depends on the pair of models and the work, so it is learned per
back and band of q: one that claims q = 1 for junk teaches lead what its 1 is worth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lead.policy.acceptance import Bands, Rate, agreement, draft_outcome
from shared.bounded import Lru

# Pseudo (matches, misses) of a back not yet seen: 0.8 with the weight of two outcomes, so
# a new back is tried at once and one miss at its first token puts it below a good one.
PRIOR = (1.6, 0.4)
DECAY = 0.9  # per outcome: about the last ten carry the estimate
RECENT = 3  # outcomes in the recent estimate: a back turning bad loses within a few steps
KEPT = 256  # backs whose estimate is kept (least recently updated dropped first)
# Bands of q (their lower ends), each with decayed counts of right and wrong tokens over a
# prior of the back's acceptance worth WEIGHT outcomes: where q says nothing (or a back sends
# noise) every band stays near the back's acceptance.
BANDS = (0.0, 0.3, 0.5, 0.7, 0.85, 0.95, 0.99)
WEIGHT = 4.0
BAND_DECAY = 0.99  # per outcome in a band
Offered = tuple[tuple[int, ...], tuple[float, ...] | None]  # a tail, its probabilities


def score() -> Rate:
    """A back's acceptance before any outcome; as lead's own, also over the last RECENT
    outcomes alone (a back good for long piles up matches: misses alone would take a score
    of steps to bring it down)."""
    return Rate(PRIOR, DECAY, RECENT)


def bands() -> Bands:
    return Bands({b: Rate((0.0, 0.0), BAND_DECAY) for b in BANDS})


@dataclass
class BackScores:
    """Acceptance per back, learned by comparing what backs offered at a step (`watch`)
    with the tokens lead emitted (`settle`, at the next step); per token where a back gave
    its draft model's probabilities (`bands`, per back)."""

    scores: Lru[str, Rate] = field(default_factory=lambda: Lru(KEPT))
    bands: Lru[str, Bands] = field(default_factory=lambda: Lru(KEPT))
    # what backs offered at a step: lead's token count then, and per back (the board's key)
    # the useful tail of its best candidate, with its draft model's probabilities if given
    watched: tuple[int, dict[str, Offered]] | None = None

    def alpha(self, key: str) -> float:
        return (self.scores.get(key) or score()).value

    def watch(self, n: int, offered: Mapping[str, Offered]) -> None:
        self.watched = (n, dict(offered)) if offered else None

    def settle(self, tokens: Sequence[int]) -> None:
        """Score what was offered at the last step against the tokens lead holds now."""
        watched, self.watched = self.watched, None
        n, offered = watched or (len(tokens), {})
        if len(tokens) <= n:
            return  # nothing watched, or no step since (or another reply): nothing to compare
        emitted = tokens[n:]
        for key, (tail, probs) in offered.items():
            self.record(key, *draft_outcome(tail, emitted))
            if probs is not None:
                self.record_probs(key, probs, tail, emitted)

    def record(self, key: str, matches: int, missed: bool) -> None:
        if matches == 0 and not missed:
            return  # nothing observed
        rate = self.scores.get(key) or score()
        rate.record(matches, int(missed))
        self.scores[key] = rate  # the least recently updated back goes first

    def odds(self, key: str, probs: Sequence[float]) -> tuple[float, ...]:
        """Per token of a back's draft whose draft-model probabilities are `probs`: the odds
        that lead accepts it, given the ones before it."""
        rates, alpha = self.bands.get(key) or bands(), self.alpha(key)
        prior = (WEIGHT * alpha, WEIGHT * (1 - alpha))
        return tuple(rates[q].given(prior) for q in probs)

    def record_probs(self, key: str, probs: Sequence[float], offered: Sequence[int],
                     emitted: Sequence[int]) -> None:
        rates = self.bands.get(key) or bands()
        for q, right in zip(probs, agreement(offered, emitted), strict=False):
            rates[q].record(right, not right)
        self.bands[key] = rates  # the least recently updated back goes first
