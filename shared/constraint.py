"""Constrained decoding's pure interface: a grammar's state over a reply's tokens.

A `Constraint` is one state of a grammar (GBNF, as llama.cpp parses it) after some of a
reply's tokens; it never changes: `advanced` returns a new state. The model makes the
start state (`Model.constraint`: shared/llm.py over llama.cpp's grammar sampler,
shared/fake.py over a trie). A state where the grammar is complete allows only end of
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
from typing import Any, Protocol

import numpy as np

from shared.model import common_prefix


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


# What llama-cpp-python's JSON schema converter (shared/llm.py) enforces, and what changes
# no reply; a schema with any other keyword (minimum, uniqueItems, not, ...) could be met
# by a reply that fails it.
ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "definitions", "pattern", "minLength", "maxLength", "format"})
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id",
                          "$comment", "deprecated", "readOnly", "writeOnly"})
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")


def unenforced(schema: Any, where: str = "schema") -> str | None:
    """The first keyword of `schema` (or of a schema inside it) the converter would
    ignore, as a path; None if it enforces them all."""
    if not isinstance(schema, dict):
        return None
    for key in schema:
        if key not in ENFORCED and key not in _ANNOTATIONS:
            return f"{where}.{key}"
    maps = [(k, m) for k in _SUBSCHEMA_MAPS if isinstance(m := schema.get(k), dict)]
    lists = [(k, v) for k in _SUBSCHEMA_LISTS if isinstance(v := schema.get(k), list)]
    subschemas = [(f"{where}.{k}.{name}", sub) for k, m in maps for name, sub in m.items()]
    subschemas += [(f"{where}.{k}[{i}]", sub) for k, v in lists for i, sub in enumerate(v)]
    subschemas += [(f"{where}.{k}", schema[k]) for k in ("items", "additionalProperties")
                   if k in schema]
    return next((found for path, sub in subschemas if (found := unenforced(sub, path))), None)
