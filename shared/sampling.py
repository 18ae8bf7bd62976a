"""Pure sampling over logits (numpy): llama-server's chain of samplers, seeded draws.

A distribution is sparse: `Dist(token_ids, probs)`, the exact truncated
distribution a token is drawn from. Greedy (temperature 0) is the one-point
distribution on the argmax (on the best token left, where typical or XTC leave it out).
The samplers themselves, llama.cpp's, are shared/samplers.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared import samplers
from shared.wire.protocol import SamplingParams

# Candidates examined before falling back to a full sort for top-p: argpartition
# on 150k logits is ~10x cheaper than argsort, and exact whenever these hold the mass.
_TOP_P_WINDOW = 1024
MIN_TEMPERATURE = 1e-4  # lower temperatures are greedy
_DRAFT_STREAM = 0xB4C  # a second key beside the seed: the back's own stream


@dataclass(frozen=True)
class Dist:
    token_ids: np.ndarray  # int64 [m], distinct ids
    probs: np.ndarray  # float64 [m], sums to 1

    def prob_of(self, token_id: int) -> float:
        hit = np.nonzero(self.token_ids == token_id)[0]
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def dense(self, n_vocab: int) -> np.ndarray:
        out = np.zeros(n_vocab, dtype=np.float64)
        out[self.token_ids] = self.probs
        return out


def make_rng(seed: int | None) -> np.random.Generator:
    """A generator for a request's seed; any integer is valid (OpenAI allows negatives)."""
    return np.random.default_rng(None if seed is None else seed % 2**64)


def make_draft_rng(seed: int | None) -> np.random.Generator:
    """The back's generator for a request's seed: a stream apart from lead's. Drawn from
    lead's own stream, a draft token and the uniform that accepts it would be the same
    number, and rejection sampling would stop being exact."""
    return np.random.default_rng(None if seed is None else [seed % 2**64, _DRAFT_STREAM])


def is_greedy(params: SamplingParams) -> bool:
    # Below this, sampling is argmax in all but name, and logits / T would overflow
    # (a subnormal temperature turned them into inf and the probabilities into NaN).
    return params.temperature < MIN_TEMPERATURE


def greedy(logits: np.ndarray) -> int:
    return int(np.argmax(logits))


def distribution(logits: np.ndarray, params: SamplingParams, max_support: int = 0,
                 coin: float | None = None, mu: float | None = None) -> Dist:
    """The exact distribution the settings sample from; `max_support` adds a top-k cap.

    In llama-server's default order (common/sampling.cpp's chain, after the penalties and
    DRY of shared/penalties.py): top-k, typical, top-p, min-p, XTC, temperature. Mirostat
    (1 or 2) takes the place of all of them: temperature, then mirostat. `coin`: the
    uniform XTC's chance is drawn against (None: XTC is off); `mu`: mirostat's state
    (None: its start, 2 tau)."""
    if params.mirostat:
        return _mirostat(logits, params, mu, max_support)
    if is_greedy(params) and not drops_best(params):
        return _one(greedy(logits))
    top_k = params.top_k
    if max_support and (top_k == 0 or top_k > max_support):
        top_k = max_support
    ids, x = _truncated(logits, *_top_candidates(logits, top_k, params), params, coin)
    if is_greedy(params):
        return _one(int(ids[0]))
    probs = samplers.softmax(x / params.temperature)
    keep = probs > 0  # (underflowed: no part of it)
    return Dist(ids[keep], probs[keep] / probs[keep].sum())


def xtc_draws(params: SamplingParams) -> bool:
    """Whether XTC draws a uniform at each position (one, before the token's)."""
    return params.xtc_probability > 0.0 and params.xtc_threshold <= 0.5 and not params.mirostat


def drops_best(params: SamplingParams) -> bool:
    """Typical and XTC may leave out the likeliest token, so greedy picks among what they
    leave (llama.cpp's temperature 0 keeps the best token left)."""
    return params.typical_p < 1.0 or xtc_draws(params)


def _one(token: int) -> Dist:
    return Dist(np.array([token]), np.array([1.0]))


