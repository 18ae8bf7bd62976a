"""Penalties and logit bias: one row of logits adjusted for the tokens before it (pure).

In llama.cpp's order: the bias is added first, then the repeat penalty (llama.cpp's:
a logit > 0 of a token in the window is divided by it, one <= 0 multiplied), then
OpenAI's frequency and presence penalties (logit -= count * frequency + presence), then
DRY (shared/dry.py). Mirostat leaves all but the bias off, as llama-server's chain does.
The repeat window is the last `repeat_last_n` tokens of the whole context, prompt
included; frequency and presence count only the reply's tokens, as OpenAI's do.

Lead adjusts every row it verifies, the back every row it drafts from, with the same
function and the same history, so that drafts, acceptance and output are those of
decoding without drafts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shared import dry
from shared.wire.protocol import SamplingParams


def active(params: SamplingParams) -> bool:
    """Whether the settings change any logit: if not, rows are used as they are."""
    return bool(params.logit_bias) or _repeat_on(params) or _openai_on(params) or \
        dry.on(params)


def adjust(row: np.ndarray, params: SamplingParams, context: Sequence[int] | np.ndarray,
           n_prompt: int) -> np.ndarray:
    """The logits of the token after `context` (of which the first `n_prompt` are the
    prompt), penalised; `row` itself, uncopied, when nothing applies."""
    if not active(params):
        return row
    out = row.copy()
    _apply(out, params, np.asarray(context, dtype=np.int64), n_prompt)
    return out


def adjust_rows(rows: np.ndarray, params: SamplingParams, context: Sequence[int],
                n_prompt: int, draft: Sequence[int]) -> np.ndarray:
    """Verification's rows: row i follows `context` + draft[:i]. `rows` itself when
    nothing applies."""
    if not active(params):
        return rows
    out = rows.copy()
    history = np.asarray([*context, *draft[: len(rows) - 1]], dtype=np.int64)
    for i in range(len(rows)):
        _apply(out[i], params, history[: len(context) + i], n_prompt)
    return out


def _repeat_on(params: SamplingParams) -> bool:
    # mirostat's chain in llama-server holds the bias alone: no penalties, no DRY
    return params.repeat_penalty != 1.0 and params.repeat_last_n != 0 and not params.mirostat


def _openai_on(params: SamplingParams) -> bool:
    return (params.frequency_penalty != 0.0 or params.presence_penalty != 0.0) and \
        not params.mirostat


def _apply(row: np.ndarray, params: SamplingParams, history: np.ndarray, n_prompt: int) -> None:
    """Adjust `row` in place."""
    if params.logit_bias:
        ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64)
        row[ids] += np.fromiter(params.logit_bias.values(), dtype=np.float64).astype(row.dtype)
    if _repeat_on(params):
        n = params.repeat_last_n
        seen = np.unique(history if n < 0 else history[-n:])
        logits = row[seen]
        row[seen] = np.where(logits <= 0, logits * params.repeat_penalty,
                             logits / params.repeat_penalty)
    if _openai_on(params):
        ids, counts = np.unique(history[n_prompt:], return_counts=True)
        row[ids] -= (counts * params.frequency_penalty + params.presence_penalty).astype(row.dtype)
    if dry.on(params):
        dry.penalize(row, params, history)
