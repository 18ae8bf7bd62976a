"""Slots' KV cells out of the cache and back (the llama.cpp edge; lead keeps them in host
memory, lead/decode/promptcache.py, or in llama-server's slot files, shared/slotfile.py):
llama.cpp's sequence state, mixed into LlamaModel."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import llama_cpp

from shared.slotfile import UNREADABLE, most_words, packed, unpacked


class SlotStates:
    """save_slot / load_slot (host memory) and save_slot_file / load_slot_file (llama-server's
    slot files) over a LlamaModel's roles (shared/llama/seqs.py lays them out)."""

    n_slots: int
    n_branches: int
    n_ctx: int
    n_vocab: int
    _ctx: Any
    _lists: list[list[int]]
    _ids: list[int]

    if TYPE_CHECKING:  # Batches' (shared/llama/seqs.py)
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
        self._empty(base)
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if not llama_cpp.llama_state_seq_set_data(self._ctx, buffer, len(state), self._ids[base]):
            self._forget_from(base, 0)
            return False
        self._lists[base] = list(tokens)
        return True

    def save_slot_file(self, slot: int, path: str) -> int:
        """Slot `slot`'s main sequence to `path` as llama-server writes it; bytes written."""
        base = self._main_role(slot)
        words = packed(self._lists[base])
        array = (llama_cpp.llama_token * len(words))(*words)
        return int(llama_cpp.llama_state_seq_save_file(self._ctx, path.encode(), self._ids[base],
                                                       array, len(words)))

    def load_slot_file(self, slot: int, path: str) -> int:
        """Slot `slot` holds what `path` holds; bytes read. ValueError: the slot is empty."""
        base = self._main_role(slot)
        self._empty(base)
        name, seq, count = path.encode(), self._ids[base], ctypes.c_size_t(0)
        # a first call with no buffer reads the count of token words alone
        if not llama_cpp.llama_state_seq_load_file(self._ctx, name, seq, None, 0,
                                                   ctypes.byref(count)):
            raise ValueError(UNREADABLE)
        if count.value > most_words(self.n_ctx):  # checked before it is allocated
            raise ValueError("Restored prompt does not fit in the slot context")
        words = (llama_cpp.llama_token * max(count.value, 1))()
        n_read = llama_cpp.llama_state_seq_load_file(self._ctx, name, seq, words, count.value,
                                                     ctypes.byref(count))
        try:
            if not n_read:
                raise ValueError(UNREADABLE)
            self._lists[base] = self._restored(seq, words[:count.value])
        except ValueError:
            self._forget_from(base, 0)
            raise
        return int(n_read)

    def _restored(self, seq: int, words: Sequence[int]) -> list[int]:
        """The tokens a slot file's words record, checked as llama-server checks them, and
        against the cells loaded (lead's lists say what each position holds)."""
        tokens = unpacked(words)
        if len(tokens) > self.n_ctx:
            raise ValueError("Restored prompt does not fit in the slot context")
        if not all(0 <= t < self.n_vocab for t in tokens):
            raise ValueError("Invalid tokens in slot save file")
        memory = llama_cpp.llama_get_memory(self._ctx)
        if llama_cpp.llama_memory_seq_pos_max(memory, seq) + 1 != len(tokens):
            raise ValueError("The slot save file's tokens and cells disagree")
        return tokens

    def _empty(self, base: int) -> None:
        """The slot whose main role is `base` holds nothing, its branches neither."""
        for j in range(self.n_branches):
            self._copy(base, base + 1 + j, 0)
        self._forget_from(base, 0)

    def _main_role(self, slot: int) -> int:
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"no slot {slot} of {self.n_slots}")
        return slot * (1 + self.n_branches)
