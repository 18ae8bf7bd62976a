"""What every kind of lead's own drafter shares (pure): a copy under way followed past each
change, a copy proposed with what it knows of each token: the length of the match it
follows (or the tokens agreed since a followed copy (re)started), on whose bands the
scoreboard learns each kind's acceptance probabilities from what lead emitted
(lead/policy/scoreboard.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lead.drafts.edits import ANCHOR, FOLLOWING, Follow, followed, moved
from lead.policy.scoreboard import Scale
from shared.ngram import Match

# Bands of match lengths (their lower ends) and the acceptance probability lead starts from
# in each: short matches in prose draft wrong tokens that cost a batch each
# (docs/cost-model.md); decayed by 0.995 per outcome in a band, so they follow a change of
# work within a few hundred.
MATCHED = Scale("matched", ((3, 0.2), (6, 0.35), (12, 0.55), (24, 0.75), (48, 0.85)), 0.995)
FOLLOWED = Scale("followed", tuple(FOLLOWING.items()), 0.995)  # a followed copy's


@dataclass(frozen=True)
class Proposal:
    token_ids: tuple[int, ...]
    known: tuple[float, ...]  # per token, the match it follows (on `scale`)
    scale: Scale


class Copier:
    """A kind of own drafter: `lookup` finds a match, and `start` a copy to follow where
    the match is long (lead/drafts/edits.py); following, proposing, pricing and learning
    are the same for every kind."""

    def __init__(self) -> None:
        self.follows: dict[str, Follow] = {}  # per session: the copy under way

    def lookup(self, session_id: str, tokens: Sequence[int], most: int) -> Match | None:
        raise NotImplementedError

    def start(self, session_id: str, tokens: Sequence[int]) -> Follow | None:
        """A copy that `tokens`' end matches, to follow where the match is ANCHOR tokens
        long; None where none matches."""
        return None

    def copy(self, session_id: str, tokens: Sequence[int], most: int) -> tuple[Match | None, Scale]:
        """The copy under way past `tokens`, or where the reply has left it, a match looked
        up (which goes before a guess past the change); and the scale that prices it."""
        follow = self._follow(session_id, tokens)
        match = self.lookup(session_id, tokens, most) \
            if follow is None or follow.left is not None else None
        if match is not None or follow is None:
            return match, MATCHED
        return followed(tokens, follow, most), FOLLOWED

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
        """A copy past `tokens`, `most` tokens at most, with the match each token follows;
        None where nothing matches."""
        match, scale = self.copy(session_id, tokens, most)
        if match is None:
            return None
        return Proposal(match.token_ids, tuple(float(match.length + i)
                                               for i in range(len(match.token_ids))), scale)

    def end(self, session_id: str, tokens: Sequence[int]) -> None:
        """The session ended with `tokens`."""
        self.follows.pop(session_id, None)
