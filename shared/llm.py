"""The one module that talks to llama-cpp-python (lead and back both use it).

LlamaModel drives the context directly through the low-level API: one batch per
call, logits requested only for the rows that are needed (no logits_all), and
`llama_memory_seq_rm` to roll the KV cache back. A model loaded with `branches=N` has N
branch sequences beside the main one in a unified KV cache, each forked off the main one
with `llama_memory_seq_cp` (a shared prefix is never evaluated again), all extended in
one batch by `evaluate_many`.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import _logger as llama_logger
from llama_cpp._internals import LlamaContext
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from shared.llm_grammar import GrammarState, captured, schema_grammar
from shared.model import MAIN, EvaluationAborted, check_tree, flash_attention
from shared.presets import ModelError, resolve_model

log = logging.getLogger(__name__)
_PIECE_BUF = 256
_Entry = tuple[int, int, tuple[int, ...], bool]  # token, position, roles, wants its logits
_DECODE_ABORTED = 2  # llama_decode's return code when the abort callback said stop
_DEFAULT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class LlamaModel:
    def __init__(self, path: Path, threads: int = 0, n_gpu_layers: int = 0, n_ctx: int = 4096,
                 n_batch: int = 512, tensor_split: list[float] | None = None,
                 branches: int = 0, flash_attn: bool = True) -> None:
        """`branches`: branch sequences beside the main one (`fork`, `evaluate_many`)."""
        threads = threads or os.cpu_count() or 1
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                n_threads=threads, n_threads_batch=threads, n_gpu_layers=n_gpu_layers,
                tensor_split=tensor_split, logits_all=False, verbose=False,
                flash_attn=flash_attn)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"cannot load {path}: {exc} (is it a GGUF file?)") from None
        self.name = path.stem
        self.n_branches = max(branches, 0)
        self.can_fork = self.n_branches > 0
        if self.can_fork:
            self._more_sequences(1 + self.n_branches)
        self._ctx = self._llm.ctx
        self._vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_ctx = self._llm.n_ctx()
        self.n_batch = n_batch
        self.eos_token_ids = frozenset(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t))
        # token lists and llama.cpp sequence ids by role: the main sequence, then the slots
        self._lists: list[list[int]] = [[] for _ in range(1 + self.n_branches)]
        self._ids = list(range(1 + self.n_branches))
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1 + self.n_branches)
        self._piece = ctypes.create_string_buffer(_PIECE_BUF)
        self._fingerprint: str | None = None
        # the GGUF's own template (None: it has none, and a default one is used)
        self.chat_template: str | None = self._llm.metadata.get("tokenizer.chat_template")
        fim = (int(llama_cpp.llama_vocab_fim_pre(self._vocab)),
               int(llama_cpp.llama_vocab_fim_suf(self._vocab)),
               int(llama_cpp.llama_vocab_fim_mid(self._vocab)))
        self.fim_tokens = fim if min(fim) >= 0 else None  # (-1: the GGUF names none)
        self._chat = self._chat_formatter()
        self._abort: Callable[[], bool] | None = None
        self._polled = False  # whether llama.cpp calls _abort_requested now
        self._abort_callback = llama_cpp.ggml_abort_callback(self._abort_requested)  # kept: C
        self._evaluating_thread: int | None = None  # see _check_thread
        llama_cpp.llama_log_set(_log_unless_aborting, ctypes.c_void_p(0))  # holds pointers

    def _more_sequences(self, n_seq: int) -> None:
        """Replace Llama's context (made for one sequence) with one for `n_seq` sharing one
        KV buffer: unified, so that a branch's cells see the prefix it shares with the main
        sequence (split per sequence, each would hold n_ctx / n_seq and copy the prefix)."""
        params = llama_cpp.llama_context_params.from_buffer_copy(self._llm.context_params)
        params.n_seq_max, params.kv_unified = n_seq, True
        context = LlamaContext(model=self._llm._model, params=params, verbose=False)
        self._llm._ctx.close()
        self._llm._ctx = context

    def set_threads(self, threads: int) -> None:
        """Compute threads for the next evaluations (call on the model thread)."""
        llama_cpp.llama_set_n_threads(self._ctx, threads, threads)

    def close(self) -> None:
        llama_cpp.llama_batch_free(self._batch)
        self._llm.close()

    # --- text ---
    def tokenize(self, text: str, special: bool = False, add_bos: bool = True) -> list[int]:
        return self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def token_bytes(self, token_id: int) -> bytes:
        n = llama_cpp.llama_token_to_piece(self._vocab, token_id, self._piece, _PIECE_BUF, 0, False)
        return self._piece.raw[:max(n, 0)]

    def format_chat(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None) -> str:
        return render_chat(self._chat, messages, tools)

    def _chat_formatter(self) -> Jinja2ChatFormatter:
        template = self.chat_template or _DEFAULT_TEMPLATE
        eos = self._text_of(self._llm.token_eos())
        bos = self._text_of(self._llm.token_bos())
        return Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)

    def _text_of(self, token_id: int) -> str:
        if token_id < 0:
            return ""
        return (llama_cpp.llama_vocab_get_text(self._vocab, token_id) or b"").decode(
            "utf-8", "replace")

    def fingerprint(self) -> str:
        """SHA-256 over the token table: equal fingerprints mean interchangeable ids."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for t in range(self.n_vocab):
                digest.update(llama_cpp.llama_vocab_get_text(self._vocab, t) or b"")
                digest.update(b"\0")
            self._fingerprint = digest.hexdigest()[:32]
        return self._fingerprint

    # --- compute ---
    def evaluate(self, tokens: Sequence[int], n_logits: int,
                 abort: Callable[[], bool] | None = None) -> np.ndarray:
        """Append `tokens` (in n_batch chunks); logits of the last `n_logits` of them.
        `abort` is polled between the graph's operations (hundreds per token)."""
        return self._evaluate(0, tokens, n_logits, abort)

    @property
    def cached(self) -> list[int]:
        """The main sequence's tokens."""
        return self._lists[0]

    @property
    def branch_cached(self) -> list[list[int]]:
        return self._lists[1:]

    def fork(self, slot: int, n_keep: int) -> None:
        """Branch `slot` holds the first n_keep tokens of `cached`: their cells, shared."""
        if not 0 <= slot < self.n_branches or not 0 <= n_keep <= len(self.cached):
            raise ValueError(f"cannot fork {n_keep} of {len(self.cached)} tokens to branch "
                             f"{slot} of {self.n_branches}")
        memory = llama_cpp.llama_get_memory(self._ctx)
        llama_cpp.llama_memory_seq_rm(memory, self._ids[1 + slot], 0, -1)
        if n_keep:
            llama_cpp.llama_memory_seq_cp(memory, self._ids[0], self._ids[1 + slot], 0, n_keep)
        self._lists[1 + slot] = self.cached[:n_keep]

    def adopt(self, slot: int) -> None:
        """Branch `slot` becomes the main sequence and the main one that branch."""
        if not 0 <= slot < self.n_branches:
            raise ValueError(f"no branch {slot} of {self.n_branches}")
        for pair in (self._ids, self._lists):
            pair[0], pair[1 + slot] = pair[1 + slot], pair[0]  # type: ignore[assignment]

    def evaluate_many(self, tokens: Mapping[int, Sequence[int]],
                      abort: Callable[[], bool] | None = None) -> dict[int, np.ndarray]:
        """One batch appending tokens[key] to sequence `key` (MAIN or a slot); the logits row
        after each key's last token. On abort or failure every sequence is as before."""
        roles = {key: self._role(key) for key, ts in tokens.items() if ts}
        parts = [(roles[key], list(tokens[key])) for key in roles]
        if sum(len(ts) for _, ts in parts) > self.n_batch:
            raise ValueError(f"{sum(len(ts) for _, ts in parts)} tokens exceed the batch "
                             f"({self.n_batch})")
        if not parts:
            return {}
        self._check_thread()
        self._set_abort(abort)
        try:
            rows = self._decode_many(parts)
        finally:
            self._set_abort(None)
        return {key: rows[i] for i, key in enumerate(roles)}

    def _role(self, key: int) -> int:
        if key == MAIN:
            return 0
        if not 0 <= key < self.n_branches:
            raise ValueError(f"no sequence {key}: MAIN or a branch of {self.n_branches}")
        return 1 + key

    def _decode_many(self, parts: list[tuple[int, list[int]]]) -> list[np.ndarray]:
        """Decode one batch over several sequences (role, tokens); the logits row after
        each one's last token."""
        if any(len(self._lists[role]) + len(ts) > self.n_ctx for role, ts in parts):
            raise RuntimeError(f"context full ({self.n_ctx} tokens)")
        entries: list[_Entry] = []
        for role, ts in parts:
            n_past = len(self._lists[role])
            entries += [(t, n_past + j, (role,), j == len(ts) - 1) for j, t in enumerate(ts)]
        try:
            rows = self._decode_entries(entries)
        except (EvaluationAborted, RuntimeError):
            for role, _ in parts:  # a failed or aborted decode may leave entries
                self._forget_from(role, len(self._lists[role]))
            raise
        for role, ts in parts:
            self._lists[role].extend(ts)
        return list(rows)

    def evaluate_tree(self, tokens: Sequence[int], branches: Sequence[tuple[int, Sequence[int]]]
                      ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One batch: `tokens` on the main sequence and branch j's ids on slot j, the
        tokens they share (tokens[:at + 1]) in both sequences' cells at once."""
        check_tree(len(tokens), branches, self.n_branches)
        n_past = len(self.cached)
        if n_past + len(tokens) + sum(len(ids) for _, ids in branches) > self.n_ctx:
            raise RuntimeError(f"context full ({self.n_ctx} tokens)")
        self._check_thread()
        for slot in range(len(branches)):
            self.fork(slot, n_past)  # the context: its cells gain the slot's id
        entries: list[_Entry] = [
            (t, n_past + m, (0, *(1 + j for j, (at, _) in enumerate(branches) if m <= at)), True)
            for m, t in enumerate(tokens)]
        for j, (at, ids) in enumerate(branches):
            entries += [(t, n_past + at + 1 + i, (1 + j,), True) for i, t in enumerate(ids)]
        try:
            rows = self._decode_entries(entries)
        except (EvaluationAborted, RuntimeError):
            self._forget_from(0, n_past)
            for slot in range(len(branches)):
                self.fork(slot, 0)
            raise
        self.cached.extend(tokens)
        for j, (at, ids) in enumerate(branches):
            self._lists[1 + j] = self.cached[:n_past + at + 1] + list(ids)
        starts = np.cumsum([len(tokens), *(len(ids) for _, ids in branches)])
        return rows[:len(tokens)], np.split(rows, starts)[1:-1]

    def _decode_entries(self, entries: list[_Entry]) -> np.ndarray:
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
        _aborting.now = False
        if rc == _DECODE_ABORTED:
            raise EvaluationAborted()
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
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
            callback = self._abort_callback if self._polled else _NO_ABORT_CALLBACK
            llama_cpp.llama_set_abort_callback(self._ctx, callback, None)

    def _abort_requested(self, _data: ctypes.c_void_p) -> bool:
        """Called by llama.cpp, on the thread inside llama_decode."""
        try:
            stop = self._abort is not None and bool(self._abort())
        except Exception:  # raised into C it would be lost, and the answer undefined
            log.exception("abort check failed; the evaluation goes on without it")
            self._abort = None
            return False
        _aborting.now = stop
        return stop

    def _decode(self, role: int, chunk: Sequence[int], first_logit: int,
                out: np.ndarray) -> None:
        """Decode one batch on the sequence of `role` (0: the main one); copy the logits of
        rows first_logit.. into `out`."""
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
        _aborting.now = False
        if rc != 0:
            self._forget_from(role, n_past)  # a failed or aborted decode may leave entries
            if rc == _DECODE_ABORTED:
                raise EvaluationAborted()
            raise RuntimeError(f"llama_decode failed with code {rc}")
        sequence.extend(chunk)
        for row, i in enumerate(range(first_logit, len(chunk))):
            out[row] = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, i),
                                             shape=(self.n_vocab,))

    def truncate(self, n: int) -> None:
        if n < len(self.cached):
            self._forget_from(0, n)

    # --- grammars ---
    def constraint(self, gbnf: str) -> GrammarState:
        return GrammarState.parse(self._vocab, self.n_vocab, self.eos_token_ids, gbnf)

    def schema_grammar(self, schema: dict[str, Any], strict: bool = True) -> str:
        return schema_grammar(schema, strict)

    def _forget_from(self, role: int, n: int) -> None:
        # cells other sequences share stay: they only lose this sequence's id
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx), self._ids[role],
                                      n, -1)
        del self._lists[role][n:]


