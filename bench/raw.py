"""The floor of overhead: a bare llama-cpp-python greedy loop (the bench's llama.cpp edge)."""

from __future__ import annotations

import time
from pathlib import Path

import llama_cpp
import numpy as np

from bench.runs import Result


class RawLoop:
    def __init__(self, path: Path, threads: int, n_ctx: int = 4096) -> None:
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, logits_all=False, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.eog = {t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}

    def measure(self, index: int, prompt_ids: list[int], n: int) -> Result:
        """Greedy continuation of up to n tokens, timed like lead: first token to last."""
        t0 = time.perf_counter()
        self.llm.reset()
        self.llm.eval(prompt_ids)
        out: list[int] = []
        t_first = t_last = 0.0
        while len(out) < n:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1),
                                           shape=(self.n_vocab,))
            out.append(int(np.argmax(logits)))
            t_last = time.perf_counter()
            t_first = t_first or t_last
            if out[-1] in self.eog:
                break
            if len(out) < n:
                self.llm.eval([out[-1]])
        text = self.llm.detokenize(out).decode("utf-8", "replace")
        return Result("raw", index, len(out), t_last - t_first, t_first - t0, text=text,
                      token_ids=out)

    def close(self) -> None:
        self.llm.close()


def prompt_lookup(path: Path, threads: int, prompt_ids: list[int], n: int,
                  n_ctx: int = 2048) -> tuple[int, float, float]:
    """llama-cpp-python's own synchronous speculation (LlamaPromptLookupDecoding).

    It needs logits_all=True (n_ctx x n_vocab floats). Returns (tokens, decode seconds
    from first token to last, time to first token)."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, verbose=False,
                          draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))
    try:
        t0 = time.perf_counter()
        stamps = [time.perf_counter() for _ in llm.create_completion(
            prompt_ids, max_tokens=n, temperature=0.0, stream=True)]
    finally:
        llm.close()
    if not stamps:
        return 0, 0.0, 0.0
    return len(stamps), stamps[-1] - stamps[0], stamps[0] - t0
