"""Small numeric and memory bounds used across lead and back: an EWMA, an LRU dict."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def ewma(old: float | None, new: float, weight: float) -> float:
    """An exponentially weighted moving average: `new` weighs `weight`; the first is itself."""
    return new if old is None else old + weight * (new - old)


class Lru(OrderedDict[K, V]):
    """A dict of at most `kept` entries: setting an entry makes it the newest, and the
    oldest goes when one more would not fit (bounds what ids chosen by clients can hold)."""

    def __init__(self, kept: int) -> None:
        super().__init__()
        self.kept = kept

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.kept:
            self.popitem(last=False)
