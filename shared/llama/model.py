"""The one module that talks to llama-cpp-python (lead and back both use it), with its
loading in shared/llama/load.py, its KV cache half in shared/llama/seqs.py and its grammar
half in shared/llama/grammar.py.

LlamaModel drives its one context directly through the C API: one batch per
call, logits requested only for the rows that are needed (no logits_all), and
`llama_memory_seq_rm` to roll the KV cache back. A model loaded with `slots=S` holds S
generations side by side in one unified KV cache, decoded together by `evaluate_parts`;
with `branches=N`, each has N branch sequences beside its main one, forked off it with
`llama_memory_seq_cp` (a shared prefix is never evaluated again).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp

from shared.chat_template import ChatTemplate
from shared.context import Context, gib, kv_bytes_per_token, physical_memory
from shared.context import choose as choose_context
from shared.llama.chat import BuiltinTemplate
from shared.llama.grammar import GrammarState, captured, schema_grammar
from shared.llama.load import (
    ContextShape,
    LogRoute,
    Tuning,
    load_weights,
    metadata,
    model_params,
    new_context,
    tokenize,
)
from shared.llama.seqs import Batches, Sequences, SlotView, aborting
from shared.llama.state import SlotStates
from shared.model import flash_attention
from shared.presets import resolve_model

log = logging.getLogger(__name__)
_PIECE_BUF = 256
_DEFAULT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class LlamaModel(Sequences, Batches, SlotStates):
    """A GGUF model in llama.cpp: its vocabulary and text, and a KV cache of `slots`
    generations with `branches` branch sequences each (shared/llama/seqs.py). As a Model it is
    slot 0; `slot(i)` is slot i."""

    def __init__(self, path: Path, threads: int = 0, n_gpu_layers: int = 0, n_ctx: int = 0,
                 n_batch: int = 512, tensor_split: list[float] | None = None,
                 branches: int = 0, flash_attn: bool = True, slots: int = 1,
                 more: Tuning | None = None) -> None:
        """`n_ctx`: the most tokens one slot holds (the cache holds n_ctx per slot; 0: as an
        agent's prompt needs, where the model and memory allow: shared/context.py);
        `branches`: sequences beside each slot's main one (`fork`, `evaluate_many`);
        `more`: llama-server's knobs beyond these (threads for batches, mmap, ...)."""
        more = more or Tuning()
        self.name, self.path = path.stem, path
        self.n_branches = max(branches, 0)
        self.can_fork = self.n_branches > 0
        self.n_slots = max(slots, 1)
        n_roles = self.n_slots * (1 + self.n_branches)
        params, self._arrays = model_params(n_gpu_layers, tensor_split, more)  # kept: C reads them
        self._model = load_weights(path, params)
        self.metadata = metadata(self._model)
        shape = ContextShape(self._slot_context(n_ctx) * self.n_slots, n_roles,
                             n_batch, threads or os.cpu_count() or 1, flash_attn,
                             more.threads_batch, more.n_ubatch, more.kv_types, more.swa_full,
                             more.rope, more.kv_offload, more.op_offload)
        self._ctx = new_context(self._model, shape, str(path))
        self.shape = shape  # (an embeddings context takes its RoPE and offload from it)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx) // self.n_slots
        self.n_batch = llama_cpp.llama_n_batch(self._ctx)  # what the context takes
        self.eos_token_ids = frozenset(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t))
        self._own, self._base = self, 0  # as a Model: slot 0
        self._lists: list[list[int]] = [[] for _ in range(n_roles)]
        self._ids = list(range(n_roles))
        # a token of a slot's main sequence may belong to its every branch too
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1 + self.n_branches)
        self._free = weakref.finalize(self, _free_native, self._batch, self._ctx, self._model)
        self._free.atexit = False  # at exit the process's memory goes anyway
        self._views = [SlotView(self, i) for i in range(1, self.n_slots)]
        self._piece = ctypes.create_string_buffer(_PIECE_BUF)
        self._fingerprint: str | None = None
        # the GGUF's own template (None: it has none, and a default one is used)
        self.chat_template: str | None = self.metadata.get("tokenizer.chat_template")
        fim = (int(llama_cpp.llama_vocab_fim_pre(self._vocab)),
               int(llama_cpp.llama_vocab_fim_suf(self._vocab)),
               int(llama_cpp.llama_vocab_fim_mid(self._vocab)))
        self.fim_tokens = fim if min(fim) >= 0 else None  # (-1: the GGUF names none)
        rep, sep = (int(llama_cpp.llama_vocab_fim_rep(self._vocab)),
                    int(llama_cpp.llama_vocab_fim_sep(self._vocab)))
        self.fim_repo_tokens = (rep if rep >= 0 else None, sep if sep >= 0 else None)
        self._chat: ChatTemplate | BuiltinTemplate = self._chat_formatter()
        self._abort: Callable[[], bool] | None = None
        self._polled = False
        self._abort_callback = llama_cpp.ggml_abort_callback(self._abort_requested)  # kept: C
        self._evaluating_thread: int | None = None  # see _check_thread

    def _slot_context(self, given: int) -> int:
        """The tokens a slot holds: as given, or (0) what an agent's prompt needs, as the
        model and memory allow; logged with the cache they take."""
        meta = self.metadata
        chosen = Context(given, "given") if given else choose_context(
            meta, self.n_slots, physical_memory())
        log.info("%s: a generation holds %d tokens (%s; --ctx-size sets the cache's total, "
                 "--ctx-per-slot a slot's): %s of KV cache for %d slot%s", self.name,
                 chosen.n_ctx, chosen.why,
                 gib(chosen.n_ctx * self.n_slots * kv_bytes_per_token(meta)), self.n_slots,
                 "" if self.n_slots == 1 else "s")
        return chosen.n_ctx

    def slot(self, i: int) -> Sequences:
        """Slot i's sequences as a model of their own (slot 0: this model)."""
        if not 0 <= i < self.n_slots:
            raise ValueError(f"no slot {i} of {self.n_slots}")
        return self if i == 0 else self._views[i - 1]

    def set_threads(self, threads: int) -> None:
        """Compute threads for the next evaluations (call on the model thread)."""
        llama_cpp.llama_set_n_threads(self._ctx, threads, threads)

    def close(self) -> None:
        """Free the batch, the context and the model (once; the model is unusable after;
        a model dropped without close is freed when collected)."""
        self._free()
        self._ctx = self._model = None

    # --- text ---
    def tokenize(self, text: str, special: bool = False, add_bos: bool = True) -> list[int]:
        return tokenize(self._vocab, text.encode("utf-8"), add_bos, special)

    def token_bytes(self, token_id: int) -> bytes:
        n = llama_cpp.llama_token_to_piece(self._vocab, token_id, self._piece, _PIECE_BUF, 0, False)
        return self._piece.raw[:max(n, 0)]

    def format_chat(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = True, thinking: bool | None = None) -> str:
        return self._chat.render(messages, tools, add_generation_prompt, thinking)

    @property
    def thinks(self) -> bool:
        return self._chat.thinking_switch

    def _chat_formatter(self) -> ChatTemplate:
        template = self.chat_template or _DEFAULT_TEMPLATE
        eos = self._text_of(llama_cpp.llama_vocab_eos(self._vocab))
        bos = self._text_of(llama_cpp.llama_vocab_bos(self._vocab))
        return ChatTemplate(template, bos=bos, eos=eos)

    def use_chat_template(self, source: str | None, jinja: bool = True,
                          thinking: bool | None = None) -> None:
        """Render chats with `source` (None: the GGUF's own) as Jinja (`thinking`: its
        switch where a request sets none), or with jinja False
        through llama.cpp's built-in templates (`source` may name one: llama3, chatml...)
        as llama-server does without --jinja; ValueError where none is like it."""
        if jinja:
            # llama-server's one named template under --jinja
            self.chat_template = _DEFAULT_TEMPLATE if source == "chatml" else \
                source or self.chat_template
            self._chat = self._chat_formatter()
            self._chat.thinking = thinking
            return
        if source is None:  # the GGUF's, where llama.cpp knows its kind; else ChatML
            try:
                self._chat = BuiltinTemplate(self.chat_template or "chatml")
            except ValueError:
                log.warning("%s: llama.cpp has no built-in template like the GGUF's: using "
                            "chatml (--jinja renders the GGUF's own)", self.name)
                self._chat = BuiltinTemplate("chatml")
            return
        self._chat = BuiltinTemplate(source)

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

    # --- grammars ---
    def constraint(self, gbnf: str) -> GrammarState:
        return GrammarState.parse(self._vocab, self.n_vocab, self.eos_token_ids, gbnf)

    def schema_grammar(self, schema: dict[str, Any], strict: bool = True) -> str:
        return schema_grammar(schema, strict)


