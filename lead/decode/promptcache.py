"""Prompts' KV cells kept in host memory once a new prompt pushes them out of their slot
(pure bookkeeping; the model saves and loads the cells: Slotted.save_slot / load_slot).

A slot keeps its last generation's cells for the next prompt that begins with them; with
more conversations, agents or repeated prompts than slots, each new prompt pushes one out.
Saved here instead, a later prompt that begins with one gets its cells back in about a
millisecond rather than evaluated again (llama-server's --cache-ram).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from shared.model import common_prefix

# Fewer tokens than this are not worth an entry: evaluated again they cost one step.
MIN_TOKENS = 16


@dataclass(frozen=True)
class Saved:
    """A slot's tokens and its cells' state (the model's, opaque here)."""

    tokens: tuple[int, ...]
    state: bytes


class PromptCache:
    def __init__(self, max_bytes: int, min_tokens: int = MIN_TOKENS) -> None:
        """`max_bytes`: the states' total size held at most, the least recently used dropped
        first (0: nothing is kept)."""
        self.max_bytes, self.min_tokens = max_bytes, min_tokens
        self._entries: OrderedDict[tuple[int, ...], Saved] = OrderedDict()  # oldest first
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, prompt: Sequence[int]) -> tuple[Saved | None, int]:
        """The entry sharing the longest prefix with `prompt`, and how long it is."""
        best, n_best, asked = None, 0, tuple(prompt)
        for saved in self._entries.values():
            n = common_prefix(saved.tokens, asked)
            if n > n_best:
                best, n_best = saved, n
        return best, n_best

    def worth_saving(self, tokens: Sequence[int], kept: int) -> bool:
        """Whether a slot holding `tokens`, about to keep only `kept` of them, should save
        them first: enough would be lost, and no entry holds them already."""
        if self.max_bytes <= 0 or len(tokens) - kept < self.min_tokens:
            return False
        held = tuple(tokens)
        return not any(key[:len(held)] == held for key in self._entries)

    def add(self, saved: Saved) -> None:
        """Keep `saved` (entries it extends are dropped: it holds them), within max_bytes;
        not an empty state (the model could not save the slot)."""
        if not saved.state or len(saved.state) > self.max_bytes:
            return
        for key in [k for k in self._entries if saved.tokens[:len(k)] == k]:
            self._drop(key)
        self._entries[saved.tokens] = saved
        self.bytes += len(saved.state)
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def used(self, saved: Saved) -> None:
        """`saved` gave a prompt its cells back: it is the most recently used now."""
        if saved.tokens in self._entries:
            self._entries.move_to_end(saved.tokens)

    def _drop(self, key: tuple[int, ...]) -> None:
        self.bytes -= len(self._entries.pop(key).state)
