"""Draft bookkeeping: candidates posted by backs, checked against lead's tokens.

A candidate is (start, token_ids): token_ids[0] is proposed for position `start`
of the session's token sequence. It is useful while it agrees with every token
lead already has in [start, n) and reaches past n; the useful part is its tail
from n on. A back's post is its main chain and its branches, each kept as a
candidate over the session's positions (the main chain's prefix, then the branch);
a post replaces all of that back's candidates.

A branch's root is the draft's next likeliest token, chosen, not sampled: verified as
a draft token with its q, it would bias sampling. So a branch is offered only once lead
has emitted its root itself (after rejecting the main chain there), and its useful tail
starts after the root.

A back chooses its own id, so the board keys a back by its id and address, holds at most
BACKS_PER_ADDRESS backs per address, and ranks them by their own measured acceptance
(lead/backrank.py), not by how far they reach: made-up ids cannot fill it, nor long junk
win it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from lead.backrank import BackScores, expected_yield
from lead.owndrafts import OWN
from shared.sampling import Dist

BACKS_PER_ADDRESS = 4  # backs' worth of posts, board places and registry records per address


def poster(back_id: str, address: str) -> str:
    """A back as the board knows it: its id, and its address where known (another address
    posting under the same id is another back, and cannot replace its drafts)."""
    return f"{back_id}@{address}" if address else back_id


@dataclass(frozen=True)
class Candidate:
    back_id: str
    start: int
    token_ids: tuple[int, ...]
    dists: tuple[Dist, ...] | None = None
    root: int | None = None  # a branch: the index of its root in token_ids; None: a main chain
    address: str = ""  # where it was posted from ("": by lead's own code)
    odds: tuple[float, ...] | None = None  # per token, that lead accepts it (lead's own drafts)
    probs: tuple[float, ...] | None = None  # per token, the draft model's probability (a back's)

    @property
    def poster(self) -> str:
        return poster(self.back_id, self.address)

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)

    @property
    def opens(self) -> int:
        """How many tokens lead must hold before this candidate may be verified."""
        return self.start if self.root is None else self.start + self.root + 1


@dataclass(frozen=True)
class Branch:
    """A post's branch as lead reads it: `token_ids` in place of the main chain's from
    index `at` on (token_ids[0], the root, differs from the main chain's token there)."""

    at: int
    token_ids: tuple[int, ...]
    dists: tuple[Dist, ...] | None = None


@dataclass(frozen=True)
class Draft:
    """The useful tail of a candidate: what the next verify step can check; with the
    branches of its post that fork off it (`at` counted from its first token), which a
    step may verify beside it (a tree)."""

    back_id: str
    token_ids: list[int]
    dists: list[Dist] | None
    branch: bool = False  # it came from a branch: lead emitted the branch's root
    branches: tuple[Branch, ...] = ()
    roots: tuple[tuple[int, int], ...] = ()  # (at, root) of every branch offered with it
    odds: list[float] | None = None  # per token, that lead accepts it given the ones before

    @property
    def n_tokens(self) -> int:
        """Draft tokens to evaluate: its own and its branches'."""
        return len(self.token_ids) + sum(len(b.token_ids) for b in self.branches)


def post_candidates(back_id: str, start: int, main: Sequence[int],
                    main_dists: Sequence[Dist] | None, branches: Sequence[Branch] = (),
                    address: str = "", probs: Sequence[float] | None = None
                    ) -> list[Candidate]:
    """The candidates of one post: its main chain, then each branch spelled out over the
    session's positions (the main chain's prefix, then the branch)."""
    out = [Candidate(back_id, start, tuple(main), tuple(main_dists) if main_dists else None,
                     address=address, probs=tuple(probs) if probs else None)]
    for b in branches:
        dists = (*main_dists[:b.at], *b.dists) if main_dists and b.dists else None
        out.append(Candidate(back_id, start, (*main[:b.at], *b.token_ids), dists, root=b.at,
                             address=address))
    return out


def consistent(tokens: Sequence[int], candidate: Candidate) -> bool:
    """True if the candidate matches lead's tokens wherever both have one and reaches past
    them: it may still be verified (a branch, once lead emits its root)."""
    n = len(tokens)
    if candidate.start > n or candidate.end <= n:
        return False
    overlap = n - candidate.start
    return list(tokens[candidate.start:n]) == list(candidate.token_ids[:overlap])


def useful_tail(tokens: Sequence[int], candidate: Candidate, limit: int) -> Draft:
    skip = len(tokens) - candidate.start
    ids = list(candidate.token_ids[skip:skip + limit])
    dists = list(candidate.dists[skip:skip + len(ids)]) if candidate.dists else None
    odds = list(candidate.odds[skip:skip + len(ids)]) if candidate.odds else None
    return Draft(candidate.back_id, ids, dists, branch=candidate.root is not None, odds=odds)


def odds_yield(odds: Sequence[float]) -> float:
    """Draft tokens a step verifying all of them is expected to accept, token i right
    with odds[i] given the ones before it."""
    total, reach = 0.0, 1.0
    for p in odds:
        reach *= p
        total += reach
    return total


def forks(tokens: Sequence[int], main: Candidate, kept: Sequence[Candidate], limit: int
          ) -> tuple[Branch, ...]:
    """The branches among `kept` that fork off main's useful tail within its first `limit`
    tokens, `at` counted from that tail's first token."""
    n, out = len(tokens), []
    for c in kept:
        at = c.start + (c.root or 0) - n
        if c.root is None or c.start != main.start or not 0 <= at < limit \
                or c.token_ids[:c.root] != main.token_ids[:c.root]:
            continue
        out.append(Branch(at, c.token_ids[c.root:], c.dists[c.root:] if c.dists else None))
    return tuple(out)


@dataclass
class DraftBoard:
    """Candidates of the current session, a main chain and its branches per back (keyed by
    `Candidate.poster`); counts the posts it drops; each back's acceptance (`scores`)."""

    max_backs: int = 16
    per_address: int = BACKS_PER_ADDRESS
    candidates: dict[str, list[Candidate]] = field(default_factory=dict)
    stale: int = 0
    scores: BackScores = field(default_factory=BackScores)

    def post(self, tokens: Sequence[int], candidate: Candidate,
             branches: Sequence[Candidate] = ()) -> bool:
        """Replace the back's candidates with this post's; False (and counted stale) if
        none of them can still be verified, or a new back finds no place."""
        key = candidate.poster
        kept = [c for c in (candidate, *branches) if consistent(tokens, c)]
        if not kept or (key not in self.candidates and (
                len(self.candidates) >= self.max_backs
                or self.address_full(tokens, candidate.address, candidate.back_id))):
            self.stale += 1
            return False
        self.candidates[key] = kept
        return True

    def address_full(self, tokens: Sequence[int], address: str, back_id: str) -> bool:
        """Whether a back new to the board finds its address's places all taken by backs
        whose drafts lead may still verify (lead's own posts, address '', are not capped)."""
        if not address or poster(back_id, address) in self.candidates:
            return False
        held = sum(1 for kept in self.candidates.values() if kept[0].address == address
                   and any(consistent(tokens, c) for c in kept))
        return held >= self.per_address

    def best(self, tokens: Sequence[int], limit: int) -> Draft | None:
        """The useful tail of the candidate expected to yield the most accepted tokens at
        its back's own acceptance (ties: the one reaching furthest, then a main chain);
        candidates that can no longer be verified are dropped. What each back offers is
        scored against the tokens lead holds at the next call."""
        self.scores.settle(tokens)
        self._drop_stale(tokens)  # what is left is consistent: ready once a root is emitted
        ready = [self._with_odds(c) for kept in self.candidates.values() for c in kept
                 if len(tokens) >= c.opens]
        furthest, n = _tails(tokens, ready), len(tokens)
        self.scores.watch(n, {key: c.token_ids[n - c.start:] for key, c in furthest.items()},
                          {key: c.probs[n - c.start:] for key, c in furthest.items() if c.probs})
        if limit <= 0 or not ready:
            return None
        chosen = max(ready, key=lambda c: self._rank(len(tokens), c, limit))
        own_limit = len(chosen.token_ids) if chosen.poster == OWN else limit  # lead's: its own
        draft = useful_tail(tokens, chosen, own_limit)
        if chosen.root is not None:
            return draft
        branches = forks(tokens, chosen, self.candidates[chosen.poster], len(draft.token_ids))
        return replace(draft, branches=branches)

    def _rank(self, n: int, c: Candidate, limit: int) -> tuple[float, int, bool]:
        """Backs' drafts, `limit` tokens at most, at the odds learned from their draft
        model's probabilities, else at their back's acceptance; lead's own at the odds it
        gives each of its tokens."""
        if c.odds is not None:
            yielded = odds_yield(c.odds[n - c.start:][:None if c.poster == OWN else limit])
        else:
            yielded = expected_yield(self.scores.alpha(c.poster), min(c.end - n, limit))
        return yielded, c.end, c.root is None

    def _with_odds(self, c: Candidate) -> Candidate:
        """`c` with odds per token: a back's from its draft model's probabilities (as
        lead has learned them so far), lead's own as they came."""
        if c.odds is not None or c.probs is None:
            return c
        return replace(c, odds=self.scores.odds.odds(c.poster, c.probs,
                                                     self.scores.alpha(c.poster)))

    def _drop_stale(self, tokens: Sequence[int]) -> None:
        live = {back: [c for c in kept if consistent(tokens, c)]
                for back, kept in self.candidates.items()}
        self.candidates = {back: kept for back, kept in live.items() if kept}

    def clear(self) -> None:
        self.candidates.clear()
        self.scores.forget_step()


def _tails(tokens: Sequence[int], ready: Sequence[Candidate]) -> dict[str, Candidate]:
    """Per back, its ready candidate reaching furthest."""
    return {c.poster: c for c in sorted(ready, key=lambda c: (c.end, c.root is None))}


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
            self._make_room(address)
            record = self.records[back_id] = BackRecord(now)
            self._bound()
        record.last_seen = now
        record.address = address or record.address
        record.kind = kind or record.kind
        record.sits_out = sits_out
        return arrived

    def _make_room(self, address: str) -> None:
        """A new id from an address that has BACKS_PER_ADDRESS takes the place of its least
        recently seen one: made-up ids push out only each other."""
        mine = [k for k, r in self.records.items() if address and r.address == address]
        if len(mine) >= BACKS_PER_ADDRESS:
            del self.records[min(mine, key=lambda k: self.records[k].last_seen)]

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
    clock: Callable[[], float] = time.monotonic  # tests give a fake one

    def allow(self, client: str, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        cap = max(self.rate, 1.0)
        tokens, last = self.buckets.pop(client, (cap, now))  # re-added last: LRU order
        tokens = min(cap, tokens + (now - last) * self.rate)
        allowed = tokens >= 1.0
        self.buckets[client] = (tokens - 1.0 if allowed else tokens, now)
        if len(self.buckets) > 1024:  # bound memory against many clients
            self.buckets.pop(next(iter(self.buckets)))
        return allowed


class PostLimiter:
    """Draft posts: `rate` per second per back, and BACKS_PER_ADDRESS backs' worth per
    address, since a back chooses its own id and could take a new one for every post."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_back = RateLimiter(rate, clock=clock)
        self.per_address = RateLimiter(rate * BACKS_PER_ADDRESS, clock=clock)

    def allow(self, address: str, back_id: str, now: float | None = None) -> bool:
        return self.per_back.allow(f"{address}/{back_id}", now) and \
            self.per_address.allow(address, now)
