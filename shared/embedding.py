"""Embeddings as llama-server gives them (pure): what computes them (`Embedder`, over
llama.cpp in shared/llama/embed.py), and their normalization and base64 form."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Protocol

import numpy as np

EUCLIDEAN = 2  # llama-server's default embd_normalize
NO_NORM, MAX_ABS = -1, 0
INT16_RANGE = 32760.0  # max-abs normalization scales into an int16's range, as llama.cpp does


class Embedder(Protocol):
    """One input's embedding: one pooled vector, or with no pooling one a token."""

    n_embd: int  # a vector's length
    n_ctx: int  # the most tokens one input may have
    pooled: bool  # False: pooling none, a vector a token

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        """Rows [1, n_embd] pooled (not normalized), else [len(ids), n_embd]; call on the
        model thread."""
        ...


def normalize(vector: np.ndarray, norm: int = EUCLIDEAN) -> np.ndarray:
    """common_embd_normalize: -1 none, 0 max absolute (into int16's range), 2 euclidean,
    p > 0 the p-norm; a zero vector stays zero."""
    x = np.asarray(vector, dtype=np.float64)
    if norm == NO_NORM:
        scale = 1.0
    elif norm == MAX_ABS:
        scale = float(np.max(np.abs(x), initial=0.0)) / INT16_RANGE
    elif norm == EUCLIDEAN:
        scale = float(np.sqrt(np.sum(x * x)))
    else:
        scale = float(np.sum(np.abs(x) ** norm) ** (1.0 / norm))
    return (x * (1.0 / scale if scale > 0 else 0.0)).astype(np.float32)


def base64_floats(vector: np.ndarray) -> str:
    """A vector as OpenAI's encoding_format "base64": little-endian float32 bytes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
