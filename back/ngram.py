"""Prompt-lookup drafting: propose what followed the longest earlier match of the context's tail.

Pure over token ids. Good for edits and summaries whose output copies the input.
"""

from __future__ import annotations

from collections.abc import Sequence


def ngram_draft(tokens: Sequence[int], n_max: int, k: int, n_min: int = 1) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest
    suffix (n_max down to n_min tokens) of `tokens`; [] when nothing matches."""
    if k <= 0:
        return []
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        start = _last_match(tokens, n)
        if start is not None:
            return list(tokens[start + n: start + n + k])
    return []


def _last_match(tokens: Sequence[int], n: int) -> int | None:
    """Start of the latest earlier occurrence of the last n tokens that has a continuation."""
    tail = list(tokens[-n:])
    for start in range(len(tokens) - n - 1, -1, -1):
        if tokens[start] == tail[0] and list(tokens[start:start + n]) == tail:
            return start
    return None
