"""A request's grammar as the back drafts under it: parsed once per text, and its state
along the back's local tokens, kept as they grow and are cut back."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from shared.bounded import Lru
from shared.grammar.bounds import check_gbnf
from shared.grammar.constraint import Constraint
from shared.model import common_prefix

MAX_GRAMMARS = 8  # parsed grammars kept, by text
log = logging.getLogger("back")


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


class Grammars:
    """The state of a request's grammar after a path of tokens, for a drafter that follows
    one reply at a time; `parse` is the draft model's (Model.constraint)."""

    def __init__(self, parse: Callable[[str], Constraint]) -> None:
        self.parse = parse
        self._parsed: Lru[str, Constraint | None] = Lru(MAX_GRAMMARS)  # text -> start (None: bad)
        self._track: Track | None = None  # the grammar's state along the drafter's tokens
        self._key: tuple[str, int] | None = None  # (grammar, n_prompt) it follows

    def state(self, grammar: str | None, n_prompt: int, path: Sequence[int]
              ) -> Constraint | None:
        """The grammar's state after `path` (None: no grammar, or one not usable here)."""
        if not grammar:
            return None
        if self._key != (grammar, n_prompt):
            root = self._root(grammar)
            self._track = None if root is None else Track(root, n_prompt)
            self._key = (grammar, n_prompt)
        # None if lead's tokens leave the grammar (they cannot): then drafted blind
        return self._track.at(path) if self._track is not None else None

    @property
    def followed(self) -> str | None:
        """The grammar whose state is followed now (None: none)."""
        return self._key[0] if self._key is not None else None

    def give_up(self, grammar: str, seconds: float, limit: float) -> None:
        """Draft without a grammar too slow to apply (lead ends such replies: the back's
        model thread would be held just as long)."""
        log.warning("the request's grammar took %.1f s to apply to one guess (over %.1f s); "
                    "drafting without it", seconds, limit)
        self._parsed[grammar] = None
        self._track = self._key = None

    def _root(self, grammar: str) -> Constraint | None:
        if grammar not in self._parsed:
            try:  # lead checked and parsed it; another lead or llama.cpp may not have
                check_gbnf(grammar)  # before any parser: a bomb would crash this back
                self._parsed[grammar] = self.parse(grammar)
            except ValueError as exc:
                log.warning("the request's grammar cannot be used here (%s); drafting "
                            "without it", exc)
                self._parsed[grammar] = None
        return self._parsed[grammar]
