"""Work on one slot's cache outside any generation (llama-server's POST /slots/ID: save to
a file, restore from one, erase), queued until no generation holds the slot and done by
the engine's loop between steps, on the model thread: the loop alone decides what each
slot holds, so a prompt is never seated by what a slot held before the work (llama-server
defers such a task too while its slot is busy).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

from shared.model import Model, Slotted
from shared.modelthread import ModelThread

T = TypeVar("T")


class SlotFile(NamedTuple):
    """A slot saved or restored: the tokens it holds, the file's bytes, the seconds taken."""

    n_tokens: int
    n_bytes: int
    seconds: float


class SlotWork:
    """The queue of slot work (event loop only)."""

    def __init__(self, thread: ModelThread) -> None:
        self._thread = thread
        self._queue: list[tuple[int, Callable[[], Any], asyncio.Future[Any]]] = []

    def __bool__(self) -> bool:
        return bool(self._queue)

    def add(self, slot: int, work: Callable[[], T]) -> asyncio.Future[T]:
        """`work` queued for slot `slot`; its result (or exception) comes in the future."""
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append((slot, work, done))
        return done

    async def run(self, busy: set[int]) -> None:
        """Do, in order, the work queued for the slots not `busy`."""
        for item in [q for q in self._queue if q[0] not in busy]:
            self._queue.remove(item)
            _, work, done = item
            if done.done():  # its caller left: nothing is done for it
                continue
            try:
                result = await self._thread.run(work)
            except Exception as exc:
                if not done.done():
                    done.set_exception(exc)
            else:
                if not done.done():
                    done.set_result(result)

    def fail(self, exc: BaseException) -> None:
        for _, _, done in self._queue:
            if not done.done():
                done.set_exception(exc)
        self._queue.clear()

    def drop(self) -> None:
        """Forget the queue (its callers' event loop has closed under them)."""
        self._queue.clear()


# --- the work itself, on the model thread ---
def save_file(model: Model, slot: int, path: str) -> SlotFile:
    """Slot `slot` to `path` as llama-server writes it (n_bytes 0: not written)."""
    t0 = time.perf_counter()
    n_bytes = cast(Slotted, model).save_slot_file(slot, path)
    return SlotFile(len(cast(Slotted, model).slot(slot).cached), n_bytes,
                    time.perf_counter() - t0)


def restore_file(model: Model, slot: int, path: str) -> SlotFile:
    """Slot `slot` holds what `path` holds; ValueError, the slot then empty, if refused."""
    t0 = time.perf_counter()
    n_bytes = cast(Slotted, model).load_slot_file(slot, path)
    return SlotFile(len(cast(Slotted, model).slot(slot).cached), n_bytes,
                    time.perf_counter() - t0)


def erase(model: Model, slot: int) -> int:
    """Slot `slot` holds nothing; how many tokens it held."""
    view = cast(Slotted, model).slot(slot)
    held = len(view.cached)
    view.truncate(0)
    return held
