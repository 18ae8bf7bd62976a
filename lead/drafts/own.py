"""Lead's own drafts: model-free drafters of kinds chosen by name, each proposing a copy
with the odds that lead accepts each of its tokens, put on the board beside backs' drafts
so that the cost model verifies as far as pays for this draft.

Every kind copies what followed a match of the sequence's end, from somewhere of its own:
`ngram`, the session's prompt and reply (shared/ngram.py); `memory`, finished sessions
(lead/drafts/memory.py: a question asked again, a retried reply). The odds come from the
match a draft was copied after: how many tokens agreed before it. A copy after 40 tokens of
code being echoed back is nearly always right, one after 3 tokens of prose seldom. Each
kind learns its odds per band of match lengths from its every proposal compared with the
tokens lead then emitted, verified or not, so that a band that does not pay (and so is
not verified) is still measured. A draft's i-th token follows a match i tokens longer, if
the ones before it were right. Of the kinds' proposals, the one expected to yield most is
offered. A new kind is a `Copier` with its `lookup` (and `start`, `end`), and its name
in KINDS.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lead.drafts.copier import Copier, Proposal
from lead.drafts.edits import Follow, started
from lead.drafts.memory import Recalled
from lead.policy.acceptance import expected_yield
from shared.ngram import Match, NgramIndex

OWN = "lead"  # the board's name for lead's own drafts


class SessionCopies(Copier):
    """`ngram`: copies from the session's own prompt and reply."""

    def __init__(self) -> None:
        super().__init__()
        self.indexes: dict[str, NgramIndex] = {}  # per session

    def copy(self, session_id: str, tokens: Sequence[int], most: int) -> Match | None:
        self.indexes.setdefault(session_id, NgramIndex()).sync(tokens)
        return super().copy(session_id, tokens, most)

    def lookup(self, session_id: str, tokens: Sequence[int], most: int) -> Match | None:
        return self.indexes[session_id].lookup(most)

    def start(self, session_id: str, tokens: Sequence[int], left: Follow | None
              ) -> Follow | None:
        return started(self.indexes[session_id], left)

    def end(self, session_id: str, tokens: Sequence[int]) -> None:
        super().end(session_id, tokens)
        self.indexes.pop(session_id, None)


# each kind by name, made from the tokens of finished sessions lead may remember
KINDS: dict[str, Callable[[int], Copier]] = {"ngram": lambda _: SessionCopies(),
                                             "memory": Recalled}


class OwnDrafts:
    def __init__(self, longest: int = 64, memory: int = 0,
                 kinds: Sequence[str] = ("ngram", "memory")) -> None:
        """`longest`: most tokens a draft holds; `memory`: tokens of finished sessions
        remembered (0: none, and no `memory` kind)."""
        self.longest = longest
        self.kinds = {name: KINDS[name](memory) for name in kinds
                      if name != "memory" or memory > 0}

    def propose(self, session_id: str, tokens: Sequence[int]) -> Proposal | None:
        """The proposal past `tokens` expected to yield most; None where no kind has one."""
        proposals = [p for kind in self.kinds.values()
                     if (p := kind.draft(session_id, tokens, self.longest)) is not None]
        return max(proposals, key=lambda p: expected_yield(p.odds), default=None)

    def forget(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        """The session ended with `tokens`."""
        for kind in self.kinds.values():
            kind.end(session_id, tokens)
