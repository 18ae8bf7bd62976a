"""Prompt lookup over an index: what followed the earlier occurrence that matches the end of
a sequence the longest (pure over token ids).

Every run of KEY tokens is indexed by where it ends, the latest KEPT occurrences each, as
the sequence grows; a lookup takes the last KEY tokens, measures how far back each
occurrence agrees with the sequence's end (up to LONGEST), and copies what followed the
longest agreeing one (the latest of equals), the copy running on into its own tokens
where the match is near the end (a repeating pattern). A lookup costs a few dozen
comparisons whatever the sequence's length; a scan of the whole sequence per token, as
back/ngram.py does, cost lead milliseconds a step on a prompt of thousands of tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

KEY = 3  # tokens a lookup key holds: the shortest match a draft is copied from
KEPT = 8  # occurrences kept per key, latest first
LONGEST = 64  # a match is measured this far back at most
T = TypeVar("T")


@dataclass(frozen=True)
class Match:
    """A copy: `token_ids` followed an earlier occurrence agreeing with the sequence's last
    `length` tokens."""

    token_ids: tuple[int, ...]
    length: int
    source: int | None = None  # where in the sequence the copy starts (None: elsewhere)


class NgramIndex:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}  # key -> where it ended, latest first

    def sync(self, tokens: Sequence[int]) -> None:
        """Index `tokens`: those past the last call if they extend it, else all afresh."""
        n = len(self.tokens)
        if len(tokens) < n or list(tokens[:n]) != self.tokens:
            self.tokens, self._ends, n = [], {}, 0
        self.tokens.extend(tokens[n:])
        # an occurrence is indexed once a token follows it: ends KEY .. len - 1
        for end in range(max(KEY, n), len(self.tokens)):
            kept(self._ends, tuple(self.tokens[end - KEY:end]), end)

    def lookup(self, k: int) -> Match | None:
        """Up to `k` tokens copied after the longest match of the indexed sequence's end;
        None where its last KEY tokens occurred nowhere before."""
        tokens = self.tokens
        if k <= 0 or len(tokens) <= KEY:
            return None
        ends = self._ends.get(tuple(tokens[-KEY:]))
        if not ends:
            return None
        end = max(ends, key=lambda e: (agreeing(tokens, e, tokens), e))
        copy = list(tokens[end:end + k])
        while len(copy) < k:  # past the sequence's end the copy reads itself
            copy.append(copy[len(copy) - (len(tokens) - end)])
        return Match(tuple(copy), agreeing(tokens, end, tokens), end)


def kept(places: dict[tuple[int, ...], list[T]], key: tuple[int, ...], place: T) -> None:
    """Index `place` under `key`, the latest first, KEPT at most."""
    latest = places.setdefault(key, [])
    latest.insert(0, place)
    del latest[KEPT:]


def agreeing(source: Sequence[int], end: int, query: Sequence[int]) -> int:
    """How many tokens of `source` before `end` agree with `query`'s last ones (at most
    LONGEST)."""
    most, n = min(LONGEST, end, len(query)), len(query)
    length = 0
    while length < most and source[end - 1 - length] == query[n - 1 - length]:
        length += 1
    return length
