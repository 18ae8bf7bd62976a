"""How often drafts are right, and what that yields: the one estimator every acceptance
figure lead keeps is an instance of (`Rate`; `Bands` of them where the probability depends
on what a drafter knows of a token), the one comparison of a draft with what lead emitted
(made on the scoreboard alone: lead/policy/scoreboard.py), and the one function of the
tokens a draft is expected to get accepted that every length decision uses.

Reasoning and measurements: docs/cost-model.md.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

MAX_ALPHA = 0.999  # the expected-tokens series is finite only below 1


def accepted_curve(p_accept: Sequence[float]) -> list[float]:
    """Draft tokens a step verifying the first k of a draft is expected to accept, for
    k = 0 .. len(p_accept), token i right with p_accept[i] given the ones before it."""
    return [0.0, *accumulate(accumulate(p_accept, lambda reach, p: reach * p))]


def expected_accepted(p_accept: Sequence[float]) -> float:
    """Draft tokens a step verifying all of `p_accept`' draft is expected to accept."""
    return accepted_curve(p_accept)[-1]


def agreement(draft_ids: Sequence[int], emitted: Sequence[int]) -> list[bool]:
    """The one comparison of a draft with what lead emitted: per draft token, whether lead
    emitted it, up to the first that it did not (past a miss nothing is observed)."""
    out = []
    for guess, token in zip(draft_ids, emitted, strict=False):
        out.append(guess == token)
        if guess != token:
            break
    return out


def draft_outcome(draft_ids: Sequence[int], emitted: Sequence[int]) -> tuple[int, bool]:
    """(matches, missed): how many leading draft tokens lead then emitted, and whether a
    draft token was contradicted (False: the draft or the emitted tokens ran out first)."""
    agreed = agreement(draft_ids, emitted)
    return sum(agreed), not all(agreed)


def _ratio(prior: tuple[float, float], right: float, wrong: float) -> float:
    right, wrong = prior[0] + right, prior[1] + wrong
    return right / (right + wrong)


@dataclass
class Rate:
    """How often something turns out right: decayed counts of right and wrong outcomes over
    a prior (pseudo counts), or over the last `window` outcomes alone where that is lower (a
    drop shows at once)."""

    prior: tuple[float, float] = (1.0, 1.0)  # pseudo (right, wrong): 0.5, weight 2
    decay: float = 0.9  # per outcome
    window: int = 0  # outcomes in the recent estimate (0: none)
    right: float = 0.0  # decayed
    wrong: float = 0.0
    recent: deque[tuple[float, float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.window)

    @property
    def value(self) -> float:
        return self.given(self.prior)

    def given(self, prior: tuple[float, float]) -> float:
        """The estimate over another prior (one that moves: a band's probability starts from
        its drafter's acceptance)."""
        decayed = _ratio(prior, self.right, self.wrong)
        if not self.window:
            return decayed
        return min(decayed, _ratio(prior, sum(r for r, _ in self.recent),
                                   sum(w for _, w in self.recent)))

    def record(self, right: float, wrong: float) -> None:
        self.right = self.right * self.decay + right
        self.wrong = self.wrong * self.decay + wrong
        if self.window:
            self.recent.append((right, wrong))


class Bands:
    """A Rate per band of what a drafter knows of a token (the band's lower end): lead's own
    drafts by the length of the match they were copied after, a back's by its draft model's
    probability of the token."""

    def __init__(self, rates: Mapping[float, Rate]) -> None:
        self.rates, self.lowest = dict(rates), min(rates)
        self._lows = sorted(self.rates)  # (looked up per draft token at every step)

    def band(self, x: float) -> float:
        if x != x:  # NaN: no band
            raise ValueError(f"no band for {x}")
        return self._lows[bisect_right(self._lows, x) - 1] if x > self.lowest else self.lowest

    def __getitem__(self, x: float) -> Rate:
        return self.rates[self.band(x)]
