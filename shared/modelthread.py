"""The one thread a process runs its model calls on.

llama.cpp's CPU backend keeps an OpenMP thread pool per calling thread. A second
calling thread makes a second pool, and once libgomp manages more threads than there
are cores, its barriers stop spinning and sleep between the graph's operations: a
decode on all cores ran at 0.7x (see docs/placement.md). So every evaluation a
process makes, warm-up and calibration included, goes through one ModelThread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Threads:
    """A pool of worker threads made on demand, so that an app survives a lifespan restart
    (shutdown() ends the pool; the next call makes another)."""

    def __init__(self, name: str, n: int = 1) -> None:
        self.name, self.n = name, n
        self._executor: ThreadPoolExecutor | None = None

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.n, thread_name_prefix=self.name)
        return self._executor

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on the model thread and wait for it (for blocking callers)."""
        return self._pool().submit(fn, *args).result()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on the model thread without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool(), fn, *args)

    def shutdown(self, wait: bool = True) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=True)
            self._executor = None


class ModelThread(Threads):
    def __init__(self, name: str = "model") -> None:
        super().__init__(name, 1)
