"""The backs lead has heard from: when and where from each last spoke, what it drafts with,
whether it sits out, its tokens verified and accepted; the live panel's list of backs.

A back chooses its own id, so an address holds at most BACKS_PER_ADDRESS records (a new id
takes the place of its least recently seen one) and lead at most 1024.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from lead.drafts.board import BACKS_PER_ADDRESS

ACTIVE_S = 60.0  # a back heard from this recently (a hello, a post) is connected


@dataclass
class BackRecord:
    """One back as lead knows it: when and where from it last spoke, the drafter it names,
    whether it sits out, and its draft tokens verified and accepted over lead's life."""

    last_seen: float
    address: str = ""
    kind: str = ""
    drafted: int = 0
    accepted: int = 0
    sits_out: bool = False  # its last hello said idle: it drafts nothing


@dataclass
class BackRegistry:
    """The backs lead has heard from (backs seen recently, and the live panel)."""

    records: dict[str, BackRecord] = field(default_factory=dict)

    def seen(self, back_id: str, now: float, address: str = "", kind: str = "",
             sits_out: bool = False) -> bool:
        """Note a back's message (`sits_out`: a hello saying it drafts nothing for now);
        True if it was not active (new, or back after a silence)."""
        record = self.records.get(back_id)
        arrived = record is None or now - record.last_seen > ACTIVE_S
        if record is None:
            self._make_room(address)
            record = self.records[back_id] = BackRecord(now)
        record.last_seen = now
        record.address = address or record.address
        record.kind = kind or record.kind
        record.sits_out = sits_out
        return arrived

    def _make_room(self, address: str) -> None:
        """A new id from an address that has BACKS_PER_ADDRESS takes the place of its least
        recently seen one (made-up ids push out only each other), and where lead holds 1024
        backs, of the least recently seen of all."""
        mine = [k for k, r in self.records.items() if address and r.address == address]
        if len(mine) >= BACKS_PER_ADDRESS:
            del self.records[min(mine, key=lambda k: self.records[k].last_seen)]
        if len(self.records) >= 1024:  # bound memory against many ids
            del self.records[min(self.records, key=lambda k: self.records[k].last_seen)]

    def credit(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        """Add one reply's verified and accepted draft tokens per back."""
        for back_id, n in drafted.items():
            if back_id in self.records:
                self.records[back_id].drafted += n
                self.records[back_id].accepted += accepted.get(back_id, 0)

    def connected(self, now: float | None = None) -> dict[str, BackRecord]:
        now = time.monotonic() if now is None else now
        return {k: r for k, r in self.records.items() if now - r.last_seen <= ACTIVE_S}

    def active(self, now: float | None = None) -> int:
        """Backs connected, whether or not they draft."""
        return len(self.connected(now))

    def drafting(self, now: float | None = None) -> int:
        """Connected backs that draft when asked (not sitting out)."""
        return sum(1 for r in self.connected(now).values() if not r.sits_out)
