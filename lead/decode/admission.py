"""Admission: `parallel` generations run at once; a bounded queue waits behind them, in order.

A request takes its place first (`reserve`: QueueFull at once when there is none), then
does its expensive preparation (template, tokens, grammar) while holding it, then waits for
its turn: a free running place. So a full queue is answered before any of that work is
done.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class QueueFull(Exception):
    pass


class Admission:
    def __init__(self, max_queue: int, parallel: int = 1) -> None:
        self.max_queue, self.parallel = max_queue, max(parallel, 1)
        self.waiting = 0  # places taken and not yet running: preparing, or queued
        self.running = 0
        self._turns = asyncio.Semaphore(self.parallel)  # FIFO: waiters woken in arrival order

    def reserve(self) -> Place:
        """A place: a running one, or one of max_queue behind them; QueueFull if none."""
        if self.waiting + self.running >= self.parallel + self.max_queue:
            raise QueueFull()
        self.waiting += 1
        return Place(self)


class Place:
    """One request's place in line, from `reserve` until its turn ends or it leaves."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._waiting = True

    def leave(self) -> None:
        """Give the place back if it is still waiting (idempotent; a no-op once running)."""
        if self._waiting:
            self._waiting = False
            self._admission.waiting -= 1

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait for a running place and hold it for the body; a place left is refused."""
        if not self._waiting:
            raise RuntimeError("this place was given back")
        admission = self._admission
        try:
            await admission._turns.acquire()
        finally:
            self.leave()  # running now, or cancelled while waiting: either way not waiting
        admission.running += 1
        try:
            yield
        finally:
            admission.running -= 1
            admission._turns.release()
