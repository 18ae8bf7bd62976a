"""A grammar's state along the back's local tokens, kept as they grow and are cut back."""

from __future__ import annotations

from collections.abc import Sequence

from shared.constraint import Constraint
from shared.model import common_prefix


class Track:
    """A grammar's state along a sequence that grows and is cut back: a back's local
    tokens (lead's, then its own guesses). The grammar starts after the prompt's `start`
    tokens. Recent states are kept, so a cut back to lead's tokens costs no replay."""

    KEEP = 256  # states kept behind the end; a deeper cut replays from the start

    def __init__(self, root: Constraint, start: int) -> None:
        self.root, self.start = root, start
        self._tokens: list[int] = []  # the sequence past `start`
        self._base = 0  # _states[i] is the state after _tokens[:_base + i]
        self._states: list[Constraint] = [root]

    def at(self, sequence: Sequence[int]) -> Constraint | None:
        """The state after `sequence`; None where the grammar does not allow it."""
        body = list(sequence[self.start:])
        n = len(self._tokens)
        keep = n if body[:n] == self._tokens else common_prefix(self._tokens, body)
        if keep < self._base:  # cut further back than the states kept
            self._tokens, self._base, self._states, keep = [], 0, [self.root], 0
        del self._tokens[keep:]
        del self._states[keep - self._base + 1:]
        for token in body[keep:]:
            state = self._states[-1]
            if not state.allows(token):
                return None
            self._states.append(state.advanced([token]))
            self._tokens.append(token)
        if len(self._states) > 2 * self.KEEP:
            drop = len(self._states) - self.KEEP
            self._states, self._base = self._states[drop:], self._base + drop
        return self._states[-1]
