"""Slots' KV cells out of the cache and back (the llama.cpp edge; lead keeps them in host
memory, lead/decode/promptcache.py): llama.cpp's sequence state, mixed into LlamaModel."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import llama_cpp


class SlotStates:
    """save_slot / load_slot over a LlamaModel's roles (shared/llm_seqs.py lays them out)."""

    n_slots: int
    n_branches: int
    _ctx: Any
    _lists: list[list[int]]
    _ids: list[int]

    if TYPE_CHECKING:  # Batches' (shared/llm_seqs.py)
        def _copy(self, source: int, target: int, n: int) -> None: ...

        def _forget_from(self, role: int, n: int) -> None: ...

    def save_slot(self, slot: int) -> bytes:
        """Slot `slot`'s main sequence as llama.cpp's sequence state (its cells' positions
        and K/V, no token ids), for `load_slot` into any slot later."""
        seq = self._ids[self._main_role(slot)]
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, seq)
        return ctypes.string_at(buffer, n)

    def load_slot(self, slot: int, tokens: Sequence[int], state: bytes) -> bool:
        """Slot `slot` holds `tokens`, their cells from `state` (save_slot's, of those
        tokens); its branches emptied. False where llama.cpp refused it: the slot is empty."""
        base = self._main_role(slot)
        for j in range(self.n_branches):
            self._copy(base, base + 1 + j, 0)
        self._forget_from(base, 0)
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if not llama_cpp.llama_state_seq_set_data(self._ctx, buffer, len(state), self._ids[base]):
            self._forget_from(base, 0)
            return False
        self._lists[base] = list(tokens)
        return True

    def _main_role(self, slot: int) -> int:
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"no slot {slot} of {self.n_slots}")
        return slot * (1 + self.n_branches)
