"""Drafters: keep a local sequence (lead's tokens + own guesses) and extend it.

`catch_up(lead_tokens)` makes the local sequence agree with lead: a draft that lead
has overtaken correctly is kept, a wrong one is cut back to the common prefix, and
only what is missing is evaluated. `next_token` proposes one more token, drawn from
the draft's logits adjusted by the request's penalties and bias as lead adjusts the
target's (shared/penalties.py), then masked by the request's grammar in the state after
the reply's tokens so far, lead's and its own (shared/constraint.py), so that greedy
drafts follow lead's choices.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from back.ngram import ngram_draft
from shared.constraint import Constraint, Track, best, masked
from shared.model import EvaluationAborted, Model, common_prefix, sync_cache
from shared.penalties import adjust
from shared.protocol import SamplingParams
from shared.sampling import Dist, distribution, is_greedy, sample

MAX_SUPPORT = 64  # a cap on the draft's sampling support keeps posted q small and exact
MAX_GRAMMARS = 8  # parsed grammars kept, by text
log = logging.getLogger("back")


class Drafter(Protocol):
    local: list[int]

    def catch_up(self, lead_tokens: Sequence[int]) -> int: ...

    def fits(self, n_tokens: int) -> bool:
        """Whether it can hold this many of lead's tokens and draft past them."""
        ...

    def next_token(self, params: SamplingParams, rng: np.random.Generator,
                   abort: Callable[[], bool] | None = None, n_prompt: int = 0
                   ) -> tuple[int, Dist | None] | None:
        """One more guess, or None: nothing to guess, or `abort` said stop midway.
        `n_prompt`: how many of lead's tokens are the prompt (the penalties need it)."""
        ...


class ModelDrafter:
    """A draft model's guesses. A guess is handed out as soon as it is sampled and only
    evaluated (to get the logits for the next one) on the next call: the first guess after
    catching up is ready one draft step sooner, when lead most needs it, right after a
    rejection."""

    def __init__(self, model: Model, batch: int = 512,
                 progress: Callable[[int, int], None] | None = None, blind: bool = False
                 ) -> None:
        """`blind`: draft without the request's grammar (benchmarks compare the two)."""
        self.model, self.batch, self.progress, self.blind = model, batch, progress, blind
        self._logits: np.ndarray | None = None  # next-token logits after model.cached
        self._pending: list[int] = []  # a guess handed out, not yet evaluated
        self._grammars: dict[str, Constraint | None] = {}  # text -> start state (None: bad)
        self._track: Track | None = None  # the grammar's state along `local`
        self._track_key: tuple[str, int] | None = None  # (grammar, n_prompt) it follows

    @property
    def local(self) -> list[int]:
        return self.model.cached + self._pending

    def fits(self, n_tokens: int) -> bool:
        return n_tokens < self.model.n_ctx

    def catch_up(self, lead_tokens: Sequence[int]) -> int:
        keep = common_prefix(self.local, lead_tokens)
        if keep == len(lead_tokens) and self._logits is not None and keep > 0:
            return 0  # lead is a prefix of our draft: nothing to redo
        self._pending = []
        # Re-evaluate at least the last token, whose logits we need to draft on.
        head = list(lead_tokens[:-1])
        evaluated = sync_cache(self.model, head, self.batch, self.progress)
        self._logits = self.model.evaluate([lead_tokens[-1]], 1)[-1]
        return evaluated + 1

    def next_token(self, params: SamplingParams, rng: np.random.Generator,
                   abort: Callable[[], bool] | None = None, n_prompt: int = 0
                   ) -> tuple[int, Dist | None] | None:
        if self._logits is None or len(self.local) >= self.model.n_ctx:
            return None
        if self._pending:
            try:
                self._logits = self.model.evaluate(self._pending, 1, abort)[-1]
            except EvaluationAborted:
                return None  # the guess stays pending: local is unchanged
            self._pending = []
        # q is what the guess is drawn from: the adjusted, masked logits, as lead's p
        row = adjust(self._logits, params, self.local, n_prompt)
        state = self._grammar_state(params.grammar, n_prompt)
        if is_greedy(params):
            token, dist = best(row, state), None
        else:
            dist = distribution(masked(row, state), params, MAX_SUPPORT)
            token = sample(dist, rng)
        self._pending = [token]
        return token, dist

    def _grammar_state(self, grammar: str | None, n_prompt: int) -> Constraint | None:
        """The grammar's state after `local` (None: no grammar, or drafting blind)."""
        if not grammar or self.blind:
            return None
        if self._track_key != (grammar, n_prompt):
            root = self._parsed(grammar)
            self._track = None if root is None else Track(root, n_prompt)
            self._track_key = (grammar, n_prompt)
        # None if lead's tokens leave the grammar (they cannot): then drafted blind
        return self._track.at(self.local) if self._track is not None else None

    def _parsed(self, grammar: str) -> Constraint | None:
        if grammar not in self._grammars:
            if len(self._grammars) >= MAX_GRAMMARS:
                self._grammars.clear()
            try:
                self._grammars[grammar] = self.model.constraint(grammar)
            except ValueError as exc:  # lead parsed it: another llama.cpp may not
                log.warning("the request's grammar does not parse here (%s); drafting "
                            "without it", exc)
                self._grammars[grammar] = None
        return self._grammars[grammar]


class NgramDrafter:
    def __init__(self, n_max: int = 4) -> None:
        self.n_max = n_max
        self.local: list[int] = []

    def fits(self, n_tokens: int) -> bool:
        return True

    def catch_up(self, lead_tokens: Sequence[int]) -> int:
        keep = common_prefix(self.local, lead_tokens)
        if keep < len(lead_tokens):
            self.local = list(lead_tokens)
        return len(lead_tokens) - keep

    def next_token(self, params: SamplingParams, rng: np.random.Generator,
                   abort: Callable[[], bool] | None = None, n_prompt: int = 0
                   ) -> tuple[int, Dist | None] | None:
        guess = ngram_draft(self.local, self.n_max, 1)
        if not guess:
            return None
        self.local.append(guess[0])
        return guess[0], None  # no probabilities: lead verifies by sample-and-compare
