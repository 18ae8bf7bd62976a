"""Lead's own drafts: model-free, copied from the prompt and the reply so far
(shared/ngram.py), put on the board beside backs' drafts with the odds that lead accepts
each token, so that the cost model verifies as far as pays for this draft.

The odds come from the match a draft was copied after: how many tokens agreed before it.
A copy after 40 tokens of code being echoed back is nearly always right, one after 3
tokens of prose seldom. Lead learns the odds per band of match lengths from every
proposal compared with the tokens it then emitted, verified or not, so that a band that
does not pay (and so is not verified) is still measured. A draft's i-th token follows a
match i tokens longer, if the ones before it were right.

Finished sessions are remembered (lead/drafts/memory.py): where a copy from one is expected
to yield more than the prompt and reply's own (it agrees longer with the reply's end, and
runs as far), the draft is copied from it, its odds learned apart (a sampled reply asked
for again parts from the last one where an echo would not).
"""

from __future__ import annotations

from collections.abc import Sequence

from lead.drafts.bandodds import BandOdds
from lead.drafts.memory import Memory
from lead.drafts.rank import odds_yield
from shared.ngram import Match, NgramIndex

OWN = "lead"  # the board's name for lead's own drafts
# Bands of match lengths (their lower ends) and the odds lead starts from in each: short
# matches in prose draft wrong tokens that cost a batch each (docs/cost-model.md).
PRIOR = {3: 0.2, 6: 0.35, 12: 0.55, 24: 0.75, 48: 0.85}
PRIOR_WEIGHT = 4.0  # outcomes the prior counts as
DECAY = 0.995  # per outcome in a band: it follows a change of work within a few hundred


class OwnDrafts:
    def __init__(self, longest: int = 64, memory: int = 0) -> None:
        """`longest`: most tokens a draft holds; `memory`: tokens of finished sessions
        remembered (0: none)."""
        self.longest = longest
        self.indexes: dict[str, NgramIndex] = {}  # per session
        self.memory = Memory(memory) if memory > 0 else None
        # learned over every session: copies of the session itself, and of remembered ones
        self.odds = BandOdds(PRIOR, PRIOR_WEIGHT, DECAY)
        self.recalled_odds = BandOdds(PRIOR, PRIOR_WEIGHT, DECAY)
        # per session: its length, the copy, the odds it was priced by
        self._offered: dict[str, tuple[int, Match, BandOdds]] = {}

    def propose(self, session_id: str, tokens: Sequence[int]
                ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """A draft past `tokens` and each token's odds; None where nothing matches. What
        was proposed last is first scored against what lead emitted since."""
        self._settle(session_id, tokens)
        index = self.indexes.setdefault(session_id, NgramIndex())
        index.sync(tokens)
        copies = [(m, odds, _odds_of(m, odds)) for m, odds in (
            (index.lookup(self.longest), self.odds),
            (self.memory.lookup(tokens, self.longest) if self.memory else None,
             self.recalled_odds)) if m is not None]
        if not copies:
            return None
        # the copy expected to yield more (a remembered one agreeing longer may stop sooner)
        match, odds, each = max(copies, key=lambda c: odds_yield(c[2]))
        self._offered[session_id] = (len(tokens), match, odds)
        return match.token_ids, each

    def forget(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        """The session ended with `tokens`: its index goes, its tokens are remembered."""
        self.indexes.pop(session_id, None)
        self._offered.pop(session_id, None)
        if self.memory is not None:
            self.memory.add(tokens)

    def _settle(self, session_id: str, tokens: Sequence[int]) -> None:
        offered = self._offered.pop(session_id, None)
        if offered is None:
            return
        n, match, odds = offered
        for i, (guess, token) in enumerate(zip(match.token_ids, tokens[n:], strict=False)):
            odds.record(match.length + i, guess == token)
            if guess != token:
                return


def _odds_of(match: Match, odds: BandOdds) -> tuple[float, ...]:
    """Each token's odds: the i-th follows a match i tokens longer, if those before were right."""
    return tuple(odds.odds(match.length + i) for i in range(len(match.token_ids)))
