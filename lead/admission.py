"""Admission: one generation runs at a time; a bounded queue waits behind it, in order.

A request takes its place first (`reserve`: QueueFull at once when there is none), then
does its expensive preparation (template, tokens, grammar) while holding it, then waits for
its turn. So a full queue is answered before any of that work is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class QueueFull(Exception):
    pass


class Admission:
    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self.waiting = 0  # places taken and not yet running: preparing, or queued
        self._lock = asyncio.Lock()  # FIFO: waiters are woken in arrival order

    @property
    def running(self) -> bool:
        return self._lock.locked()

    def reserve(self) -> Place:
        """A place: the running slot, or one of max_queue behind it; QueueFull if none."""
        if self.waiting + self.running > self.max_queue:
            raise QueueFull()
        self.waiting += 1
        return Place(self)

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Reserve a place and hold the running slot for the body (QueueFull at once)."""
        place = self.reserve()
        try:
            async with place.turn():
                yield
        finally:
            place.leave()


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
        """Wait for the running slot and hold it for the body; a place left is refused."""
        if not self._waiting:
            raise RuntimeError("this place was given back")
        lock = self._admission._lock
        try:
            await lock.acquire()
        finally:
            self.leave()  # running now, or cancelled while waiting: either way not waiting
        try:
            yield
        finally:
            lock.release()
