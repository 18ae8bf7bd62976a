"""What every kind of lead's own drafter shares (pure): a copy proposed with per-token odds
by the length of the match it follows, those odds learned per band of match lengths from
what lead emitted after each proposal (lead/drafts/own.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lead.policy.acceptance import Bands, Rate, agreement
from shared.ngram import Match

# Bands of match lengths (their lower ends) and the odds lead starts from in each: short
# matches in prose draft wrong tokens that cost a batch each (docs/cost-model.md).
PRIOR = {3: 0.2, 6: 0.35, 12: 0.55, 24: 0.75, 48: 0.85}
PRIOR_WEIGHT = 4.0  # outcomes the prior counts as
DECAY = 0.995  # per outcome in a band: it follows a change of work within a few hundred


def bands(prior: dict[int, float] = PRIOR) -> Bands:
    """Odds per band of match lengths, each starting from its prior, which decays as
    outcomes come."""
    return Bands({band: Rate((0.0, 0.0), DECAY, right=p * PRIOR_WEIGHT,
                             wrong=(1 - p) * PRIOR_WEIGHT) for band, p in prior.items()})


@dataclass(frozen=True)
class Proposal:
    token_ids: tuple[int, ...]
    odds: tuple[float, ...]  # per token, that lead accepts it given the ones before


class Copier:
    """A kind of own drafter: `copy` finds the match; proposing, pricing and learning are
    the same for every kind."""

    def __init__(self) -> None:
        self.odds = bands()
        self._offered: dict[str, tuple[int, Match, Bands]] = {}  # per session: its length,
        # the copy, the odds it was priced by

    def copy(self, session_id: str, tokens: Sequence[int], most: int) -> Match | None:
        raise NotImplementedError

    def draft(self, session_id: str, tokens: Sequence[int], most: int) -> Proposal | None:
        """A copy past `tokens`, `most` tokens at most, priced per token; None where
        nothing matches. What was proposed last is first scored against what lead
        emitted since."""
        self._settle(session_id, tokens)
        match = self.copy(session_id, tokens, most)
        if match is None:
            return None
        odds = self._odds_of(session_id, match)
        self._offered[session_id] = (len(tokens), match, odds)
        return Proposal(match.token_ids, tuple(odds[match.length + i].value
                                               for i in range(len(match.token_ids))))

    def _odds_of(self, session_id: str, match: Match) -> Bands:
        """The odds `match` is priced by (a kind may keep more than one)."""
        return self.odds

    def end(self, session_id: str, tokens: Sequence[int]) -> None:
        """The session ended with `tokens`."""
        self._offered.pop(session_id, None)

    def _settle(self, session_id: str, tokens: Sequence[int]) -> None:
        offered = self._offered.pop(session_id, None)
        if offered is not None:
            n, match, odds = offered
            for i, right in enumerate(agreement(match.token_ids, tokens[n:])):
                odds[match.length + i].record(right, not right)
