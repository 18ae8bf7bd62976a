"""Which slot a new generation takes, and what of its prompt it finds already cached (pure).

Every slot keeps the tokens of its last generation in the KV cache. A new prompt takes the
free slot whose cache shares the longest prefix with it (a conversation's next turn finds
its own slot), and where another slot, busy or free, shares a longer prefix (a system
prompt several clients send), those cells are shared into the chosen slot instead of
evaluated again; where cells saved to host memory hold a longer one still
(lead/decode/promptcache.py), they are loaded into it.
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
    restored: int = 0  # how many the host memory's best entry holds: load it instead

    @property
    def cached(self) -> int:
        """Prompt tokens found cached, one way or another."""
        return max(self.kept, self.shared, self.restored)

    @property
    def keeps(self) -> int:
        """How much of what the slot held stays in it."""
        return self.kept if self.donor is None and not self.restored else 0


def choose_seat(prompt: Sequence[int], cached: Sequence[Sequence[int]], free: Sequence[int],
                stored: int = 0) -> Seat:
    """The seat of `prompt` among the `free` slots (at least one), `cached[i]` being what slot
    i's cache holds and `stored` the prefix host memory holds. Ties go to the slot holding
    least (the least to lose), then the lowest; a prefix shared from another slot goes to the
    free slot holding least. (Not an empty slot where one holds something of the prompt:
    every cell in use is attended over, and idle slots' cells cost a step 2-3 %; what the
    slot held goes to host memory.) No free slot: ValueError, from `min`."""
    prefix = [common_prefix(c, prompt) for c in cached]
    slot = min(free, key=lambda i: (-prefix[i], len(cached[i]), i))
    donor = max(range(len(cached)), key=lambda i: prefix[i])
    if max(prefix[donor], stored) <= prefix[slot]:
        return Seat(slot, prefix[slot])
    if stored > prefix[donor]:
        return Seat(slot, prefix[slot], restored=stored)
    slot = min(free, key=lambda i: (len(cached[i]), i))  # the least to lose
    return Seat(slot, prefix[slot], donor, prefix[donor])
