"""How often drafts are right: a censored geometric estimate of acceptance.

Reasoning and measurements: docs/cost-model.md.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MAX_ALPHA = 0.999  # the expected-tokens series is finite only below 1


@dataclass
class Acceptance:
    """alpha: the probability that a draft token is right given its predecessors were,
    from drafts compared with the tokens lead emitted. The estimate is
    matches / (matches + misses) plus a prior, over counts decayed per outcome, or over the
    last `window` outcomes alone where that is lower (so a drop shows at once).
    alpha_first: the same for a draft's guess of a reply's first token, estimated apart."""

    prior: tuple[float, float] = (1.6, 0.4)  # pseudo (matches, misses): alpha 0.8, weight 2
    decay: float = 0.8  # per outcome: the last ~5 outcomes carry most of the weight
    window: int = 3  # outcomes in the recent estimate
    first_prior: tuple[float, float] = (1.0, 1.0)  # alpha_first 0.5, weight 2
    matches: float = 0.0  # decayed
    misses: float = 0.0
    first_matches: float = 0.0  # decayed: was a draft's guess of a reply's first token right
    first_misses: float = 0.0
    recent: deque[tuple[int, bool]] = field(init=False)  # the last `window` outcomes

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.window)

    @property
    def alpha(self) -> float:
        recent_matches = sum(m for m, _ in self.recent)
        recent_misses = sum(int(missed) for _, missed in self.recent)
        return min(self._mle(self.matches, self.misses), self._mle(recent_matches, recent_misses))

    @property
    def alpha_first(self) -> float:
        """Probability that a draft's guess of a reply's first token is right."""
        matches = self.first_prior[0] + self.first_matches
        return matches / (matches + self.first_prior[1] + self.first_misses)

    def _mle(self, matches: float, misses: float) -> float:
        matches, misses = self.prior[0] + matches, self.prior[1] + misses
        return matches / (matches + misses)

    def record(self, matches: int, missed: bool, first: bool = False) -> bool:
        """A draft matched lead's next `matches` tokens, then `missed` (False: it or lead's
        tokens ran out); `first`: from a reply's first token. True when the outcome moved
        alpha (a miss at a reply's first token moves only alpha_first)."""
        if matches == 0 and not missed:
            return False  # nothing observed
        if first:
            self._record_first(hit=matches > 0)
            if matches == 0:
                return False
            matches -= 1  # past its first token, a draft is like any other
            if matches == 0 and not missed:
                return False
        self.matches = self.matches * self.decay + matches
        self.misses = self.misses * self.decay + int(missed)
        self.recent.append((matches, missed))
        return True

    def _record_first(self, hit: bool) -> None:
        self.first_matches = self.first_matches * self.decay + hit
        self.first_misses = self.first_misses * self.decay + (not hit)

    def expected_tokens(self, k: int, first: bool = False) -> float:
        """Tokens a step verifying k draft tokens emits: 1 + a1 (1 + a + ... + a^(k-1)),
        a1 being alpha_first at a reply's first step, else alpha."""
        a = min(self.alpha, MAX_ALPHA)
        return _expected(a, self.alpha_first if first else a, k)

    def expected_curve(self, most: int, first: bool = False) -> list[float]:
        """expected_tokens(k) for k = 0 .. most, alpha read once."""
        a = min(self.alpha, MAX_ALPHA)
        a1 = self.alpha_first if first else a
        return [_expected(a, a1, k) for k in range(most + 1)]


def _expected(a: float, a1: float, k: int) -> float:
    return 1.0 + a1 * (1.0 - a ** k) / (1.0 - a)
