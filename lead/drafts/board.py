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
(the scoreboard: lead/policy/scoreboard.py), not by how far they reach: made-up ids cannot
fill it, nor long junk win it. Lead's own kinds post on it too, each under its name, and
compete with backs the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from lead.drafts.own import OWN
from lead.policy.acceptance import MAX_ALPHA, expected_accepted
from lead.policy.scoreboard import Offer, Scale, Scoreboard
from shared.branch import Branch
from shared.sampling import Dist

BACKS_PER_ADDRESS = 4  # backs' worth of board places, posts and registry records per address

# A back's draft model's q of each token, in bands (their lower ends), each starting from
# the back's own acceptance: where q says nothing (or a back sends noise) every band stays
# near it.
Q = Scale("q", tuple((low, None) for low in (0.0, 0.3, 0.5, 0.7, 0.85, 0.95, 0.99)), 0.99)


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
    p_accept: tuple[float, ...] | None = None  # per token, that lead accepts it (as learned)
    known: tuple[float, ...] | None = None  # per token, what its drafter knows of it
    scale: Scale = Q  # on which `known` is read (a back's: its draft model's q)
    kind: str = ""  # which of lead's own kinds posted it ("": a back)

    @property
    def poster(self) -> str:
        """The drafter as the board and the scoreboard know it."""
        return f"{self.back_id}:{self.kind}" if self.kind else poster(self.back_id, self.address)

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)

    @property
    def opens(self) -> int:
        """How many tokens lead must hold before this candidate may be verified."""
        return self.start if self.root is None else self.start + self.root + 1


@dataclass(frozen=True)
class Draft:
    """The useful tail of a candidate: what the next verify step can check."""

    back_id: str
    token_ids: list[int]
    dists: list[Dist] | None
    branch: bool = False  # it came from a branch: lead emitted the branch's root
    p_accept: list[float] | None = None  # per token, that lead accepts it given the ones before
    drafter: str = ""  # its drafter as the scoreboard knows it (Candidate.poster)

    @property
    def n_tokens(self) -> int:
        """Draft tokens to evaluate."""
        return len(self.token_ids)


def post_candidates(back_id: str, start: int, main: Sequence[int],
                    main_dists: Sequence[Dist] | None, branches: Sequence[Branch] = (),
                    address: str = "", probs: Sequence[float] | None = None
                    ) -> list[Candidate]:
    """The candidates of one post: its main chain, then each branch over its positions."""
    out = [Candidate(back_id, start, tuple(main), tuple(main_dists) if main_dists else None,
                     address=address, known=tuple(probs) if probs else None)]
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
    p_accept = list(candidate.p_accept[skip:skip + len(ids)]) if candidate.p_accept else None
    return Draft(candidate.back_id, ids, dists, branch=candidate.root is not None,
                 p_accept=p_accept, drafter=candidate.poster)


@dataclass
class DraftBoard:
    """Candidates of the current session, a main chain and its branches per back (keyed by
    `Candidate.poster`); counts the posts it drops; ranks by the scoreboard (`scores`)."""

    max_backs: int = 16
    candidates: dict[str, list[Candidate]] = field(default_factory=dict)
    stale: int = 0
    scores: Scoreboard = field(default_factory=Scoreboard)

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
        its drafter's record (ties: the one reaching furthest, then a main chain);
        candidates that can no longer be verified are dropped."""
        ready = self._ready(tokens)
        if limit <= 0 or not ready:
            return None
        chosen = max(ready, key=lambda c: self._rank(len(tokens), c, limit))
        own_limit = len(chosen.token_ids) if chosen.back_id == OWN else limit  # lead's: its own
        return useful_tail(tokens, chosen, own_limit)

    def offers(self, tokens: Sequence[int]) -> dict[str, Offer]:
        """Per drafter, the useful tail of its ready candidate reaching furthest: what it
        offers at the step that extends `tokens` (the scoreboard watches it)."""
        n, ready = len(tokens), self._ready(tokens, priced=False)
        furthest = {c.poster: c for c in sorted(ready, key=lambda c: (c.end, c.root is None))}
        return {key: Offer(c.token_ids[n - c.start:],
                           c.known[n - c.start:] if c.known else None, c.scale,
                           back=c.back_id != OWN) for key, c in furthest.items()}

    def _ready(self, tokens: Sequence[int], priced: bool = True) -> list[Candidate]:
        """The candidates ready at `tokens`; `priced`: with their acceptance probabilities
        (an offer carries what its drafter knows, not what it is worth)."""
        self._drop_stale(tokens)  # what is left is consistent: ready once a root is emitted
        ready = [c for kept in self.candidates.values() for c in kept if len(tokens) >= c.opens]
        return [self._with_p_accept(c) for c in ready] if priced else ready

    def _rank(self, n: int, c: Candidate, limit: int) -> tuple[float, int, bool]:
        """Drafts, `limit` tokens at most (lead's own: as long as they run), at the
        acceptance probabilities learned per band of what their drafter knows of each token,
        else at its acceptance."""
        if c.p_accept is not None:
            own = c.back_id == OWN  # lead's own: as long as they run
            expected = expected_accepted(c.p_accept[n - c.start:][:None if own else limit])
        else:
            alpha = min(self.scores.alpha(c.poster), MAX_ALPHA)
            expected = expected_accepted([alpha] * min(c.end - n, limit))
        return expected, c.end, c.root is None

    def _with_p_accept(self, c: Candidate) -> Candidate:
        """`c` with acceptance probabilities per token, learned per band of what its drafter
        knows of each."""
        if c.p_accept is not None or c.known is None:
            return c
        return replace(c, p_accept=self.scores.known_p_accept(c.poster, c.known, c.scale))

    def _drop_stale(self, tokens: Sequence[int]) -> None:
        live = {back: [c for c in kept if consistent(tokens, c)]
                for back, kept in self.candidates.items()}
        self.candidates = {back: kept for back, kept in live.items() if kept}

    def clear(self) -> None:
        """A reply ended: its candidates go."""
        self.candidates.clear()
