"""Pure sampling over logits (numpy): temperature, top-k, top-p, min-p, seeded draws.

A distribution is sparse: `Dist(token_ids, probs)`, the exact truncated
distribution a token is drawn from. Greedy (temperature 0) is the one-point
distribution on the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.protocol import SamplingParams

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


def distribution(logits: np.ndarray, params: SamplingParams, max_support: int = 0) -> Dist:
    """The exact distribution the settings sample from; `max_support` adds a top-k cap."""
    if is_greedy(params):
        return Dist(np.array([greedy(logits)]), np.array([1.0]))
    top_k = params.top_k
    if max_support and (top_k == 0 or top_k > max_support):
        top_k = max_support
    ids = _top_candidates(logits, top_k, params.top_p, params.temperature)
    probs = _softmax(logits[ids].astype(np.float64) / params.temperature)
    # tokens of probability 0 (masked by a grammar, or underflowed) are no part of it
    keep = _nucleus(probs, params.top_p) & (probs >= params.min_p * probs[0]) & (probs > 0)
    return Dist(ids[keep], probs[keep] / probs[keep].sum())


def _top_candidates(logits: np.ndarray, top_k: int, top_p: float,
                    temperature: float) -> np.ndarray:
    """Ids sorted by descending logit: all of top-k, or enough to hold top-p's mass."""
    n = logits.shape[0]
    window = top_k if 0 < top_k < n else (_TOP_P_WINDOW if top_p < 1.0 else n)
    if window < n:
        part = np.argpartition(-logits, window - 1)[:window]
        ids = part[np.argsort(-logits[part], kind="stable")]
        if top_k or _mass(logits / temperature, ids) >= top_p:
            return ids
    return np.argsort(-logits, kind="stable")


def _mass(logits: np.ndarray, ids: np.ndarray) -> float:
    """Share of the full softmax (of already temperature-scaled logits) held by `ids`."""
    shifted = logits.astype(np.float64) - float(logits[ids[0]])
    return float(np.exp(shifted[ids]).sum() / np.exp(shifted).sum())


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _nucleus(sorted_probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest prefix whose mass reaches top_p (always at least one)."""
    if top_p >= 1.0:
        return np.ones(sorted_probs.shape, dtype=bool)
    before = np.cumsum(sorted_probs) - sorted_probs
    return before < top_p


def sample(dist: Dist, rng: np.random.Generator) -> int:
    if dist.token_ids.size == 1:
        return int(dist.token_ids[0])
    return int(dist.token_ids[_draw(dist.probs, rng)])


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw; one uniform per draw keeps seeded runs reproducible."""
    cdf = np.cumsum(probs)
    index = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(index, probs.size - 1)
