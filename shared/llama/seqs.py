"""The KV cache half of the llama.cpp edge (shared/llama/model.py holds the context, text and
loading): the sequences a LlamaModel's unified cache holds, and batches over them.

A model loaded with `slots=S, branches=B` holds S slots, each a main sequence and B branch
sequences, laid out as roles: slot s's main sequence is role s * (1 + B), its branches the
B roles after it. Each role has a token list (what its cells hold) and a llama.cpp sequence
id (`adopt` swaps ids within a slot). `Sequences` is one slot's view: the Model and Forking
interface over its roles; the model itself is slot 0, `slot(i)` the others.
`evaluate_parts` decodes several slots' tokens in one llama_decode.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import llama_cpp
import numpy as np

from shared.model import MAIN, EvaluationAborted, Part

log = logging.getLogger("shared.llama.model")
Entry = tuple[int, int, tuple[int, ...], bool]  # token, position, roles, wants its logits


class Sequences:
    """One slot of a LlamaModel's cache, as a Forking model (`_own`: the model, by its
    Batches side: this module imports nothing of shared/llama/model.py)."""

    _own: Batches
    _base: int  # the role of this slot's main sequence
    n_branches: int
    can_fork: bool

    @property
    def index(self) -> int:
        return self._base // (1 + self.n_branches)

    @property
    def cached(self) -> list[int]:
        """The main sequence's tokens."""
        return self._own._lists[self._base]

    @property
    def branch_cached(self) -> list[list[int]]:
        return self._own._lists[self._base + 1:self._base + 1 + self.n_branches]

    def evaluate(self, tokens: Sequence[int], n_logits: int,
                 abort: Callable[[], bool] | None = None) -> np.ndarray:
        """Append `tokens` (in n_batch chunks); logits of the last `n_logits` of them.
        `abort` is polled between the graph's operations (hundreds per token)."""
        return self._own._evaluate(self._base, tokens, n_logits, abort)

    def truncate(self, n: int) -> None:
        if n < len(self.cached):
            self._own._forget_from(self._base, n)

    def fork(self, branch: int, n_keep: int) -> None:
        """Branch `branch` holds the first n_keep tokens of `cached`: their cells, shared."""
        if not 0 <= branch < self.n_branches or not 0 <= n_keep <= len(self.cached):
            raise ValueError(f"cannot fork {n_keep} of {len(self.cached)} tokens to branch "
                             f"{branch} of {self.n_branches}")
        self._own._copy(self._base, self._base + 1 + branch, n_keep)

    def adopt(self, branch: int) -> None:
        """Branch `branch` becomes the main sequence and the main one that branch."""
        if not 0 <= branch < self.n_branches:
            raise ValueError(f"no branch {branch} of {self.n_branches}")
        own, a, b = self._own, self._base, self._base + 1 + branch
        own._ids[a], own._ids[b] = own._ids[b], own._ids[a]
        own._lists[a], own._lists[b] = own._lists[b], own._lists[a]

    def evaluate_many(self, tokens: Mapping[int, Sequence[int]],
                      abort: Callable[[], bool] | None = None) -> dict[int, np.ndarray]:
        """One batch appending tokens[key] to sequence `key` (MAIN or a branch); the logits
        row after each key's last token. On abort or failure every sequence is as before."""
        roles = {key: self._role(key) for key, ts in tokens.items() if ts}
        parts = [(roles[key], list(tokens[key])) for key in roles]
        if sum(len(ts) for _, ts in parts) > self._own.n_batch:
            raise ValueError(f"{sum(len(ts) for _, ts in parts)} tokens exceed the batch "
                             f"({self._own.n_batch})")
        if not parts:
            return {}
        rows = self._own._decode_many(parts, abort)
        return {key: rows[i] for i, key in enumerate(roles)}

    def _role(self, key: int) -> int:
        if key == MAIN:
            return self._base
        if not 0 <= key < self.n_branches:
            raise ValueError(f"no sequence {key}: MAIN or a branch of {self.n_branches}")
        return self._base + 1 + key


class SlotView(Sequences):
    """Slot `index` (> 0) of a model: its own sequences, the model's vocabulary and text."""

    def __init__(self, own: Batches, index: int) -> None:
        self._own, self.n_branches, self.can_fork = own, own.n_branches, own.can_fork
        self._base = index * (1 + own.n_branches)

    def __getattr__(self, name: str) -> Any:  # name, n_vocab, tokenize, ...: the model's
        return getattr(self._own, name)


