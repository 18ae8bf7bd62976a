"""What one back, or one client address, may send lead: draft posts per second, and how
many backs' worth; how many links it may hold open (pure, on lead's clock).

A back chooses its own id and could take a new one for every post, so the bounds that
matter are per address.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lead.drafts.board import BACKS_PER_ADDRESS
from shared.bounded import Lru

LINKS_PER_ADDRESS = 8  # links open at once from one address: a few backs' worth


@dataclass
class RateLimiter:
    """Token bucket per client: `rate` posts per second, bursts up to one second's worth
    (or one post, where a second's worth is less: a bucket capped below one never admits)."""

    rate: float
    buckets: Lru[str, tuple[float, float]] = field(  # tokens, time
        default_factory=lambda: Lru(1024))
    clock: Callable[[], float] = time.monotonic  # tests give a fake one

    def allow(self, client: str, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        cap = max(self.rate, 1.0)
        tokens, last = self.buckets.get(client, (cap, now))
        tokens = min(cap, tokens + (now - last) * self.rate)
        allowed = tokens >= 1.0
        self.buckets[client] = (tokens - 1.0 if allowed else tokens, now)  # 1024 kept
        return allowed


class PostLimiter:
    """Draft posts: `rate` per second per back, and BACKS_PER_ADDRESS backs' worth per
    address (a back chooses its own id)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_back = RateLimiter(rate, clock=clock)
        self.per_address = RateLimiter(rate * BACKS_PER_ADDRESS, clock=clock)

    def allow(self, address: str, back_id: str, now: float | None = None) -> bool:
        return self.per_back.allow(f"{address}/{back_id}", now) and \
            self.per_address.allow(address, now)


class LinkSlots:
    """Links open per client address, LINKS_PER_ADDRESS at most: a back keeps one open,
    and an address opening many would hold as many of lead's senders."""

    def __init__(self) -> None:
        self.open: dict[str, int] = {}

    def take(self, address: str) -> bool:
        n = self.open.get(address, 0)
        if n >= LINKS_PER_ADDRESS:
            return False
        self.open[address] = n + 1
        return True

    def give(self, address: str) -> None:
        n = self.open.pop(address, 0) - 1
        if n > 0:
            self.open[address] = n
