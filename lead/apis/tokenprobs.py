"""llama-server's token probabilities on its native /completion (`n_probs`; pure): each
token's `completion_probabilities` entry, its logprob and the n likeliest tokens', or with
`post_sampling_probs` their probabilities in the distribution it was drawn from (`prob`,
`top_probs`); streamed, an object a token, each with its entry, as llama-server streams.

The numbers are the engine's logprob entries (shared/logprobs.py): the end of generation
has none (its text is no part of the reply), as in lead's OpenAI logprobs.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Callable, Sequence
from typing import Any

from shared.logprobs import TokenLogprob

TokenBytes = Callable[[int], bytes]
# llama-server's logprob of a probability 0 (float's lowest): JSON has no -inf
LOWEST = -3.4028234663852886e38


def probabilities(entries: Sequence[TokenLogprob], token_bytes: TokenBytes,
                  post_sampling: bool) -> list[dict[str, Any]]:
    """`completion_probabilities`: {id, token, bytes, logprob, top_logprobs} a token, or
    {id, token, bytes, prob, top_probs} after sampling."""
    top = "top_probs" if post_sampling else "top_logprobs"
    return [{**_token(e.token_id, e.logprob, token_bytes, post_sampling),
             top: [_token(i, lp, token_bytes, post_sampling) for i, lp in e.top]}
            for e in entries]


def _token(token_id: int, logprob: float, token_bytes: TokenBytes, post_sampling: bool
           ) -> dict[str, Any]:
    data = token_bytes(token_id)
    value = {"prob": math.exp(logprob)} if post_sampling else {"logprob": max(logprob, LOWEST)}
    return {"id": token_id, "token": piece_text(data), "bytes": list(data), **value}


def piece_text(data: bytes) -> str:
    """A token's text as llama-server writes it: a character it only begins is left off
    (its bytes are in `bytes`)."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)


def token_objects(text: str, ids: Sequence[int], entries: Sequence[TokenLogprob],
                  token_bytes: TokenBytes, post_sampling: bool) -> list[dict[str, Any]]:
    """One streamed piece's objects, a token each with its entry (the end of generation's
    without: it has none). The piece's text goes on its last token's object: lead decides
    text a step at a time (stop strings held back), so no token's own is known apart."""
    pending = list(entries)
    out: list[dict[str, Any]] = []
    for k, token in enumerate(ids):
        mine = [pending.pop(0)] if pending and pending[0].token_id == token else []
        obj = {"index": 0, "content": text if k == len(ids) - 1 else "", "tokens": [token],
               "stop": False}
        if mine:
            obj["completion_probabilities"] = probabilities(mine, token_bytes, post_sampling)
        out.append(obj)
    return out or [{"index": 0, "content": text, "tokens": [], "stop": False}]
