"""Draft bookkeeping: candidates posted by backs, checked against lead's tokens.

A candidate is (start, token_ids): token_ids[0] is proposed for position `start`
of the session's token sequence. It is useful while it agrees with every token
lead already has in [start, n) and reaches past n; the useful part is its tail
from n on. One candidate is kept per back (each post replaces that back's last).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.sampling import Dist


@dataclass(frozen=True)
class Candidate:
    back_id: str
    start: int
    token_ids: tuple[int, ...]
    dists: tuple[Dist, ...] | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class Draft:
    """The useful tail of a candidate: what the next verify step can check."""

    back_id: str
    token_ids: list[int]
    dists: list[Dist] | None


def agrees(tokens: Sequence[int], candidate: Candidate) -> bool:
    """True if the candidate matches lead's tokens wherever both have one and reaches past them."""
    n = len(tokens)
    if candidate.start > n or candidate.end <= n:
        return False
    overlap = n - candidate.start
    return list(tokens[candidate.start:n]) == list(candidate.token_ids[:overlap])


def useful_tail(tokens: Sequence[int], candidate: Candidate, limit: int) -> Draft:
    skip = len(tokens) - candidate.start
    ids = list(candidate.token_ids[skip:skip + limit])
    dists = list(candidate.dists[skip:skip + len(ids)]) if candidate.dists else None
    return Draft(candidate.back_id, ids, dists)


@dataclass
class DraftBoard:
    """Candidates of the current session, one per back; counts what it drops."""

    max_backs: int = 16
    candidates: dict[str, Candidate] = field(default_factory=dict)
    stale: int = 0

    def post(self, tokens: Sequence[int], candidate: Candidate) -> bool:
        if not agrees(tokens, candidate):
            self.stale += 1
            return False
        if candidate.back_id not in self.candidates and len(self.candidates) >= self.max_backs:
            self.stale += 1
            return False
        self.candidates[candidate.back_id] = candidate
        return True

    def best(self, tokens: Sequence[int], limit: int) -> Draft | None:
        """The agreeing candidate that reaches furthest; stale ones are dropped."""
        live = {k: c for k, c in self.candidates.items() if agrees(tokens, c)}
        self.candidates = live
        if limit <= 0 or not live:
            return None
        furthest = max(live.values(), key=lambda c: c.end)
        return useful_tail(tokens, furthest, limit)

    def clear(self) -> None:
        self.candidates.clear()


ACTIVE_S = 60.0  # a back heard from this recently is connected (its polls last <= 30 s)


@dataclass
class BackRecord:
    """One back as lead knows it: when and where from it last spoke, the drafter it names,
    whether it sits out, and its draft tokens verified and accepted over lead's life."""

    last_seen: float
    address: str = ""
    kind: str = ""
    drafted: int = 0
    accepted: int = 0
    sits_out: bool = False  # its last request was a poll with idle=1: it drafts nothing


@dataclass
class BackRegistry:
    """The backs lead has heard from (backs seen recently, and the live panel)."""

    records: dict[str, BackRecord] = field(default_factory=dict)

    def seen(self, back_id: str, now: float | None = None, address: str = "",
             kind: str = "", window_s: float = ACTIVE_S, sits_out: bool = False) -> bool:
        """Note a back's request (`sits_out`: a poll saying it drafts nothing for now);
        True if it was not active (new, or back after a silence)."""
        now = time.monotonic() if now is None else now
        record = self.records.get(back_id)
        arrived = record is None or now - record.last_seen > window_s
        if record is None:
            record = self.records[back_id] = BackRecord(now)
            self._bound()
        record.last_seen = now
        record.address = address or record.address
        record.kind = kind or record.kind
        record.sits_out = sits_out
        return arrived

    def _bound(self) -> None:
        if len(self.records) > 1024:  # bound memory against many ids
            oldest = min(self.records, key=lambda k: self.records[k].last_seen)
            del self.records[oldest]

    def credit(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        """Add one reply's verified and accepted draft tokens per back."""
        for back_id, n in drafted.items():
            if back_id in self.records:
                self.records[back_id].drafted += n
                self.records[back_id].accepted += accepted.get(back_id, 0)

    def connected(self, window_s: float = ACTIVE_S, now: float | None = None
                  ) -> dict[str, BackRecord]:
        now = time.monotonic() if now is None else now
        return {k: r for k, r in self.records.items() if now - r.last_seen <= window_s}

    def active(self, window_s: float = ACTIVE_S, now: float | None = None) -> int:
        """Backs connected, whether or not they draft."""
        return len(self.connected(window_s, now))

    def drafting(self, window_s: float = ACTIVE_S, now: float | None = None) -> int:
        """Connected backs that draft when asked (not sitting out)."""
        return sum(1 for r in self.connected(window_s, now).values() if not r.sits_out)


@dataclass
class RateLimiter:
    """Token bucket per client: `rate` posts per second, bursts up to one second's worth
    (or one post, where a second's worth is less: a bucket capped below one never admits)."""

    rate: float
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # tokens, time

    def allow(self, client: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        cap = max(self.rate, 1.0)
        tokens, last = self.buckets.pop(client, (cap, now))  # re-added last: LRU order
        tokens = min(cap, tokens + (now - last) * self.rate)
        allowed = tokens >= 1.0
        self.buckets[client] = (tokens - 1.0 if allowed else tokens, now)
        if len(self.buckets) > 1024:  # bound memory against many clients
            self.buckets.pop(next(iter(self.buckets)))
        return allowed


BACKS_PER_ADDRESS = 4


class PostLimiter:
    """Draft posts: `rate` per second per back, and BACKS_PER_ADDRESS backs' worth per
    address, since a back chooses its own id and could take a new one for every post."""

    def __init__(self, rate: float) -> None:
        self.per_back = RateLimiter(rate)
        self.per_address = RateLimiter(rate * BACKS_PER_ADDRESS)

    def allow(self, address: str, back_id: str, now: float | None = None) -> bool:
        return self.per_back.allow(f"{address}/{back_id}", now) and \
            self.per_address.allow(address, now)
