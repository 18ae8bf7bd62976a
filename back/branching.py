"""The back's branches: alternatives to its draft, grown beside it (pure: no model, no I/O).

A branch replaces the draft's guess at a *site* (a position past lead's tokens) with the
draft's runner-up there, its *root*, and grows guesses after it on a branch sequence of
the draft model. Sites are taken by the draft's own probability that lead rejects the draft
there first: every guess before reached and accepted, this one not. When lead emits a
branch's root, the back adopts the branch as its draft instead of evaluating it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from shared.branch import Branch
from shared.sampling import Dist
from shared.wire.protocol import SamplingParams


@dataclass(frozen=True)
class Pick:
    """How a guess was picked: its distribution (None: greedy), the next likeliest token in
    the same adjusted, masked row (None: no other), and the guess's own probability."""

    token: int
    dist: Dist | None
    runner_up: int | None
    prob: float


@dataclass(frozen=True)
class Sprout:
    """A branch as grown so far (`at`: its site's position in the drafter's sequence; dists
    None where any token was picked greedily) and `stem`, the sequence it hangs off: up to
    and including the draft's guess at its site."""

    stem: tuple[int, ...]
    branch: Branch


@dataclass
class Growing:
    """A branch on a slot of the model. The slot holds `main[:-1]` and every token but
    the last (pending: evaluated on the next call, as the main chain's last guess is);
    `row` is the logits row that last token was picked from, once it was."""

    pos: int
    main: tuple[int, ...]
    tokens: list[int]
    dists: list[Dist | None]
    params: SamplingParams
    row: np.ndarray | None = None  # (None: the root, not yet evaluated)
    picks: list[Pick] = field(default_factory=list)  # how tokens[1:] were picked
    ended: bool = False

    @property
    def path(self) -> list[int]:
        """The sequence the branch spells: lead's tokens and the draft before it, then it."""
        return [*self.main[:-1], *self.tokens]

    def snapshot(self) -> Sprout:
        dists = None if None in self.dists else tuple(self.dists)
        return Sprout(self.main, Branch(self.pos, tuple(self.tokens),
                                        dists))  # type: ignore[arg-type]

    def add(self, pick: Pick) -> None:
        self.tokens.append(pick.token)
        self.dists.append(pick.dist)
        self.picks.append(pick)


def rejection_probs(picks: Mapping[int, Pick], local: Sequence[int], first: int
                   ) -> dict[int, float]:
    """Per draft position from `first` on: the draft's probability that lead rejects it there
    first, where a runner-up could stand in (the guess's own probability, as if the
    target agreed with the draft's distribution)."""
    reach, p_reject = 1.0, {}
    for pos in range(first, len(local)):
        pick = picks.get(pos)
        if pick is None or pick.token != local[pos]:
            break  # not this drafter's guess (lead's token, or redrafted)
        if pick.runner_up is not None:
            p_reject[pos] = reach * (1.0 - pick.prob)
        reach *= pick.prob
    return p_reject


def branch_sites(picks: Mapping[int, Pick], local: Sequence[int], first: int,
                 limit: int) -> list[int]:
    """The `limit` positions likeliest to be where lead rejects the draft, likeliest first."""
    p_reject = rejection_probs(picks, local, first)
    return sorted(p_reject, key=lambda p: -p_reject[p])[:max(limit, 0)]


def assign(sites: Sequence[int], growing: Mapping[int, Growing], n_slots: int
           ) -> tuple[list[int], list[tuple[int, int]]]:
    """Slots for `sites` (likeliest first): (slots whose branch is dropped, (slot, site)
    pairs to open). A branch already at a site keeps its slot; one at no site frees it."""
    held = {g.pos: slot for slot, g in growing.items()}
    dropped = [slot for slot, g in growing.items() if g.pos not in sites]
    free = sorted(set(range(n_slots)) - set(growing) | set(dropped))
    opened = [(free.pop(0), pos) for pos in sites if pos not in held and free]
    return dropped, opened


def taken_by_lead(growing: Mapping[int, Growing], local: Sequence[int],
                  lead_tokens: Sequence[int]) -> int | None:
    """The slot whose branch lead's tokens follow where they leave `local` (lead emitted
    its root, and every token of it lead holds since), or None."""
    for slot, g in growing.items():
        path = g.path
        n = min(len(path), len(lead_tokens))
        if len(lead_tokens) > g.pos and tuple(path[:n]) == tuple(lead_tokens[:n]) \
                and tuple(local[:g.pos]) == tuple(g.main[:-1]):
            return slot
    return None
