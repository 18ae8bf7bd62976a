"""Which slot a new generation takes, and what of its prompt it finds already cached (pure).

Every slot keeps the tokens of its last generation in the KV cache. A new prompt takes the
free slot whose cache shares the longest prefix with it (a conversation's next turn finds
its own slot), and where another slot, busy or free, shares a longer prefix (a system
prompt several clients send), those cells are shared into the chosen slot instead of
evaluated again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.model import common_prefix


@dataclass(frozen=True)
class Seat:
    slot: int
    kept: int  # prompt tokens the slot's own cache already holds
    donor: int | None = None  # another slot whose cache holds more of the prompt
    shared: int = 0  # how many: share them (Slotted.share_prefix) before evaluating the rest

    @property
    def cached(self) -> int:
        """Prompt tokens found cached, one way or the other."""
        return max(self.kept, self.shared)


def choose_seat(prompt: Sequence[int], cached: Sequence[Sequence[int]], free: Sequence[int]
                ) -> Seat:
    """The seat of `prompt` among the `free` slots (at least one), `cached[i]` being what slot
    i's cache holds: the free slot sharing the longest prefix with it (ties: the one holding
    least, whose cache is the least to lose, then the lowest); where a busy slot shares a
    longer one, the free slot holding least, with that prefix shared into it."""
    if not free:
        raise ValueError("no free slot")
    prefix = [common_prefix(c, prompt) for c in cached]
    slot = min(free, key=lambda i: (-prefix[i], len(cached[i]), i))
    donor = max(range(len(cached)), key=lambda i: prefix[i])
    if prefix[donor] <= prefix[slot]:
        return Seat(slot, prefix[slot])
    slot = min(free, key=lambda i: (len(cached[i]), i))  # the least to lose
    return Seat(slot, prefix[slot], donor, prefix[donor])
