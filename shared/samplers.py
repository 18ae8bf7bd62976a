"""llama.cpp's truncating samplers and mirostat as pure functions (numpy), each as its
src/llama-sampling.cpp has it: typical, top-p, min-p and XTC (with their `min_keep`),
mirostat and mirostat 2.0. tests/test_llama_samplers.py holds each against llama.cpp's
own, through the bindings.

Each takes `x`, the logits of the candidates in descending order (float64, finite), and
says which it keeps: a count (the first n), a start (those from it on), or positions.
Nothing here draws: XTC is handed its uniform (`coin`), mirostat its `mu`, and the caller
samples, so that lead draws each position's numbers in one order with or without drafts.
"""

from __future__ import annotations

import math

import numpy as np

MIROSTAT_M = 100  # the tokens mirostat 1.0 estimates its exponent from (llama-server's)
_INT_LIMIT = 2**31  # mirostat's k as a C int: a k past it or NaN keeps one token there


def logsumexp(x: np.ndarray) -> float:
    top = float(x.max())
    return top + math.log(float(np.exp(x - top).sum()))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def typical(x: np.ndarray, p: float, min_keep: int) -> np.ndarray | None:
    """The positions kept (ascending), or None where it keeps all: the tokens whose
    surprise is nearest the entropy, until their mass passes p."""
    if p >= 1.0:
        return None
    logp = x - logsumexp(x)
    probs = np.exp(logp)
    entropy = -float((probs * logp).sum())
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    over = np.cumsum(probs[order]) > p
    over[:max(min_keep - 1, 0)] = False
    if not over.any():
        return None
    return np.sort(order[:int(np.argmax(over)) + 1])


def top_p(x: np.ndarray, lse: float, p: float, min_keep: int) -> int:
    """How many to keep: up to the first whose running mass reaches p (and min_keep);
    `lse`: log-sum-exp over the whole candidate set (`x` may be only its head)."""
    if p >= 1.0:
        return x.size
    reached = np.cumsum(np.exp(x - lse)) >= p
    reached[:max(min_keep - 1, 0)] = False
    return int(np.argmax(reached)) + 1 if reached.any() else x.size


def min_p(x: np.ndarray, p: float, min_keep: int) -> int:
    """How many to keep: those within log(p) of the best logit, at least min_keep."""
    if p <= 0.0 or not x.size:
        return x.size
    above = int(np.count_nonzero(x >= x[0] + math.log(p)))
    return min(max(above, min_keep, 1), x.size)


def xtc(x: np.ndarray, coin: float | None, probability: float, threshold: float,
        min_keep: int) -> int:
    """Where the kept tokens start: with chance `probability` (coin <= it), every token at
    or above `threshold` but the least likely of them is excluded."""
    if coin is None or probability <= 0.0 or threshold > 0.5 or x.size < 2 \
            or coin > probability:
        return 0
    above = softmax(x) >= threshold
    leading = x.size if above.all() else int(np.argmin(above))
    last = max(leading - 1, 0)  # the least likely token above the threshold stays
    return last if x.size - last >= min_keep and last > 0 else 0


def mirostat_k(x: np.ndarray, mu: float, n_vocab: int) -> int:
    """Mirostat 1.0's top-k from `x` (the candidates' logits over temperature): Zipf's
    exponent estimated from the first MIROSTAT_M, and the k that surprise mu asks for."""
    n = min(MIROSTAT_M - 1, x.size - 1)
    t = np.log(np.arange(2, n + 2) / np.arange(1, n + 1))
    with np.errstate(all="ignore"):  # (flat logits: s_hat 0, k infinite, as in llama.cpp)
        s_hat = (t * (x[:n] - x[1:n + 1])).sum() / (t * t).sum() if n > 0 else np.float64("nan")
        eps = s_hat - 1.0
        k = np.power(eps * np.exp2(mu) / (1.0 - np.power(float(n_vocab), -eps)), 1 / s_hat)
    return max(int(k), 1) if np.isfinite(k) and k < _INT_LIMIT else 1


def mirostat_v2(x: np.ndarray, mu: float) -> int:
    """How many mirostat 2.0 keeps: those whose surprise (bits) is at most mu, at least
    one (`x` in any order: the count is the same)."""
    surprise = -(x - logsumexp(x)) / math.log(2.0)
    return max(int(np.count_nonzero(surprise <= mu)), 1)


def next_mu(mu: float, tau: float, eta: float, p_token: float) -> float:
    """Mirostat's mu after a token drawn with probability p_token (after its truncation)."""
    return mu - eta * (-math.log2(p_token) - tau)