class Batches:
    """The model's side of the sequences: every llama_decode, over one role or several
    roles and slots, with rollback and abort; prefix copies. Mixed into LlamaModel, which
    makes the context and sets the fields below."""

    name: str
    n_vocab: int
    n_ctx: int  # per slot
    n_batch: int
    n_slots: int
    n_branches: int
    can_fork: bool
    _ctx: Any
    _batch: Any
    _lists: list[list[int]]  # per role: the tokens its cells hold
    _ids: list[int]  # per role: its llama.cpp sequence id
    _abort: Callable[[], bool] | None
    _polled: bool  # whether llama.cpp calls _abort_requested now
    _abort_callback: Any
    _evaluating_thread: int | None

    def slot(self, i: int) -> Sequences: ...  # LlamaModel's

    def evaluate_parts(self, parts: Sequence[Part]) -> list[np.ndarray]:
        """One llama_decode for every part (one per slot); per part, the rows after its
        last n_logits tokens. On failure every slot is as before."""
        if len({p.slot for p in parts}) != len(parts):
            raise ValueError("one part per slot in a batch")
        starts = [self._start_part(p) for p in parts]
        entries = [e for p, n_past in zip(parts, starts, strict=True)
                   for e in self._part_entries(p, n_past)]
        self._check_thread()
        try:
            rows = self._decode_entries(entries) if entries else np.zeros((0, 0), np.float32)
        except (EvaluationAborted, RuntimeError):
            for p, n_past in zip(parts, starts, strict=True):
                self._forget_from(p.slot * (1 + self.n_branches), n_past)
            raise
        return self._finish_parts(parts, rows)

    def _start_part(self, part: Part) -> int:
        """Check that `part` fits its slot; the main sequence's length before it."""
        if not 0 <= part.slot < self.n_slots:
            raise ValueError(f"no slot {part.slot} of {self.n_slots}")
        n_past = len(self._lists[part.slot * (1 + self.n_branches)])
        if n_past + part.n_tokens > self.n_ctx:
            raise RuntimeError(f"context full ({self.n_ctx} tokens)")
        return n_past

    def _part_entries(self, part: Part, n_past: int) -> list[Entry]:
        base, first_logit = part.slot * (1 + self.n_branches), len(part.tokens) - part.n_logits
        return [(t, n_past + m, (base,), m >= first_logit) for m, t in enumerate(part.tokens)]

    def _finish_parts(self, parts: Sequence[Part], rows: np.ndarray) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        offset = 0
        for part in parts:
            self._lists[part.slot * (1 + self.n_branches)].extend(part.tokens)
            out.append(rows[offset:offset + part.n_logits])
            offset += part.n_logits
        return out

    def evaluate_many_slots(self, calls: Sequence[tuple[int, Mapping[int, Sequence[int]]]],
                            abort: Callable[[], bool] | None = None
                            ) -> list[dict[int, np.ndarray]]:
        """Several slots' `evaluate_many` (slot, tokens per sequence) in one batch; per call,
        the logits row after each sequence's last token. On abort or failure every
        sequence is as before."""
        parts: list[tuple[int, list[int]]] = []
        owners: list[tuple[int, int]] = []  # per part: (call, key)
        for i, (slot, tokens) in enumerate(calls):
            view = self.slot(slot)
            for key, ts in tokens.items():
                if ts:
                    parts.append((view._role(key), list(ts)))
                    owners.append((i, key))
        if sum(len(ts) for _, ts in parts) > self.n_batch:
            raise ValueError(f"{sum(len(ts) for _, ts in parts)} tokens exceed the batch "
                             f"({self.n_batch})")
        rows = self._decode_many(parts, abort) if parts else []
        out: list[dict[int, np.ndarray]] = [{} for _ in calls]
        for (i, key), row in zip(owners, rows, strict=True):
            out[i][key] = row
        return out

    def share_prefix(self, source: int, target: int, n: int) -> None:
        """Slot `target` holds the first n tokens of slot `source`'s main sequence (cells
        shared); its branches are emptied."""
        stride = 1 + self.n_branches
        if not (0 <= source < self.n_slots and 0 <= target < self.n_slots) or \
                not 0 <= n <= len(self._lists[source * stride]):
            raise ValueError(f"cannot share {n} tokens of slot {source} with slot {target}")
        if source != target:
            self._copy(source * stride, target * stride, n)
        for j in range(self.n_branches):
            self._copy(target * stride, target * stride + 1 + j, 0)

    def _copy(self, source: int, target: int, n: int) -> None:
        """Role `target` holds the first n tokens of role `source`: their cells, shared."""
        memory = llama_cpp.llama_get_memory(self._ctx)
        llama_cpp.llama_memory_seq_rm(memory, self._ids[target], 0, -1)
        if n:
            llama_cpp.llama_memory_seq_cp(memory, self._ids[source], self._ids[target], 0, n)
        self._lists[target] = self._lists[source][:n]

    def _decode_many(self, parts: list[tuple[int, list[int]]],
                     abort: Callable[[], bool] | None = None) -> list[np.ndarray]:
        """Decode one batch over several roles (role, tokens); the logits row after each
        one's last token. On abort or failure every role is as before."""
        if any(len(self._lists[role]) + len(ts) > self.n_ctx for role, ts in parts):
            raise RuntimeError(f"context full ({self.n_ctx} tokens)")
        entries: list[Entry] = []
        for role, ts in parts:
            n_past = len(self._lists[role])
            entries += [(t, n_past + j, (role,), j == len(ts) - 1) for j, t in enumerate(ts)]
        self._check_thread()
        self._set_abort(abort)
        try:
            rows = self._decode_entries(entries)
        except (EvaluationAborted, RuntimeError):
            for role, _ in parts:  # a failed or aborted decode may leave entries
                self._forget_from(role, len(self._lists[role]))
            raise
        finally:
            self._set_abort(None)
        for role, ts in parts:
            self._lists[role].extend(ts)
        return list(rows)

    def _forget_from(self, role: int, n: int) -> None:
        # cells other sequences share stay: they only lose this sequence's id
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx), self._ids[role],
                                      n, -1)
        del self._lists[role][n:]

    def _decode_entries(self, entries: list[Entry]) -> np.ndarray:
        """Decode one batch of (token, position, roles, wants logits); the logits rows
        asked for, in order. Raises EvaluationAborted or RuntimeError."""
        if len(entries) > self.n_batch:
            raise ValueError(f"{len(entries)} tokens exceed the batch ({self.n_batch})")
        b, wanted = self._batch, []
        for i, (token, pos, roles, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, len(roles), logits
            for k, role in enumerate(roles):
                b.seq_id[i][k] = self._ids[role]
            if logits:
                wanted.append(i)
        b.n_tokens = len(entries)
        rc = llama_cpp.llama_decode(self._ctx, b)
        aborting.now = False
        if rc == DECODE_ABORTED:
            raise EvaluationAborted()
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        if not wanted:
            return np.zeros((0, self.n_vocab), np.float32)
        return np.stack([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, k),
                                               shape=(self.n_vocab,)) for k in wanted])

    def _evaluate(self, role: int, tokens: Sequence[int], n_logits: int,
                  abort: Callable[[], bool] | None) -> np.ndarray:
        self._check_thread()
        n_before = len(self._lists[role])
        out = np.empty((n_logits, self.n_vocab), np.float32)
        self._set_abort(abort)
        try:
            for start in range(0, len(tokens), self.n_batch):
                chunk = tokens[start:start + self.n_batch]
                first_logit = len(tokens) - n_logits - start  # index within chunk
                self._decode(role, chunk, max(first_logit, 0), out[max(-first_logit, 0):])
        except EvaluationAborted:
            self._forget_from(role, n_before)
            raise
        finally:
            self._set_abort(None)
        return out

    def _decode(self, role: int, chunk: Sequence[int], first_logit: int,
                out: np.ndarray) -> None:
        """Decode one batch on the sequence of `role`; copy the logits of rows
        first_logit.. into `out`."""
        sequence = self._lists[role]
        n_past = len(sequence)
        if n_past + len(chunk) > self.n_ctx:
            raise RuntimeError(f"context full ({self.n_ctx} tokens)")
        b = self._batch
        for i, token in enumerate(chunk):
            b.token[i], b.pos[i], b.n_seq_id[i] = token, n_past + i, 1
            b.seq_id[i][0] = self._ids[role]
            b.logits[i] = i >= first_logit
        b.n_tokens = len(chunk)
        rc = llama_cpp.llama_decode(self._ctx, b)
        aborting.now = False
        if rc != 0:
            self._forget_from(role, n_past)  # a failed or aborted decode may leave entries
            if rc == DECODE_ABORTED:
                raise EvaluationAborted()
            raise RuntimeError(f"llama_decode failed with code {rc}")
        sequence.extend(chunk)
        for row, i in enumerate(range(first_logit, len(chunk))):
            out[row] = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, i),
                                             shape=(self.n_vocab,))

    def _check_thread(self) -> None:
        # Each calling thread gets an OpenMP pool of its own; two pools on a full CPU make
        # every barrier sleep (0.7x). Callers use one ModelThread; say so if one does not.
        me = threading.get_ident()
        if self._evaluating_thread is None:
            self._evaluating_thread = me
        elif me != self._evaluating_thread:
            log.warning("%s evaluated on a second thread: llama.cpp then keeps two OpenMP "
                        "pools and decodes slower; run model calls on one ModelThread",
                        self.name)
            self._evaluating_thread = me

    def _set_abort(self, abort: Callable[[], bool] | None) -> None:
        # Installed only around evaluations that may stop: no other call (none of lead's)
        # is polled, so none waits for the GIL between the graph's operations.
        self._abort = abort
        if (abort is not None) != self._polled:
            self._polled = abort is not None
            callback = self._abort_callback if self._polled else NO_ABORT_CALLBACK
            llama_cpp.llama_set_abort_callback(self._ctx, callback, None)

    def _abort_requested(self, _data: ctypes.c_void_p) -> bool:
        """Called by llama.cpp, on the thread inside llama_decode."""
        try:
            stop = self._abort is not None and bool(self._abort())
        except Exception:  # raised into C it would be lost, and the answer undefined
            log.exception("abort check failed; the evaluation goes on without it")
            self._abort = None
            return False
        aborting.now = stop
        return stop


DECODE_ABORTED = 2  # llama_decode's return code when the abort callback said stop
NO_ABORT_CALLBACK = llama_cpp.ggml_abort_callback(0)  # a NULL function pointer
aborting = threading.local()  # .now: this thread's decode is being aborted