_NO_ABORT_CALLBACK = llama_cpp.ggml_abort_callback(0)  # a NULL function pointer
_aborting = threading.local()  # .now: this thread's decode is being aborted


@llama_cpp.llama_log_callback
def _log_unless_aborting(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # An aborted decode logs three errors and a warning; for a back dropping a stale
    # draft that is routine. A grammar's parse errors become the ValueError's message.
    # All else goes to llama-cpp-python's own logger, as before.
    lines = getattr(captured, "lines", None)
    if lines is not None:
        lines.append(text.decode("utf-8", "replace"))
    elif not getattr(_aborting, "now", False):
        llama_logger.llama_log_callback(level, text, user_data)


def render_chat(formatter: Jinja2ChatFormatter, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt for `messages`; ValueError with the template's own message when it
    refuses them (many raise on a role they do not know, or on roles out of turn)."""
    try:
        return formatter(messages=messages, tools=tools).prompt
    except Exception as exc:  # a template is the model's code: any error is about the input
        raise ValueError(str(exc) or type(exc).__name__) from None


def load_model(spec: str, threads: int = 0, n_gpu_layers: int = 0, n_ctx: int = 4096,
               n_batch: int = 512, rpc: str | None = None,
               tensor_split: str | None = None, branches: int = 0,
               flash_attn: str = "auto") -> LlamaModel:
    """`rpc`: servers as --rpc takes them; `tensor_split`: weights as --tensor-split;
    `branches`: sequences to draft branches on, beside the main one; `flash_attn`: on, off,
    or auto: on where layers are offloaded (on a 2-core EPYC's CPU, a batch of 32 at 1-2k
    tokens of context cost 1.3-1.5x as much with it, a single token 4 % less)."""
    from shared import ggml
    from shared.rpcwire import parse_weights

    path = resolve_model(spec)
    servers = ggml.attach_rpc(rpc)
    if servers and n_gpu_layers == 0:
        log.warning("--rpc without --n-gpu-layers: every layer stays local (-1 sends all)")
    elif servers:
        log.info("%s: %s layers on RPC servers %s", path.stem,
                 "all" if n_gpu_layers < 0 else f"up to {n_gpu_layers}", ", ".join(servers))
    weights = parse_weights(tensor_split) if tensor_split else None
    return LlamaModel(path, threads, n_gpu_layers, n_ctx, n_batch, weights, branches,
                      flash_attention(flash_attn, n_gpu_layers))
