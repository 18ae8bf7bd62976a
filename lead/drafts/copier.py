"""What every kind of lead's own drafter shares (pure): a copy under way followed past each
change, a copy proposed with per-token odds by the length of the match it follows (or the
tokens agreed since a followed copy (re)started), those odds learned per band from what
lead emitted after each proposal (lead/drafts/own.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lead.drafts.edits import ANCHOR, FOLLOWING, Follow, followed, moved
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
    """A kind of own drafter: `lookup` finds a match, and `start` a copy to follow where
    the match is long (lead/drafts/edits.py); following, proposing, pricing and learning
    are the same for every kind."""

    def __init__(self) -> None:
        self.odds = bands()
        self.following = bands(FOLLOWING)  # a followed copy's, by tokens agreed since it
        # (re)started
        self.follows: dict[str, Follow] = {}  # per session: the copy under way
        self._offered: dict[str, tuple[int, Match, Bands]] = {}  # per session: its length,
        # the copy, the odds it was priced by

    def lookup(self, session_id: str, tokens: Sequence[int], most: int) -> Match | None:
        raise NotImplementedError

    def start(self, session_id: str, tokens: Sequence[int]) -> Follow | None:
        """A copy that `tokens`' end matches, to follow where the match is ANCHOR tokens
        long; None where none matches."""
        return None

    def copy(self, session_id: str, tokens: Sequence[int], most: int) -> tuple[Match | None, Bands]:
        """The copy under way past `tokens`, or where the reply has left it, a match looked
        up (which goes before a guess past the change); and the odds that price it."""
        follow = self._follow(session_id, tokens)
        match = self.lookup(session_id, tokens, most) \
            if follow is None or follow.left is not None else None
        if match is not None or follow is None:
            return match, self.odds
        return followed(tokens, follow, most), self.following

    def _follow(self, session_id: str, tokens: Sequence[int]) -> Follow | None:
        """The session's copy under way, moved on to `tokens`; a new one where none is
        followed or the reply left it and its end matches a copy elsewhere."""
        follow = self.follows.get(session_id)
        if follow is not None and follow.seq > len(tokens):
            follow = None  # (another sequence than the one followed)
        if follow is not None:
            moved(follow, tokens)
        if follow is None or follow.left is not None:
            fresh = self.start(session_id, tokens)
            if fresh is not None and fresh.agreed >= ANCHOR:  # the changes learned go on
                fresh.changes = follow.changes if follow is not None else {}
                follow = fresh
        if follow is not None:
            self.follows[session_id] = follow
        return follow

    def draft(self, session_id: str, tokens: Sequence[int], most: int) -> Proposal | None:
        """A copy past `tokens`, `most` tokens at most, priced per token; None where
        nothing matches. What was proposed last is first scored against what lead
        emitted since."""
        self._settle(session_id, tokens)
        match, odds = self.copy(session_id, tokens, most)
        if match is None:
            return None
        self._offered[session_id] = (len(tokens), match, odds)
        return Proposal(match.token_ids, tuple(odds[match.length + i].value
                                               for i in range(len(match.token_ids))))

    def end(self, session_id: str, tokens: Sequence[int]) -> None:
        """The session ended with `tokens`."""
        for held in (self._offered, self.follows):
            held.pop(session_id, None)

    def _settle(self, session_id: str, tokens: Sequence[int]) -> None:
        offered = self._offered.pop(session_id, None)
        if offered is not None:
            n, match, odds = offered
            for i, right in enumerate(agreement(match.token_ids, tokens[n:])):
                odds[match.length + i].record(right, not right)
