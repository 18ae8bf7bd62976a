"""What lead emitted before, for its own drafts (pure over token ids): a question asked
again, a reply regenerated or retried, an agent's call repeating its last one, are drafted
from the finished sessions that said it, as llama-server's n-gram drafts are.

The latest finished sessions' tokens (prompt and reply: a repeated prompt is what anchors
its reply), up to `budget` tokens in all, the oldest dropped first. Every run of KEY tokens
is indexed by the session and place it ended at, the latest KEPT occurrences each, as
shared/ngram.py indexes one sequence; a lookup copies what followed the occurrences that
agree longest with the end of the sequence being decoded, up to where they part: a greedy
reply verified in batches parts from the same reply decoded token by token at near-ties
(README, Limitations), and a copy past such a place is a batch's worth of waste.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from lead.drafts.copier import Copier
from lead.drafts.edits import Follow
from shared.ngram import KEY, Match, agreeing, kept

Spot = tuple[int, int]  # (a session's number here, where a key ended in its tokens)


class Memory:
    def __init__(self, budget: int) -> None:
        """`budget`: most tokens held; one session keeps at most its last quarter of it,
        so that one long prompt does not push every other session out."""
        self.budget, self.most = budget, max(budget // 4, KEY + 1)
        self.sessions: dict[int, tuple[int, ...]] = {}  # oldest first
        self.size = 0  # tokens held
        self._ends: dict[tuple[int, ...], list[Spot]] = {}  # latest first
        self._next = 0

    def add(self, tokens: Sequence[int]) -> None:
        """Remember a finished session's tokens (its last `most`)."""
        tokens_kept = tuple(tokens[-self.most:])
        if len(tokens_kept) <= KEY or self.budget <= 0:
            return
        number, self._next = self._next, self._next + 1
        self.sessions[number] = tokens_kept
        self.size += len(tokens_kept)
        for key, end in _keys(tokens_kept):
            kept(self._ends, key, (number, end))
        while self.size > self.budget:
            self._drop(next(iter(self.sessions)))

    def lookup(self, query: Sequence[int], k: int) -> Match | None:
        """Up to `k` tokens copied after the remembered occurrences that agree longest with
        `query`'s end, as far as they agree with each other; None where its last KEY tokens
        occur in no remembered session, or those occurrences went on differently."""
        found = self._agreeing(query)
        if not found:
            return None
        longest = found[0][1]
        copy = _agreed([self.sessions[n][end:end + k] for (n, end), length in found
                        if length == longest])
        return Match(copy, longest) if copy else None

    def source(self, query: Sequence[int]) -> Follow | None:
        """A copy of the remembered session agreeing longest with `query`'s end (the latest
        of those); None where none does."""
        found = self._agreeing(query)
        if not found:
            return None
        (number, end), length = found[0]
        return Follow(len(query), end, length, source=self.sessions[number])

    def _agreeing(self, query: Sequence[int]) -> list[tuple[Spot, int]]:
        """The places `query`'s last KEY tokens end at, with how far each agrees with it;
        the longest first (of those, the latest)."""
        ends = self._ends.get(tuple(query[-KEY:])) if len(query) >= KEY else None
        found = [(spot, agreeing(self.sessions[spot[0]], spot[1], query))
                 for spot in ends or ()]
        return sorted(found, key=lambda f: -f[1])  # stable: latest first among equals

    def _drop(self, number: int) -> None:
        tokens = self.sessions.pop(number)
        self.size -= len(tokens)
        for key, _ in _keys(tokens):
            ends = self._ends.get(key, [])  # (a key seen again in it: dropped already)
            ends[:] = [p for p in ends if p[0] != number]
            if not ends:
                self._ends.pop(key, None)


def _agreed(copies: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The copies' tokens as far as every copy that runs that far agrees: where two replies
    to the same context parted (a near-tie, or a sampled reply), the next one may too."""
    agreed: list[int] = []
    for i in range(max(map(len, copies))):
        votes = {copy[i] for copy in copies if i < len(copy)}
        if len(votes) > 1:
            break
        agreed.append(votes.pop())
    return tuple(agreed)


def _keys(tokens: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], int]]:
    """Each run of KEY tokens that a token follows, with where it ends."""
    for end in range(KEY, len(tokens)):
        yield tokens[end - KEY:end], end


class Recalled(Copier):
    """`memory`: lead's own drafts copied from finished sessions (any client's)."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.memory = Memory(budget)

    def lookup(self, session_id: str, tokens: Sequence[int], most: int) -> Match | None:
        return self.memory.lookup(tokens, most)

    def start(self, session_id: str, tokens: Sequence[int]) -> Follow | None:
        return self.memory.source(tokens)

    def end(self, session_id: str, tokens: Sequence[int]) -> None:
        super().end(session_id, tokens)
        self.memory.add(tokens)
