"""The back's model-thread work: catch the drafter up with lead, draft past lead's tokens.

The model thread owns the drafter; a job gets everything else it needs as arguments,
fixed when it starts, and returns what it did. The one thing it reads while it runs is
`LatestTokens`, where the event loop leaves lead's tokens as it takes them: a draft
evaluation stops as soon as they leave the path it drafts on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from back.drafter import Drafter, ModelDrafter
from back.mirror import parted
from back.posts import wire_dist
from back.sessions import Work
from back.tree import Branch
from shared.protocol import DraftDist, SamplingParams


class LatestTokens:
    """Lead's tokens as the event loop last took them. Replaced whole by one immutable
    tuple, so the model thread sees one snapshot or the next, never half of one."""

    def __init__(self) -> None:
        self._tokens: tuple[int, ...] = ()

    def publish(self, tokens: tuple[int, ...]) -> None:
        self._tokens = tokens

    def changed(self, since: tuple[int, ...]) -> Callable[[], bool]:
        """An abort check: whether lead's latest tokens are other than `since` (lead took a
        step). Compares once per snapshot."""
        seen: tuple[int, ...] | None = None
        changed = False

        def check() -> bool:
            nonlocal seen, changed
            tokens = self._tokens
            if tokens is not seen:
                seen, changed = tokens, tokens != since
            return changed
        return check

    def left(self, path: Sequence[int]) -> Callable[[], bool]:
        """An abort check: whether lead's latest tokens leave `path`. Polled hundreds of
        times per token, it compares once per snapshot."""
        seen: tuple[int, ...] | None = None
        left = False

        def check() -> bool:
            nonlocal seen, left
            tokens = self._tokens
            if tokens is not seen:
                seen, left = tokens, parted(path, tokens)
            return left
        return check


def ahead_for(draft_len: int, max_post: int) -> int:
    """How far past lead's tokens to draft: two of its steps, so that a step accepting a
    whole draft finds the next one ready; no further, as a draft model beside lead slows
    it and tokens far ahead are rarely used (docs/back-loop.md)."""
    return min(max_post, 2 * (draft_len + 1))


@dataclass(frozen=True)
class DraftJob:
    lead_tokens: tuple[int, ...]
    sampling: SamplingParams
    ahead: int  # most draft tokens past lead's to hold
    burst: int  # most tokens to draft in this job
    eos_token_ids: frozenset[int]
    rng: np.random.Generator  # the generator of the session the job is for
    latest: LatestTokens
    n_prompt: int = 0  # lead's tokens that are the prompt (frequency/presence penalties)
    width: int = 0  # branches grown beside the draft (back/tree.py)
    depth: int = 0  # most guesses after a branch's root


@dataclass(frozen=True)
class Drafted:
    work: Work
    grown: int  # new draft tokens
    local: tuple[int, ...]  # the drafter's sequence after the job: lead's tokens, its draft
    kept: int  # the drafter's positions below this were not redrafted
    dists: dict[int, DraftDist]  # position -> distribution, for new guesses that have one
    probs: dict[int, float] = field(default_factory=dict)  # position -> the model's q of it
    branches: tuple[Branch, ...] = ()  # grown off `local`, likeliest first
    branch_grown: int = 0  # branch tokens added
    calls: tuple[tuple[int, float], ...] = ()  # (tokens evaluated, seconds) per model call

    @property
    def changed(self) -> bool:
        return bool(self.grown or self.branch_grown)


def catch_up(drafter: Drafter, lead_tokens: Sequence[int]) -> Work:
    """Make the drafter hold lead's tokens (its draft past them stays where it agrees)."""
    t0 = time.perf_counter()
    evaluated = drafter.catch_up(lead_tokens)
    return Work(caught_up=evaluated,
                catch_up_s=time.perf_counter() - t0 if evaluated else 0.0)


def extend(drafter: Drafter, job: DraftJob) -> Drafted:
    """Catch up with lead, then draft up to `job.burst` more tokens, growing branches in
    the same calls; with the draft `job.ahead` past lead, branches alone. A draft
    evaluation stops once lead's news leaves its path: right after a rejection, evaluating
    lead's correction cannot wait for a guess on the dead path to finish."""
    caught = catch_up(drafter, job.lead_tokens)
    kept = len(drafter.local)
    room = job.ahead - (kept - len(job.lead_tokens))  # local agrees with lead up to there
    if not isinstance(drafter, ModelDrafter):
        return _extend_plain(drafter, job, caught, kept, room)
    dists: dict[int, DraftDist] = {}
    probs: dict[int, float] = {}
    grown = branch_grown = cut_short = 0
    calls: list[tuple[int, float]] = []
    for _ in range(job.burst):
        chain = grown < room
        left = job.latest.left(tuple(drafter.local))
        t0 = time.perf_counter()
        step = drafter.grow(job.sampling, job.rng, left, job.n_prompt, chain, job.width,
                            job.depth)
        if step is None:
            cut_short = int(left())
            break
        calls.append((step.evaluated, time.perf_counter() - t0))
        branch_grown += step.branches_grown
        if step.guess is not None:
            grown += 1
            pos = len(drafter.local) - 1
            pick_dist, prob = drafter.dist_at(pos), drafter.prob_at(pos)
            if pick_dist is not None:
                dists[pos] = wire_dist(pick_dist)
            if prob is not None:
                probs[pos] = prob
        if step.guess in job.eos_token_ids or (step.guess is None and not step.branches_grown):
            break
    work = Work(caught.caught_up, caught.catch_up_s, cut_short, branch_grown)
    return Drafted(work, grown, tuple(drafter.local), kept, dists, probs, drafter.branches,
                   branch_grown, tuple(calls))


def _extend_plain(drafter: Drafter, job: DraftJob, caught: Work, kept: int, room: int
                  ) -> Drafted:
    """`extend` for a drafter without branches (n-grams): guesses only."""
    dists: dict[int, DraftDist] = {}
    grown = cut_short = 0
    while grown < min(job.burst, room):
        left = job.latest.left(tuple(drafter.local))
        got = drafter.next_token(job.sampling, job.rng, left, n_prompt=job.n_prompt)
        if got is None:
            cut_short = int(left())
            break
        token, dist = got
        if dist is not None:
            dists[len(drafter.local) - 1] = wire_dist(dist)
        grown += 1
        if token in job.eos_token_ids:
            break
    work = Work(caught.caught_up, caught.catch_up_s, cut_short)
    return Drafted(work, grown, tuple(drafter.local), kept, dists)
