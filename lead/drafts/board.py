"""Draft bookkeeping: candidates posted by backs, checked against lead's tokens.

A candidate is (start, token_ids): token_ids[0] is proposed for position `start` of the
session's token sequence. It is useful while it agrees with every token lead already has
in [start, n) and reaches past n; the useful part is its tail from n on. A back's post is
its main chain and its branches, each kept as a candidate over the session's positions
(the main chain's prefix, then the branch); a post replaces all of that back's candidates.

A branch's root is the draft's next likeliest token, chosen, not sampled: verified as a
draft token with its q, it would bias sampling. So a branch is offered only once lead has
emitted its root itself, and its useful tail starts after the root.

A back chooses its own id, so the board keys a back by its id and address, holds at most
BACKS_PER_ADDRESS backs per address, and ranks them by their own measured acceptance
(lead/drafts/rank.py), not by how far they reach: made-up ids cannot fill it, nor long junk
win it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from lead.drafts.own import OWN
from lead.drafts.rank import BackScores
from lead.policy.acceptance import MAX_ALPHA, expected_yield
from shared.branch import Branch
from shared.sampling import Dist

BACKS_PER_ADDRESS = 4  # backs' worth of board places, posts and registry records per address


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
    """The candidates of one post: its main chain, then each branch over its positions."""
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
    candidates: dict[str, list[Candidate]] = field(default_factory=dict)
    stale: int = 0
    scores: BackScores = field(default_factory=BackScores)

    def post(self, tokens: Sequence[int], candidate: Candidate,
             branches: Sequence[Candidate] = ()) -> bool:
        """Replace the back's candidates with this post's; False (and counted stale) if
        none of them can still be verified, or a new back finds no place."""
        key = candidate.poster
        kept = [c for c in (candidate, *branches) if consistent(tokens, c)]
        if not kept or self.address_full(tokens, candidate.address, candidate.back_id) or (
                key not in self.candidates and len(self.candidates) >= self.max_backs):
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
        return held >= BACKS_PER_ADDRESS

    def best(self, tokens: Sequence[int], limit: int) -> Draft | None:
        """The useful tail of the candidate expected to yield the most accepted tokens at
        its back's own acceptance (ties: the one reaching furthest, then a main chain);
        candidates that can no longer be verified are dropped. What each back offers is
        scored against the tokens lead holds at the next call."""
        self.scores.settle(tokens)
        self._drop_stale(tokens)  # what is left is consistent: ready once a root is emitted
        ready = [self._with_odds(c) for kept in self.candidates.values() for c in kept
                 if len(tokens) >= c.opens]
        self._watch(len(tokens), ready)
        if limit <= 0 or not ready:
            return None
        chosen = max(ready, key=lambda c: self._rank(len(tokens), c, limit))
        own_limit = len(chosen.token_ids) if chosen.poster == OWN else limit  # lead's: its own
        draft = useful_tail(tokens, chosen, own_limit)
        if chosen.root is not None:
            return draft
        branches = forks(tokens, chosen, self.candidates[chosen.poster], len(draft.token_ids))
        return replace(draft, branches=branches)

    def _watch(self, n: int, ready: Sequence[Candidate]) -> None:
        """Per back, the useful tail of its ready candidate reaching furthest: what it offers."""
        furthest = {c.poster: c for c in sorted(ready, key=lambda c: (c.end, c.root is None))}
        self.scores.watch(n, {key: (c.token_ids[n - c.start:], c.probs[n - c.start:]
                                    if c.probs else None) for key, c in furthest.items()})

    def _rank(self, n: int, c: Candidate, limit: int) -> tuple[float, int, bool]:
        """Backs' drafts, `limit` tokens at most, at the odds learned from their draft
        model's probabilities, else at their back's acceptance; lead's own at the odds it
        gives each of its tokens."""
        if c.odds is not None:
            yielded = expected_yield(c.odds[n - c.start:][:None if c.poster == OWN else limit])
        else:
            alpha = min(self.scores.alpha(c.poster), MAX_ALPHA)
            yielded = expected_yield([alpha] * min(c.end - n, limit))
        return yielded, c.end, c.root is None

    def _with_odds(self, c: Candidate) -> Candidate:
        """`c` with odds per token: a back's from its draft model's probabilities (as
        lead has learned them so far), lead's own as they came."""
        if c.odds is not None or c.probs is None:
            return c
        return replace(c, odds=self.scores.odds(c.poster, c.probs))

    def _drop_stale(self, tokens: Sequence[int]) -> None:
        live = {back: [c for c in kept if consistent(tokens, c)]
                for back, kept in self.candidates.items()}
        self.candidates = {back: kept for back, kept in live.items() if kept}

    def clear(self) -> None:
        """A reply ended: what was offered at its last step is compared with nothing."""
        self.candidates.clear()
        self.scores.watched = None
