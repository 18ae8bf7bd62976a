"""Admission: one generation runs at a time; a bounded queue waits behind it, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class QueueFull(Exception):
    pass


class Admission:
    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self.waiting = 0
        self._lock = asyncio.Lock()  # FIFO: waiters are woken in arrival order

    @property
    def running(self) -> bool:
        return self._lock.locked()

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold the one running slot for the body; QueueFull at once if the queue is full."""
        if self._lock.locked() and self.waiting >= self.max_queue:
            raise QueueFull()
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self._lock.release()
