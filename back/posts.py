"""What the back posted in the session it follows, and the draft distributions it may post."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from back.branching import Sprout
from shared.sampling import Dist
from shared.wire.protocol import (
    MAX_BRANCH_TOKENS,
    MAX_BRANCHES,
    MAX_DRAFT_WIRE,
    DraftBranch,
    DraftDist,
    DraftPost,
)


class PostBook:
    """One per session followed (its Follower's): no other session's guesses in it."""

    def __init__(self) -> None:
        self.last: tuple[int, tuple[int, ...]] = (0, ())  # (start, token ids) last posted
        self._dists: dict[int, DraftDist] = {}  # drafter position -> its draft distribution
        self._probs: dict[int, float] = {}  # drafter position -> the model's q of its guess
        self._branches: frozenset[tuple[int, tuple[int, ...]]] = frozenset()  # last posted

    def drafted(self, n_lead: int, kept: int, dists: Mapping[int, DraftDist],
                probs: Mapping[int, float] | None = None) -> None:
        """A draft job's result: lead held `n_lead` tokens, the drafter's positions from
        `kept` on were redrafted, and `dists` holds the distributions of the new guesses
        that have one. Below `n_lead` the tokens are lead's (maybe its correction of a
        guess): their distributions no longer say how those tokens were drawn. `probs`:
        the draft model's probability of each new guess."""
        self._dists = {p: d for p, d in self._dists.items() if n_lead <= p < kept}
        self._dists.update(dists)
        self._probs = {p: q for p, q in self._probs.items() if n_lead <= p < kept}
        self._probs.update(probs or {})

    def next_post(self, session_id: str, start: int, draft: Sequence[int], back_id: str,
                  with_dists: bool = True, branches: Sequence[Sprout] = (),
                  longest: int = MAX_DRAFT_WIRE) -> tuple[DraftPost, int] | None:
        """The post of `draft` (lead's tokens end at `start`) with the `branches` that hang
        off it (each at most `longest` tokens), and how many of its tokens no post carried
        before; None if it is empty or was posted already (branches and all)."""
        draft = list(draft)
        positions = range(start, start + len(draft))
        dists = [self._dists[p] for p in positions] if with_dists and \
            all(p in self._dists for p in positions) else None
        probs = [round(self._probs[p], 4) for p in positions] \
            if all(p in self._probs for p in positions) else None
        wired = on_wire(start, draft, branches, dists is not None, longest)
        sent = frozenset((start + b.at, tuple(b.token_ids)) for b in wired)
        if not draft or (self._already_posted(start, draft) and sent <= self._branches):
            return None
        last_start, last = self.last
        new = max(0, start + len(draft) - max(last_start + len(last), start))
        self.last, self._branches = (start, tuple(draft)), sent
        return DraftPost(session_id=session_id, start=start, token_ids=draft, back_id=back_id,
                         dists=dists, probs=probs, branches=wired), new

    def _already_posted(self, start: int, draft: list[int]) -> bool:
        last_start, last = self.last
        skip = start - last_start
        return skip >= 0 and list(last[skip: skip + len(draft)]) == draft


def on_wire(start: int, draft: Sequence[int], branches: Sequence[Sprout],
            with_dists: bool, longest: int = MAX_DRAFT_WIRE) -> list[DraftBranch]:
    """The branches that hang off `draft` (at `start`), within the protocol's bounds: with
    dists exactly where the main chain has them, at most MAX_BRANCHES, MAX_BRANCH_TOKENS in
    all (the first come first: they are the likeliest to be needed)."""
    out: list[DraftBranch] = []
    budget = MAX_BRANCH_TOKENS
    for g in branches:
        b, at = g.branch, g.branch.at - start
        if len(out) == MAX_BRANCHES or budget < 1:
            break
        if not (0 <= at < len(draft)) or g.stem[start:] != tuple(draft[:at + 1]) \
                or (with_dists and b.dists is None):
            continue  # lead passed it, or it hangs off another draft
        tokens = list(b.token_ids[:min(budget, longest, MAX_DRAFT_WIRE)])
        dists = [wire_dist(d) for d in b.dists[:len(tokens)]] if with_dists and b.dists \
            else None
        out.append(DraftBranch(at=at, token_ids=tokens, dists=dists))
        budget -= len(tokens)
    return out


def wire_dist(dist: Dist) -> DraftDist:
    return DraftDist(token_ids=dist.token_ids.tolist(), probs=dist.probs.tolist())
