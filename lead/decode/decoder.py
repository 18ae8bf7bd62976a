"""The decode loop's model side: verify prices measured before serving, seating a generation
in a slot, and one step of every slot (prompt chunks and verify batches in one model call,
each verified).

Every evaluation runs on the one model thread, which gets what it needs as arguments
(`Job`s: each session's tokens, draft, sampling state and grammar state) and gives back
StepResults (with the grammar's next state); the sessions themselves stay on the event
loop, which installs them. Each slot's own `cached` list is the truth about its cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from lead.decode.promptcache import PromptCache, Saved
from lead.decode.session import StepResult
from lead.decode.slots import Seat, choose_seat
from lead.decode.verify import Verdict, row_dist, verify
from lead.drafts.board import Draft
from lead.policy.cost import CostModel
from shared.grammar.constraint import Constraint
from shared.logprobs import TokenLogprob, sampled_logprob, token_logprob
from shared.model import Model, Part, Slotted
from shared.modelthread import ModelThread
from shared.wire.protocol import SamplingParams

log = logging.getLogger("lead")
Clock = Callable[[], float]
CALIBRATE_MAX_BATCH = 17  # every size up to this one is priced
LONG_SIZES = (24, 32, 48, 65)  # past it, these (lead's own drafts run up to 64 tokens)
NO_DRAFT = Draft("", [], None)  # a verify job's draft where it has none: its last token alone


@dataclass(frozen=True)
class Job:
    """One session's share of a step, fixed on the event loop: a chunk of its prompt to
    evaluate (`prompt`), or its last token and `draft` to verify."""

    slot: int
    tokens: tuple[int, ...]  # the session's tokens so far
    n_prompt: int
    params: SamplingParams
    rng: np.random.Generator
    draft: Draft | None = None
    top_logprobs: int | None = None
    constraint: Constraint | None = None
    prompt: tuple[int, ...] = ()  # a prompt chunk: evaluated, nothing verified
    mu: float | None = None  # mirostat's state after `tokens` (the session's)
    post_sampling: bool = False  # logprobs of the distribution sampled (GenRequest's)

    @property
    def verifies(self) -> bool:
        return not self.prompt


@dataclass(frozen=True)
class Step:
    """What one model call did: its seconds, and per job its verdict (None: a prompt chunk)."""

    seconds: float
    results: list[StepResult | None]
    n_tokens: int


class Decoder:
    def __init__(self, model: Model, cost: CostModel, thread: ModelThread, clock: Clock,
                 cache_bytes: int = 0) -> None:
        """`cache_bytes`: host memory for prompts pushed out of their slots."""
        self.model, self.cost, self.thread, self.clock = model, cost, thread, clock
        self.slotted = cast(Slotted, model)
        self.prompts = PromptCache(cache_bytes)

    def calibrate(self, passes: int, longest: int) -> None:
        """Price verify batches of every size a chain may take (the fastest of `passes`),
        and a few up to `longest`+1 for lead's own drafts (sizes between are interpolated),
        so lead need not explore batch sizes on live replies. On the model thread, before
        serving."""
        chain = calibrated_sizes(self.cost.max_draft)
        long = [b for b in LONG_SIZES if chain[-1] < b <= min(longest + 1, self.model.n_ctx)]
        log.info("pricing verify batches of 1-%d tokens", (long or chain)[-1])
        self.model.evaluate([0], 1)  # the first evaluation allocates; it is not timed
        self.cost.prices.calibrate(fastest(self._price(chain, passes), self._price(long, passes)))
        log.info("%s", self.cost.describe())

    def _price(self, sizes: list[int], passes: int) -> dict[int, float]:
        """The fastest of `passes` evaluations of each batch size, in seconds; one token is
        timed again before each size, as every price is read over it: a hiccup while it
        alone was timed made every batch look cheap, and drafts that do not pay verified."""
        best: dict[int, float] = {}
        for _ in range(passes):
            for b in sizes:
                for size in sorted({1, b}):
                    best[size] = min(best.get(size, 1e9), self._time(size))
        self.model.truncate(0)
        return best

    def _time(self, size: int) -> float:
        """Seconds one evaluation of `size` tokens takes, on an empty cache."""
        self.model.truncate(0)
        t0 = self.clock()
        self.model.evaluate([0] * size, size)
        return self.clock() - t0

    async def seat(self, prompt: Sequence[int], free: Sequence[int]) -> tuple[int, int]:
        """Seat `prompt` in one of the `free` slots, holding what it can of the prompt
        without evaluating (its own prefix, another slot's, or host memory's); the slot and
        the prompt tokens it holds. What the slot held goes to host memory if worth it."""
        # what each slot's cache holds (read between steps, on the event loop)
        cached = [tuple(self.slotted.slot(i).cached) for i in range(self.slotted.n_slots)]
        stored, n_stored = self.prompts.match(prompt)
        seat = choose_seat(prompt, cached, free, n_stored)
        restore = stored if seat.restored else None
        save = self.prompts.worth_saving(cached[seat.slot], seat.keeps)
        held, saved = await self.thread.run(self._seat, seat, tuple(prompt), restore, save)
        if saved is not None:
            self.prompts.add(saved)
        if restore is not None:
            self.prompts.used(restore)
        return seat.slot, held

    def _seat(self, seat: Seat, prompt: tuple[int, ...], restore: Saved | None, save: bool
              ) -> tuple[int, Saved | None]:
        view = self.slotted.slot(seat.slot)
        saved = Saved(tuple(view.cached), self.slotted.save_slot(seat.slot)) if save else None
        if restore is not None:
            if not self.slotted.load_slot(seat.slot, restore.tokens, restore.state):
                log.warning("llama.cpp refused a saved prompt's cells; evaluating them again")
        elif seat.donor is not None:
            self.slotted.share_prefix(seat.donor, seat.slot, seat.shared)
        # The cache holds everything but the prompt's last token; each step evaluates that.
        view.truncate(min(seat.cached, len(prompt) - 1))
        return len(view.cached), saved

    def padded(self, jobs: Sequence[Job]) -> int:
        """The batch a lone verify job is evaluated in: a larger priced one where the kernels
        make that cheaper (its padding's rows are not read); 0: no padding."""
        if len(jobs) != 1 or not jobs[0].verifies:
            return 0
        job = jobs[0]
        size = self.cost.prices.batch_for(1 + job.draft.n_tokens) if job.draft else 1
        return min(size, self.model.n_ctx - len(job.tokens) + 1)

    async def step(self, jobs: Sequence[Job]) -> Step:
        """One model call for every job: prompt chunks evaluated, drafts verified."""
        return await self.thread.run(self._step, tuple(jobs), self.padded(jobs))

    def _step(self, jobs: tuple[Job, ...], size: int) -> Step:
        parts = [self._part(job, size) for job in jobs]
        for job in jobs:
            if job.verifies and len(self.slotted.slot(job.slot).cached) != len(job.tokens) - 1:
                raise RuntimeError("model cache out of step with the session")
        t0 = self.clock()
        rows = self.slotted.evaluate_parts(parts)
        seconds = self.clock() - t0
        results = [self._verify(job, got, seconds) if job.verifies else None
                   for job, got in zip(jobs, rows, strict=True)]
        return Step(seconds, results, sum(p.n_tokens for p in parts))

    def _part(self, job: Job, size: int) -> Part:
        if not job.verifies:
            return Part(job.slot, job.prompt, 0)
        draft = job.draft or NO_DRAFT
        # padding's rows are not read, and the cells past the accepted tokens are dropped
        pad = max(size - 1 - draft.n_tokens, 0)
        main = (job.tokens[-1], *draft.token_ids, *[job.tokens[-1]] * pad)
        return Part(job.slot, main, len(main))

    def _verify(self, job: Job, rows: np.ndarray, seconds: float) -> StepResult:
        draft = job.draft or NO_DRAFT
        t0 = self.clock()
        verdict = verify(draft.token_ids, rows[:len(draft.token_ids) + 1], job.params, job.rng,
                         draft.dists, job.tokens, job.n_prompt, job.constraint, job.mu)
        verify_s = self.clock() - t0
        # the cache keeps the verified tokens: those accepted (the emitted one is fed next)
        self.slotted.slot(job.slot).truncate(len(job.tokens) + len(verdict.accepted))
        logprobs = None if job.top_logprobs is None else _logprobs(verdict, job)
        return StepResult(verdict, 1 + draft.n_tokens, seconds, draft.back_id, logprobs,
                          verify_s)


def _logprobs(verdict: Verdict, job: Job) -> list[TokenLogprob]:
    assert verdict.rows is not None and job.top_logprobs is not None, "rows kept, logprobs asked"
    n_top = job.top_logprobs
    if not job.post_sampling:
        return [token_logprob(verdict.rows[i], t, n_top) for i, t in enumerate(verdict.emitted)]
    if len(verdict.dists) == len(verdict.emitted):  # p as drawn (XTC's draw, mirostat's mu)
        return [sampled_logprob(d, t, n_top)
                for d, t in zip(verdict.dists, verdict.emitted, strict=True)]
    # each row's p as the verifier drew from it, the grammar's state after the tokens before
    state, out = job.constraint, []
    for row, token in zip(verdict.rows, verdict.emitted, strict=False):
        out.append(sampled_logprob(row_dist(row, state, job.params), token, n_top))
        state = state.advanced([token]) if state is not None else None
    return out


def calibrated_sizes(max_draft: int) -> list[int]:
    """Batch sizes to price: every one a chain may take."""
    return list(range(1, min(max_draft + 1, CALIBRATE_MAX_BATCH) + 1))


def fastest(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    """Two sets of prices in one, the faster of each size priced in both."""
    return {size: min(a.get(size, 1e9), b.get(size, 1e9)) for size in a | b}
