"""A version number that every waiter is woken at once to see pass."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class Broadcast:
    """`bump()` raises the version and wakes every waiter. Its asyncio.Event is replaced on
    each bump rather than cleared, so no waiter clears what another waits on, and a
    cancelled waiter leaves no lock held."""

    def __init__(self) -> None:
        self.version = 0
        self._event = asyncio.Event()

    def bump(self) -> int:
        self.version += 1
        event, self._event = self._event, asyncio.Event()
        event.set()
        return self.version

    async def wait(self, done: Callable[[], bool], timeout: float) -> None:
        """Return once `done()` holds (looked at after each bump), or at timeout."""
        deadline = time.monotonic() + timeout
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that lands as its event is set.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._event.wait()
