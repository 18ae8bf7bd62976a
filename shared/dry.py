"""DRY ("don't repeat yourself"), llama.cpp's sampler (src/llama-sampling.cpp, after
koboldcpp's), as a pure function of one row and the tokens before it.

A token that would extend a sequence the context already holds earlier, repeated for
`dry_allowed_length` tokens or more, loses multiplier * base ^ (length - allowed) from its
logit. The history is the context's last `dry_penalty_last_n` tokens, the prompt's
included (llama-server feeds its samplers the prompt). A repeat stops at a sequence
breaker: a text (newline, ...) that restarts the count, matched as the tokens that spell
it (`restarts`, from the vocabulary: `restart_sequences`). tests/test_llama_samplers.py
holds it against llama.cpp's own.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from shared.wire.protocol import SamplingParams

Restarts = Mapping[int, tuple[tuple[int, ...], ...]]  # head token -> the tails after it
MAX_BREAKER_BYTES, MAX_TAIL = 40, 20  # llama.cpp's caps on a breaker and its tail
_FLOAT_MAX_LOG = 88.7228391  # log of float32's largest: the exponent is capped below it


def on(params: SamplingParams) -> bool:
    return params.dry_multiplier != 0.0 and params.dry_base >= 1.0 \
        and params.dry_penalty_last_n != 0 and not params.mirostat


def penalize(row: np.ndarray, params: SamplingParams, history: np.ndarray) -> None:
    """Subtract DRY's penalty from `row` (in place), for the token after `history`."""
    n = params.dry_penalty_last_n
    window = history if n < 0 else history[-n:]
    allowed = params.dry_allowed_length
    if window.size <= allowed:
        return
    restarts = params.dry_restarts or {}
    limit = _repeat_limit(window, restarts)
    if limit < allowed:
        return
    tokens, lengths = _extenders(window, _repeat_counts(window, limit), allowed)
    keep = np.array([() not in restarts.get(int(t), ()) for t in tokens], dtype=bool)
    tokens, lengths = tokens[keep], lengths[keep]  # a breaker of its own is never penalised
    row[tokens] -= _penalty(params, lengths - allowed).astype(row.dtype)


def _repeat_limit(window: np.ndarray, restarts: Restarts) -> int:
    """How far back a repeat may reach: to the latest breaker (its whole sequence in the
    window), else the whole window."""
    if not restarts:
        return window.size
    heads = np.nonzero(np.isin(window, np.fromiter(restarts, dtype=np.int64)))[0]
    for at in heads[::-1]:
        back = window.size - 1 - int(at)  # tokens after the head
        tails = [t for t in restarts[int(window[at])] if len(t) <= back
                 and tuple(window[at + 1:at + 1 + len(t)].tolist()) == t]
        if tails:
            return back - max(len(t) for t in tails)
    return window.size


def _repeat_counts(window: np.ndarray, limit: int) -> np.ndarray:
    """For each position j but the last: how many tokens ending at j equal those ending
    the window (capped at `limit`)."""
    last = window.size - 1
    counts = np.zeros(last, dtype=np.int64)
    alive = np.arange(last)
    for n in range(limit):
        alive = alive[(alive >= n) & (window[np.maximum(alive - n, 0)] == window[last - n])]
        if not alive.size:
            break
        counts[alive] = n + 1
    return counts


def _extenders(window: np.ndarray, counts: np.ndarray,
               allowed: int) -> tuple[np.ndarray, np.ndarray]:
    """The tokens that would extend a repeat of `allowed` tokens or more, each with the
    longest such repeat."""
    ends = np.nonzero(counts >= allowed)[0]
    tokens, lengths = window[ends + 1], counts[ends]
    order = np.lexsort((-lengths, tokens))  # by token, its longest first
    tokens, lengths = tokens[order], lengths[order]
    first = np.r_[True, tokens[1:] != tokens[:-1]] if tokens.size else np.zeros(0, bool)
    return tokens[first], lengths[first]


def _penalty(params: SamplingParams, exponents: np.ndarray) -> np.ndarray:
    base = np.float32(params.dry_base)
    if base > np.float32(1.000001):
        exponents = np.minimum(exponents, int(np.float32(_FLOAT_MAX_LOG) / np.log(base)))
    mult = float(np.float32(params.dry_multiplier))
    penalty = mult * np.power(float(base), exponents.astype(np.float64))
    # (llama.cpp's overflows to inf there: a row all -inf under a grammar would hold nothing)
    return np.minimum(penalty, np.finfo(np.float32).max).astype(np.float32)


# --- the breakers as tokens ---

def restart_sequences(pieces: Sequence[bytes], tokenize: Callable[[bytes], list[int]],
                      breakers: Sequence[str]) -> dict[int, tuple[tuple[int, ...], ...]]:
    """llama.cpp's get_overlapping_token_sequences: each token whose text holds a breaker
    (an empty tail), or ends in its start (the tail: the rest of it, tokenized)."""
    found: dict[int, list[tuple[int, ...]]] = {}
    for text in breakers:
        breaker = text.encode("utf-8")[:MAX_BREAKER_BYTES]
        for token, piece in enumerate(pieces):
            for tail in _tails(piece, breaker, tokenize):
                if tail not in found.setdefault(token, []):
                    found[token].append(tail)
    return {t: tuple(tails) for t, tails in found.items() if tails}


def _tails(piece: bytes, breaker: bytes, tokenize: Callable[[bytes], list[int]]
           ) -> list[tuple[int, ...]]:
    if not breaker or breaker in piece:
        return [()] if breaker else []
    tails, at = [], piece.find(breaker[:1])
    while at >= 0:  # the piece ends in the breaker's start (shorter than it: not held)
        if breaker.startswith(piece[at:]):
            tails.append(tuple(tokenize(breaker[len(piece) - at:])[:MAX_TAIL]))
        at = piece.find(breaker[:1], at + 1)
    return tails


_CACHE: weakref.WeakKeyDictionary[object, dict[tuple[str, ...], Restarts]] = \
    weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def with_restarts(params: SamplingParams, model: object) -> SamplingParams:
    """`params` with DRY's breakers as `model`'s tokens, where DRY is on (computed once a
    model and set of breakers: it reads every token's text)."""
    if not on(params):
        return params
    key = tuple(params.dry_sequence_breakers)
    with _LOCK:
        known = _CACHE.setdefault(model, {})
        if key not in known:
            known[key] = restart_sequences(_pieces(model), _tokenizer(model), key)
    return params.model_copy(update={"dry_restarts": known[key]})


def _pieces(model: object) -> list[bytes]:
    token_bytes = model.token_bytes  # type: ignore[attr-defined]
    return [token_bytes(t) for t in range(model.n_vocab)]  # type: ignore[attr-defined]


def _tokenizer(model: object) -> Callable[[bytes], list[int]]:
    def tokenize(text: bytes) -> list[int]:
        return model.tokenize(text.decode("utf-8", "replace"),  # type: ignore[attr-defined]
                              special=False, add_bos=False)
    return tokenize

