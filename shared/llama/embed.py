"""Embeddings of a loaded LlamaModel (shared/llama/model.py), as llama-server computes them: a
context of their own over the same weights, made with `embeddings` and a pooling type, so
that an embedding never touches the generation context's KV cache or its batch.

Each input is one llama_decode of all its tokens (pooling reads them all at once, as
llama-server's embedding slots do: the input must fit one physical batch), after the
context's memory is cleared. The context is as large as that batch, for one sequence.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from shared.llama.load import ContextShape, context_params
from shared.llama.model import LlamaModel
from shared.model import Model
from shared.presets import ModelError

POOLINGS = {"none": llama_cpp.LLAMA_POOLING_TYPE_NONE,
            "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
            "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}


def pooling_type(choice: str | None, metadata: dict[str, str]) -> int:
    """--pooling's type; unset, the GGUF's (llama.cpp reads it), else mean: a causal LM's
    GGUF names none, and its every-token vectors are no text embedding."""
    if choice is not None:
        return POOLINGS[choice]
    arch = metadata.get("general.architecture", "")
    if f"{arch}.pooling_type" in metadata:
        return llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED
    return llama_cpp.LLAMA_POOLING_TYPE_MEAN


class LlamaEmbedder:
    """An Embedder (shared/embedding.py) on `model`'s weights; `n_ctx`: the most tokens of
    one input (its physical batch). Call `embed` on the model's thread only."""

    def __init__(self, model: Model, pooling: str | None, n_ctx: int,
                 threads: int) -> None:
        if not isinstance(model, LlamaModel):
            raise ModelError("--embeddings needs a GGUF model loaded in llama.cpp")
        weights = model._model  # the loaded weights, shared with the generation context
        size = max(1, min(n_ctx, model.n_ctx))
        # the model's RoPE scaling and offloading (-nkvo, --no-op-offload), its own size
        shape = dataclasses.replace(model.shape, n_ctx=size, n_seq=1, n_batch=size,
                                    threads=threads, flash_attn=False, threads_batch=0,
                                    n_ubatch=0, kv_types=(1, 1), swa_full=False)
        self._ctx = _embedding_context(weights, pooling_type(pooling, model.metadata), shape)
        self.n_ctx = min(llama_cpp.llama_n_ctx(self._ctx), llama_cpp.llama_n_ubatch(self._ctx))
        self.n_embd = llama_cpp.llama_model_n_embd_out(weights)
        self.pooled = llama_cpp.llama_pooling_type(self._ctx) != llama_cpp.LLAMA_POOLING_TYPE_NONE
        self._batch = llama_cpp.llama_batch_init(self.n_ctx, 0, 1)
        # the model rides along so that its weights outlive this context
        self._free = weakref.finalize(self, _free_native, self._batch, self._ctx, model)
        self._free.atexit = False

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        if not 0 < len(ids) <= self.n_ctx:
            raise ValueError(f"{len(ids)} tokens: an input has 1 to {self.n_ctx}")
        memory = llama_cpp.llama_get_memory(self._ctx)
        if memory:  # (an encoder-only model keeps none)
            llama_cpp.llama_memory_clear(memory, True)
        self._fill(ids)
        rc = llama_cpp.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        return self._read(len(ids))

    def _fill(self, ids: Sequence[int]) -> None:
        b = self._batch
        for i, token in enumerate(ids):  # every token an output, as pooling needs
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, i, 1, True
            b.seq_id[i][0] = 0
        b.n_tokens = len(ids)

    def _read(self, n: int) -> np.ndarray:
        if self.pooled:
            rows = [llama_cpp.llama_get_embeddings_seq(self._ctx, 0)]
        else:
            rows = [llama_cpp.llama_get_embeddings_ith(self._ctx, i) for i in range(n)]
        if not all(rows):
            raise RuntimeError("llama.cpp gave no embeddings")
        return np.array([np.ctypeslib.as_array(r, (self.n_embd,)) for r in rows],
                        dtype=np.float32)


def _embedding_context(weights: Any, pooling: int, shape: ContextShape) -> Any:
    params = context_params(shape)
    n_ctx = shape.n_ctx
    params.embeddings, params.pooling_type = True, pooling
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO  # where the device has it
    context = llama_cpp.llama_init_from_model(weights, params)
    if not context:
        raise ModelError(f"--embeddings: a context of {n_ctx} tokens for embeddings does not "
                         "fit: try a smaller --ubatch-size")
    return context


def _free_native(batch: Any, context: Any, _model: LlamaModel) -> None:
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(context)
