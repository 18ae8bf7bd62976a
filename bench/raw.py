"""The floor of overhead: a bare llama-cpp-python greedy loop (the bench's llama.cpp edge)."""

from __future__ import annotations

import time
from pathlib import Path

import llama_cpp
import numpy as np


class RawLoop:
    def __init__(self, path: Path, threads: int, n_ctx: int = 4096) -> None:
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, logits_all=False, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.eog = {t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}

    def decode(self, prompt_ids: list[int], n: int) -> tuple[list[int], float]:
        """Greedy continuation of up to n tokens; seconds spent decoding (prefill excluded)."""
        self.llm.reset()
        self.llm.eval(prompt_ids)
        out: list[int] = []
        t0 = time.perf_counter()
        for _ in range(n):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1),
                                           shape=(self.n_vocab,))
            token = int(np.argmax(logits))
            out.append(token)
            if token in self.eog:
                break
            self.llm.eval([token])
        return out, time.perf_counter() - t0

    def close(self) -> None:
        self.llm.close()