def _top_candidates(logits: np.ndarray, top_k: int,
                    params: SamplingParams) -> tuple[np.ndarray, float]:
    """Ids of finite logits, sorted by descending logit: all of top-k, or enough to hold
    top-p's mass; and the log-sum-exp over the whole candidate set (the vocabulary, or
    top-k)."""
    n = logits.shape[0]
    window = top_k if 0 < top_k < n else _TOP_P_WINDOW if _windowed(params) else n
    if window < n:
        ids = _head(logits, window)
        lse = samplers.logsumexp(logits[ids].astype(np.float64)) if top_k else _lse(logits)
        if top_k or _mass(logits, ids, lse) >= params.top_p:
            return ids, lse
    ids = np.argsort(-logits, kind="stable")
    ids = ids[np.isfinite(logits[ids])]  # (a grammar's mask: no part of it)
    return ids, samplers.logsumexp(logits[ids].astype(np.float64))


def _windowed(params: SamplingParams) -> bool:
    """Whether top-p may look at the likeliest _TOP_P_WINDOW alone: typical needs all."""
    return params.top_p < 1.0 and params.typical_p >= 1.0 and params.min_keep <= _TOP_P_WINDOW


def _head(logits: np.ndarray, k: int) -> np.ndarray:
    part = np.argpartition(-logits, k - 1)[:k]
    ids = part[np.argsort(-logits[part], kind="stable")]
    return ids[np.isfinite(logits[ids])]


def _lse(logits: np.ndarray) -> float:
    finite = logits[np.isfinite(logits)]
    return samplers.logsumexp(finite.astype(np.float64))


def _mass(logits: np.ndarray, ids: np.ndarray, lse: float) -> float:
    """Share of the whole softmax held by `ids`."""
    return float(np.exp(logits[ids].astype(np.float64) - lse).sum())


def _truncated(logits: np.ndarray, ids: np.ndarray, lse: float, params: SamplingParams,
               coin: float | None) -> tuple[np.ndarray, np.ndarray]:
    """The candidates typical, top-p, min-p and XTC leave, in order, with their logits."""
    x = logits[ids].astype(np.float64)
    kept = samplers.typical(x, params.typical_p, params.min_keep)
    if kept is not None:
        ids, x = ids[kept], x[kept]
        lse = samplers.logsumexp(x)
    n = samplers.top_p(x, lse, params.top_p, params.min_keep)
    n = samplers.min_p(x[:n], params.min_p, params.min_keep)
    start = samplers.xtc(x[:n], coin, params.xtc_probability, params.xtc_threshold,
                         params.min_keep)
    return ids[start:n], x[start:n]


def _mirostat(logits: np.ndarray, params: SamplingParams, mu: float | None,
              max_support: int) -> Dist:
    """Temperature, then mirostat's truncation (1.0: a top-k; 2.0: surprise at most mu)."""
    if is_greedy(params):
        return _one(greedy(logits))
    mu = 2.0 * params.mirostat_tau if mu is None else mu
    x = logits.astype(np.float64) / params.temperature
    if params.mirostat == 1:
        head = _head(x, min(samplers.MIROSTAT_M, x.size))
        n = samplers.mirostat_k(x[head], mu, x.size)
    else:
        n = samplers.mirostat_v2(x, mu)
    ids = _head(x, min(n, max_support or n, x.size))
    probs = samplers.softmax(x[ids])
    return Dist(ids[probs > 0], probs[probs > 0])  # (underflowed: no part of it)


def mirostat_mu(mu: float | None, params: SamplingParams, p_token: float) -> float:
    """Mirostat's state after a token its distribution gave probability p_token."""
    mu = 2.0 * params.mirostat_tau if mu is None else mu
    return samplers.next_mu(mu, params.mirostat_tau, params.mirostat_eta, p_token)


def sample(dist: Dist, rng: np.random.Generator) -> int:
    if dist.token_ids.size == 1:
        return int(dist.token_ids[0])
    return int(dist.token_ids[_draw(dist.probs, rng)])


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw; one uniform per draw keeps seeded runs reproducible."""
    cdf = np.cumsum(probs)
    index = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(index, probs.size - 1)
