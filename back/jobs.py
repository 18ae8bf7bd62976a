"""The back's model-thread work: catch the drafter up with lead, draft past lead's tokens.

The model thread owns the drafter; a job gets all else it needs as arguments, fixed when it
starts, and returns what it did. While it runs it reads only lead's tokens in the session's
mirror, to stop a draft evaluation as soon as lead's news leaves the path it drafts on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from back.branching import Sprout
from back.drafter import Drafter, Grown
from back.mirror import LeadMirror
from back.posts import wire_dist
from back.stats import Work
from shared.model import EvaluationAborted, common_prefix
from shared.wire.protocol import DraftDist, SamplingParams


def leaving(mirror: LeadMirror, path: Sequence[int]) -> Callable[[], bool]:
    """An abort check: whether lead's tokens as the event loop last took them leave `path`.
    The mirror replaces its tokens whole by one immutable tuple, so the model thread sees
    one snapshot or the next, never half of one; polled hundreds of times per token, the
    check compares once per snapshot."""
    seen: tuple[int, ...] | None = None
    left = False

    def check() -> bool:
        nonlocal seen, left
        tokens = mirror.tokens
        if tokens is not seen:
            seen, left = tokens, common_prefix(path, tokens) < min(len(path), len(tokens))
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
    mirror: LeadMirror  # the session's: its tokens are the one thing a job reads as it runs
    n_prompt: int = 0  # lead's tokens that are the prompt (frequency/presence penalties)
    width: int = 0  # branches grown beside the draft (back/branching.py)
    depth: int = 0  # most guesses after a branch's root
    stop_at: int = 0  # a model drafter's job ends once its draft is this far past lead's
    until: float | None = None  # ... or before a guess that would end past this time
    # (time.monotonic: when its post must leave to reach lead's step's end)


@dataclass(frozen=True)
class Drafted:
    work: Work
    grown: int  # new draft tokens
    local: tuple[int, ...]  # the drafter's sequence after the job: lead's tokens, its draft
    kept: int  # the drafter's positions below this were not redrafted
    dists: dict[int, DraftDist]  # position -> distribution, for new guesses that have one
    probs: dict[int, float] = field(default_factory=dict)  # position -> the model's q of it
    branches: tuple[Sprout, ...] = ()  # grown off `local`, likeliest first
    calls: tuple[tuple[int, float], ...] = ()  # (tokens evaluated, seconds) per model call

    @property
    def changed(self) -> bool:
        return bool(self.grown or self.work.branch_grown)


def catch_up(drafter: Drafter, lead_tokens: Sequence[int], defer: bool = False) -> Work:
    """Make the drafter hold lead's tokens (its draft past them stays where it agrees);
    `defer`: a model drafter leaves lead's last token for its next call to evaluate."""
    t0 = time.perf_counter()
    evaluated = drafter.catch_up(lead_tokens, defer)
    return Work(caught_up=evaluated,
                catch_up_s=time.perf_counter() - t0 if evaluated else 0.0)


def extend_many(model: Any, jobs: Sequence[tuple[int, Drafter, DraftJob]]) -> list[Drafted]:
    """Catch each session's drafter up with lead, then draft up to its job's `burst` more
    tokens (branches grown in the same calls; with the draft `ahead` past lead, branches
    alone), every session on its own slot of `model` (None: one session, on its drafter's
    own). Each call grows every session's draft by a guess (the first also evaluates lead's
    last token, left by each catch-up) and stops midway once lead leaves all their paths."""
    growths = [Growth(slot, drafter, job) for slot, drafter, job in jobs]
    for _ in range(max(g.job.burst for g in growths)):
        seconds = _grow_together(model, growths)
        if seconds is None or all(g.enough(seconds) or not g.open for g in growths):
            break
    return [g.drafted() for g in growths]


