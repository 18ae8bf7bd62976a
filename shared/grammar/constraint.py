"""Constrained decoding's pure interface: a grammar's state over a reply's tokens.

A `Constraint` is one state of a grammar (GBNF, as llama.cpp parses it) after some of a
reply's tokens; it never changes: `advanced` returns a new state. The model makes the
start state (`Model.constraint`: shared/llama/model.py over llama.cpp's grammar sampler,
bench/fake.py over a trie). A state where the grammar is complete allows only end of
generation, as llama.cpp's sampler does, so a constrained reply ends with an EOS.

Order on a row of logits, alike in lead's verifier and a back's drafter: penalties and
bias (shared/penalties.py), then the mask, then temperature and truncation
(shared/sampling.py). Greedy takes a shortcut, as llama.cpp's common sampler does: the
row's argmax, if allowed, is the masked row's argmax; otherwise the next likeliest are
checked one by one, and only if none of them is allowed is the whole row masked (a full
mask checks every token of the vocabulary against the grammar: 6 ms for SmolLM2's 49k).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Constraint(Protocol):
    def allows(self, token_id: int) -> bool:
        """Whether the token may come next (cheap: one token checked)."""
        ...

    def mask(self, row: np.ndarray) -> np.ndarray:
        """A copy of `row` with the logits of tokens that may not come next at -inf.
        Where the grammar allows no token at all, end of generation is let through."""
        ...

    def advanced(self, tokens: Sequence[int]) -> Constraint:
        """The state after `tokens` (this one untouched); ValueError if the grammar does
        not allow them. End of generation is always taken (the reply ends there: it may be
        all a dead end's mask lets through) and advances nothing."""
        ...


def best(row: np.ndarray, state: Constraint | None, look: int = 32) -> int:
    """The greedy token: the row's argmax among the tokens `state` allows (np.argmax's
    answer on the masked row, ties to the lowest id). The `look` likeliest tokens are
    checked one by one before the whole row is masked."""
    top = int(np.argmax(row))
    if state is None or state.allows(top):
        return top
    look = min(look, row.shape[0] - 1)
    if look <= 0:
        return int(np.argmax(state.mask(row)))
    part = np.argpartition(-row, look)[:look]
    floor = row[part].min()  # no token outside `part` has a larger logit
    for token in part[np.lexsort((part, -row[part]))]:
        if row[token] == floor:  # a tie may continue outside `part`
            break
        if state.allows(int(token)):
            return int(token)
    return int(np.argmax(state.mask(row)))


def masked(row: np.ndarray, state: Constraint | None) -> np.ndarray:
    return row if state is None else state.mask(row)
