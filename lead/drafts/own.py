"""Lead's own drafts (docs/cost-model.md, "Lead's own drafts"): model-free drafters of kinds
by name, each copying what followed a match of the sequence's end from somewhere of its own
(`ngram`: the session's prompt and reply, shared/ngram.py; `memory`: finished sessions,
lead/drafts/memory.py). Each kind's proposal goes on the board beside backs' drafts, under
the kind's name, and competes with them as a back does: the scoreboard learns each kind's
acceptance probabilities per band of the match a draft was copied after, its i-th token's
from one i tokens longer (a copy after 40 tokens of echoed code is nearly always right, one
after 3 tokens of prose seldom), from every proposal, verified or not, so that a band that
does not pay is still measured; the cost model verifies as far as pays. A new kind is a
`Copier` with its `lookup` (and `start`, `end`), and its name in KINDS.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lead.drafts.copier import Copier, Proposal
from lead.drafts.edits import Follow
from lead.drafts.memory import Recalled
from lead.policy.scoreboard import Scale
from shared.ngram import Match, NgramIndex

OWN = "lead"  # the board's name for lead's own drafts


class SessionCopies(Copier):
    """`ngram`: copies from the session's own prompt and reply."""

    def __init__(self) -> None:
        super().__init__()
        self.indexes: dict[str, NgramIndex] = {}  # per session

    def copy(self, session_id: str, tokens: Sequence[int], most: int) -> tuple[Match | None, Scale]:
        self.indexes.setdefault(session_id, NgramIndex()).sync(tokens)
        return super().copy(session_id, tokens, most)

    def lookup(self, session_id: str, tokens: Sequence[int], most: int) -> Match | None:
        return self.indexes[session_id].lookup(most)

    def start(self, session_id: str, tokens: Sequence[int]) -> Follow | None:
        match = self.indexes[session_id].lookup(1)
        if match is None or match.source is None:
            return None
        return Follow(len(tokens), match.source, match.length)

    def end(self, session_id: str, tokens: Sequence[int]) -> None:
        super().end(session_id, tokens)
        self.indexes.pop(session_id, None)


# each kind by name, made from the tokens of finished sessions lead may remember
KINDS: dict[str, Callable[[int], Copier]] = {"ngram": lambda _: SessionCopies(),
                                             "memory": Recalled}


class OwnDrafts:
    def __init__(self, longest: int = 64, memory: int = 0) -> None:
        """`longest`: most tokens a draft holds; `memory`: tokens of finished sessions
        remembered (0: none, and no `memory` kind)."""
        self.longest = longest
        self.kinds = {name: make(memory) for name, make in KINDS.items()
                      if name != "memory" or memory > 0}

    def propose(self, session_id: str, tokens: Sequence[int]) -> dict[str, Proposal]:
        """Each kind's proposal past `tokens`, by the kind's name (where it has one)."""
        return {name: p for name, kind in self.kinds.items()
                if (p := kind.draft(session_id, tokens, self.longest)) is not None}

    def forget(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        """The session ended with `tokens`."""
        for kind in self.kinds.values():
            kind.end(session_id, tokens)