def _grow_together(model: Any, growths: Sequence[Growth]) -> float | None:
    """One model call growing each open growth, and its seconds; None when none had
    anything to grow, or the call was cut short."""
    batches: list[tuple[Growth, dict[int, list[int]]]] = []
    for g in growths:
        batch = g.drafter.begin_growth(g.job.sampling, g.chain, g.job.width, g.job.depth) \
            if g.open else None
        g.open = batch is not None
        if batch is not None:
            batches.append((g, batch))
    if not batches:
        return None
    checks = [leaving(g.job.mirror, tuple(g.drafter.local)) for g, _ in batches]
    t0 = time.perf_counter()
    try:
        rows = _evaluate(model, batches, lambda: all(check() for check in checks))
    except EvaluationAborted:
        for g, _ in batches:
            g.cut_short, g.open = 1, False
        return None
    seconds = time.perf_counter() - t0
    total = sum(len(t) for _, b in batches for t in b.values())
    batches[0][0].calls.append((total, seconds))  # one call, noted once
    for (g, _), got in zip(batches, rows, strict=True):
        grown = g.drafter.end_growth(got, g.job.sampling, g.job.rng, g.job.n_prompt, g.chain,
                                     g.job.width)
        g.open = g.took(grown)
    return seconds


def _evaluate(model: Any, batches: Sequence[tuple[Growth, dict[int, list[int]]]],
              abort: Callable[[], bool]) -> list[dict[int, np.ndarray]]:
    """Every batch's rows, in one model call (none where no batch holds a token: an n-gram
    drafter's guesses are free); one session's on its drafter's own model."""
    if not any(tokens for _, batch in batches for tokens in batch.values()):
        return [{} for _ in batches]
    if model is None or len(batches) == 1:
        return [g.drafter.evaluate(batch, abort) for g, batch in batches]
    return model.evaluate_many_slots([(g.slot, batch) for g, batch in batches], abort)


class Growth:
    """One session's draft growing over a job's model calls, from its drafter caught up
    with lead: what was grown, and how."""

    def __init__(self, slot: int, drafter: Drafter, job: DraftJob) -> None:
        self.slot, self.drafter, self.job = slot, drafter, job
        self.caught = catch_up(drafter, job.lead_tokens, defer=True)
        self.kept = len(drafter.local)
        self.dists: dict[int, DraftDist] = {}
        self.probs: dict[int, float] = {}
        self.grown = self.branch_grown = self.cut_short = 0
        self.calls: list[tuple[int, float]] = []
        self.open = True

    @property
    def past(self) -> int:
        """Draft tokens past lead's."""
        return self.kept - len(self.job.lead_tokens) + self.grown

    @property
    def chain(self) -> bool:
        """Whether the draft itself grows (else its branches alone)."""
        return self.past < self.job.ahead

    def took(self, step: Grown) -> bool:
        """Count a grown step; whether drafting goes on after it."""
        self.branch_grown += step.branches_grown
        if step.guess is not None:
            self.grown += 1
        if (pick := step.pick) is not None:
            pos = len(self.drafter.local) - 1
            self.probs[pos] = pick.prob
            if pick.dist is not None:
                self.dists[pos] = wire_dist(pick.dist)
        return step.guess not in self.job.eos_token_ids and (step.guess is not None
                                                              or step.branches_grown > 0)

    def enough(self, call_s: float) -> bool:
        """Whether the job should end here, for its post: the draft as far past lead's
        tokens as `stop_at`, or no time for another call (as long as the last, `call_s`)
        before `until`."""
        job = self.job
        if job.stop_at and self.past >= job.stop_at:
            return True
        return job.until is not None and time.monotonic() + call_s > job.until

    def drafted(self) -> Drafted:
        work = replace(self.caught, cut_short=self.cut_short, branch_grown=self.branch_grown)
        return Drafted(work, self.grown, tuple(self.drafter.local), self.kept, self.dists,
                       self.probs, self.drafter.branches, tuple(self.calls))
