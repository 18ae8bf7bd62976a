"""The model interface lead and back program against, and KV-cache sync helpers.

A Model holds a KV cache for one sequence: `cached` lists the tokens whose keys
and values it holds, in order. `evaluate` appends tokens and returns the logits
rows of the last few of them; `truncate` rolls the cache back. A model that can
fork (`Forking`) holds branch sequences beside it, each off a prefix of `cached`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from shared.grammar.constraint import Constraint


class EvaluationAborted(Exception):
    """`evaluate` stopped because its `abort` check said so; the cache is as before the call."""


class Model(Protocol):
    name: str
    n_vocab: int
    n_ctx: int
    eos_token_ids: frozenset[int]
    cached: list[int]
    chat_template: str | None  # the GGUF's (lead/apis/tools.py reads its tool-call format)
    fim_tokens: tuple[int, int, int] | None  # fill-in-the-middle prefix, suffix, middle
    # repo-level fill in the middle: FIM_REP (the project's name follows), FIM_SEP (a file's)
    fim_repo_tokens: tuple[int | None, int | None]

    def tokenize(self, text: str, special: bool = False, add_bos: bool = True) -> list[int]: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def format_chat(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = True, thinking: bool | None = None) -> str:
        """The prompt text for messages (and tools, which the template renders); ValueError
        when the chat template refuses them. `add_generation_prompt` False: the last
        message's turn left open; `thinking`: the template's switch, where it has one."""
        ...

    @property
    def thinks(self) -> bool:
        """Whether the chat template switches the model's thinking on and off."""
        ...

    def fingerprint(self) -> str: ...

    def evaluate(self, tokens: Sequence[int], n_logits: int,
                 abort: Callable[[], bool] | None = None) -> np.ndarray:
        """Append tokens to the cache; logits rows [n_logits, n_vocab] of the last n_logits.

        `abort` is polled during the computation: once it returns True, the call raises
        EvaluationAborted, leaving the cache as it was."""
        ...

    def truncate(self, n: int) -> None:
        """Keep the first n cached tokens."""
        ...

    def constraint(self, gbnf: str) -> Constraint:
        """The start state of a GBNF grammar over this vocabulary (shared/grammar/constraint.py);
        ValueError, with the parser's message, for a grammar that does not parse."""
        ...

    def schema_grammar(self, schema: dict[str, Any], strict: bool = True) -> str:
        """GBNF for JSON valid against `schema`; ValueError for one it cannot convert or,
        if `strict`, one with a keyword the grammar would not enforce."""
        ...


MAIN = -1  # evaluate_many's key for the main sequence (branch slots are 0..n_branches-1)


class Forking(Model, Protocol):
    """A Model with branch sequences beside the main one in its cache: a back drafts
    alternatives on them while its main draft stays cached, and extends them all in one
    call. `can_fork` is False where this model (a context made for one sequence) cannot."""

    can_fork: bool
    n_branches: int  # branch slots
    branch_cached: list[list[int]]  # per slot: a prefix of `cached` as forked, then its own

    def fork(self, slot: int, n_keep: int) -> None:
        """Make branch `slot` hold the first `n_keep` tokens of `cached` (n_keep <=
        len(cached)), shared with the main sequence, not evaluated again; what it held is
        dropped and `cached` is untouched."""
        ...

    def evaluate_many(self, tokens: Mapping[int, Sequence[int]],
                      abort: Callable[[], bool] | None = None) -> dict[int, np.ndarray]:
        """One model call appending tokens[key] to sequence `key` (MAIN or a slot); the
        logits row after each key's last token (keys with no tokens get none). On abort or
        failure every sequence is as before the call."""
        ...

    def adopt(self, slot: int) -> None:
        """Branch `slot` becomes the main sequence and the main one that branch: a swap of
        roles, nothing evaluated or copied."""
        ...


def can_fork(model: object) -> bool:
    return bool(getattr(model, "can_fork", False))


@dataclass(frozen=True)
class Part:
    """One slot's share of a batch: `tokens` appended to its main sequence, with the logits
    rows of the last `n_logits` of them."""

    slot: int
    tokens: tuple[int, ...]
    n_logits: int = 1

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


