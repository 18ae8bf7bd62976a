"""Log-probabilities of emitted tokens (pure numpy).

A token's logprob is the log-softmax of the row that emitted it, after penalties and
bias and before temperature and truncation: what the model thinks of the token, the
same whether the token came from a draft or not, and whatever the sampling settings.
Asked for after sampling (llama-server's post_sampling_probs), they are read from the
distribution the token was drawn from instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.sampling import Dist

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat; completions allow 5


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the n most likely (id, logprob), most likely first


def token_logprob(row: np.ndarray, token_id: int, n_top: int = 0) -> TokenLogprob:
    logprobs = log_softmax(row)
    return TokenLogprob(token_id, float(logprobs[token_id]), _top(logprobs, n_top))


def sampled_logprob(dist: Dist, token_id: int, n_top: int = 0) -> TokenLogprob:
    """The token's and the n likeliest tokens' logprobs in `dist`, the distribution it was
    drawn from (after temperature and truncation: llama-server's post-sampling probs).
    Only tokens it can draw are listed; ties go to the lower id."""
    order = np.lexsort((dist.token_ids, -dist.probs))[:max(n_top, 0)]
    top = tuple((int(dist.token_ids[i]), float(np.log(dist.probs[i]))) for i in order)
    return TokenLogprob(token_id, float(np.log(dist.prob_of(token_id))), top)


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    peak = x.max()
    return x - (peak + np.log(np.exp(x - peak).sum()))


def _top(logprobs: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The n most likely ids; ties go to the lower id, so that equal rows give equal lists."""
    n = min(n, logprobs.size)
    if n <= 0:
        return ()
    part = np.argpartition(-logprobs, n - 1)[:n]
    threshold = logprobs[part].min()
    tied = np.nonzero(logprobs >= threshold)[0]  # all ties at the edge, in id order
    best = tied[np.argsort(-logprobs[tied], kind="stable")][:n]
    return tuple((int(i), float(logprobs[i])) for i in best)