def _free_native(batch: Any, context: Any, model: Any) -> None:
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(context)
    llama_cpp.llama_model_free(model)


def _quiet_line(level: int, text: str) -> bool:
    """Whether a llama.cpp log line is taken here: a grammar's parse errors become its
    ValueError's message; an aborted decode's three errors and a warning are routine for
    a back dropping a stale draft, so not shown."""
    lines = getattr(captured, "lines", None)
    if lines is not None:
        lines.append(text)
        return True
    return bool(getattr(aborting, "now", False))


LogRoute.hook = _quiet_line


def load_model(spec: str, threads: int = 0, n_gpu_layers: int = 0, n_ctx: int = 0,
               n_batch: int = 512, rpc: str | None = None,
               tensor_split: str | None = None, branches: int = 0,
               flash_attn: str = "auto", slots: int = 1,
               more: Tuning | None = None) -> LlamaModel:
    """`rpc`: servers as --rpc takes them; `tensor_split`: weights as --tensor-split;
    `branches`: sequences to draft branches on, beside each slot's main one; `slots`:
    generations held at once, `n_ctx` tokens each; `flash_attn`: on, off,
    or auto: on where layers are offloaded or `slots` > 1 (shared.model.flash_attention)."""
    from shared.llama import ggml
    from shared.wire.rpc_endpoints import parse_weights

    path = resolve_model(spec)
    servers = ggml.attach_rpc(rpc)
    if servers and n_gpu_layers == 0:
        log.warning("--rpc without --n-gpu-layers: every layer stays local (-1 sends all)")
    elif servers:
        log.info("%s: %s layers on RPC servers %s", path.stem,
                 "all" if n_gpu_layers < 0 else f"up to {n_gpu_layers}", ", ".join(servers))
    weights = parse_weights(tensor_split) if tensor_split else None
    flash = flash_attention(flash_attn, n_gpu_layers, slots)
    log.info("%s: flash attention %s (--flash-attn %s, %d slot%s)", path.stem,
             "on" if flash else "off", flash_attn, slots, "" if slots == 1 else "s")
    return LlamaModel(path, threads, n_gpu_layers, n_ctx, n_batch, weights, branches, flash,
                      slots, more)