class Slotted(Protocol):
    """A model whose KV cache holds `n_slots` generations side by side (llama.cpp's
    sequences in one unified cache), each a Forking model of its own (`slot(i)`; slot 0 is
    the model itself), evaluated together in one batch by `evaluate_parts`."""

    n_slots: int

    def slot(self, i: int) -> Forking: ...

    def evaluate_parts(self, parts: Sequence[Part]) -> list[np.ndarray]:
        """One model call for every part (each on its own slot, at most one part a slot);
        per part, the logits rows after its last `n_logits` tokens. On failure every slot
        is as before the call."""
        ...

    def share_prefix(self, source: int, target: int, n: int) -> None:
        """Slot `target` holds the first `n` tokens of slot `source`'s main sequence: their
        cells, shared, not evaluated again (what `target` held is dropped)."""
        ...

    def save_slot(self, slot: int) -> bytes:
        """Slot `slot`'s main sequence's cells, as bytes `load_slot` takes."""
        ...

    def load_slot(self, slot: int, tokens: Sequence[int], state: bytes) -> bool:
        """Slot `slot` holds `tokens`, their cells from `state` (save_slot's, of those
        tokens), its branches empty; False where the state was refused (the slot is empty)."""
        ...

    def save_slot_file(self, slot: int, path: str) -> int:
        """Slot `slot`'s main sequence written to `path` as llama-server writes a slot
        (shared/slotfile.py: its tokens, then its cells); the bytes written, 0 where the
        file could not be written."""
        ...

    def load_slot_file(self, slot: int, path: str) -> int:
        """Slot `slot` holds what `path` holds (save_slot_file's, or llama-server's), its
        branches empty; the bytes read. ValueError, saying why, where the file is refused:
        the slot is then empty."""
        ...


def slots_of(model: object) -> int:
    """How many generations the model holds at once (1 for any plain Model)."""
    return int(getattr(model, "n_slots", 1))


def common_prefix(a: Sequence[int], b: Sequence[int], chunk: int = 256) -> int:
    # whole chunks compared at C speed: a long system prompt is compared with every slot's
    # cache and every prompt saved in host memory, on the event loop
    n, i = min(len(a), len(b)), 0
    while i + chunk <= n and tuple(a[i:i + chunk]) == tuple(b[i:i + chunk]):
        i += chunk
    for j in range(i, min(i + chunk, n)):
        if a[j] != b[j]:
            return j
    return min(i + chunk, n)


def reusing_slot(prompt: Sequence[int], cached: Sequence[Sequence[int]], free: Sequence[int]
                 ) -> int:
    """A back's slot for `prompt` among the `free` ones (at least one), `cached[i]` being
    what slot i holds: the one whose cache it reuses most among those that hold all but
    its last token or that it keeps at least as much of as it drops (an empty slot among
    them); else the one holding least, the least to lose. So a conversation's next turn,
    or a prompt asked again, finds its own slot (a back drafts the reply it holds there),
    and an agent's prompts that share only a system prompt take a slot each rather than
    pushing one another out. (Lead, which keeps what a prompt pushes out in host memory,
    takes the slot holding most of the prompt: lead/decode/slots.py.)"""
    if not free:
        raise ValueError("no free slot")

    def key(i: int) -> tuple[int, int, int]:
        kept = common_prefix(cached[i], prompt)
        if kept >= min(len(cached[i]) - kept, len(prompt) - 1):
            return (0, -kept, i)
        return (1, len(cached[i]), i)
    return min(free, key=key)


def sync_cache(model: Model, tokens: Sequence[int], batch: int = 512,
               progress: Callable[[int, int], None] | None = None) -> int:
    """Make the cache hold exactly `tokens`, evaluating only what it lacks.

    Returns the number of tokens evaluated. Long inputs go in batches of `batch`,
    reporting (done, total) after each.
    """
    keep = common_prefix(model.cached, tokens)
    if keep < len(model.cached):
        model.truncate(keep)
    todo = list(tokens[keep:])
    for i in range(0, len(todo), batch):
        model.evaluate(todo[i:i + batch], 0)
        if progress:
            progress(min(i + batch, len(todo)), len(todo))
    return len(todo)


def flash_attention(choice: str, n_gpu_layers: int, slots: int = 1) -> bool:
    """Whether llama.cpp computes attention with flash attention: `choice` on or off, or
    auto: where layers are offloaded, or where the cache holds several generations (`slots`):
    a step then skips the other slots' cached cells, where without it it attends over every
    cell up to the highest in use. On a CPU it makes long verify batches dearer, so a single
    generation there goes without (measured in docs/cost-model.md)."""
    return choice == "on" or (choice == "auto" and (n_gpu_layers != 0 or slots > 1))
