"""shared's small parts: the EWMA, the LRU dict and the broadcast."""

from __future__ import annotations

import asyncio

import pytest

from shared.bounded import Lru, ewma
from shared.broadcast import Broadcast


def test_ewma_starts_at_its_first_value_and_moves_by_its_weight() -> None:
    assert ewma(None, 3.0, 0.2) == 3.0
    assert ewma(3.0, 8.0, 0.2) == pytest.approx(4.0)


def test_lru_keeps_the_most_recently_set_entries() -> None:
    kept: Lru[str, int] = Lru(2)
    kept["a"], kept["b"] = 1, 2
    kept["a"] = 3  # set again: now the newest
    kept["c"] = 4
    assert dict(kept) == {"a": 3, "c": 4}


def test_a_broadcast_wakes_every_waiter_and_times_out_without_news() -> None:
    async def body() -> tuple[list[int], int]:
        news = Broadcast()
        woken: list[int] = []

        async def waiter(i: int) -> None:
            await news.wait(lambda: news.version >= 1, timeout=30)
            woken.append(i)
        tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
        await asyncio.sleep(0)  # let them start waiting
        news.bump()
        await asyncio.gather(*tasks)
        await news.wait(lambda: news.version >= 2, timeout=0.01)  # returns at its timeout
        return sorted(woken), news.version
    assert asyncio.run(body()) == ([0, 1, 2], 1)
