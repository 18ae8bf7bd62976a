"""The lead's engine: several generations at once, one batch a step, drafts verified and
never awaited.

Each generation takes a slot of the target's KV cache (lead/decode/slots.py chooses it by the
prefix it finds cached there) and joins the loop, which steps every slot together: one
model call holding each decoding session's last token and the draft that pays for it (the
draft lengths chosen jointly, lead/policy/cost.py `allocate`), and a chunk of any prompt still
being evaluated, so that a long prompt never stalls the others. Sessions join and leave
between steps. One step is `_step`: plan, one evaluation, each verdict applied in its Run
(lead/decode/runs.py: tokens, stop strings, finish, counts, emissions). The loop joins
Admission (the places and the queue), Decoder (seating, and the step's evaluation and
verifying, on the model thread) and the scoreboard (what every drafter's offers were worth,
settled once a step: lead/policy/scoreboard.py). Each run holds its draft board; what backs
see of the sessions is told as events (lead/decode/events.py), to which lead/backs listens.
All session state lives on the event loop; model work runs on one dedicated thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace

from lead.decode.admission import Admission, Place, QueueFull
from lead.decode.decoder import Clock, Decoder, Job, Step
from lead.decode.events import EngineEvents
from lead.decode.metrics import Metrics
from lead.decode.plan import Planner
from lead.decode.runs import Run, slot_view
from lead.decode.session import Emission, GenRequest, Session, StepResult
from lead.decode.slotwork import SlotWork, T
from lead.drafts.board import Candidate, Draft, DraftBoard
from lead.drafts.own import OWN, OwnDrafts
from lead.policy.cost import CostModel
from shared.model import Model, slots_of
from shared.modelthread import ModelThread
from shared.sampling import make_rng
from shared.wire.protocol import MAX_DRAFT_WIRE

__all__ = ["Emission", "Engine", "GenRequest", "QueueFull", "Session"]
log = logging.getLogger("lead")
# A prompt chunk beside decoding sessions costs at most this many one-token steps: on a CPU
# a batch of 9 costs ~5 steps, one of 48 ~12 and one of ~130 ~32, so small chunks cost the
# sessions beside them more in all, and the new reply's first token waits for every chunk;
# a large one holds them up longer at a time. At 8 clients (4 waiting for a slot) 32 gave
# 1-3 % more in all than 16 (docs/benchmarks.md).
PREFILL_STEPS = 32.0
# Turns of the event loop given to the readers after a step: a reply's sender, woken by
# its run's queue, writes on the next turn, and its send's own await takes one more
# (lead/apis/streaming.py; with one turn test_api's check of it fails). Writes after
# the next step was handed over held its start 0.15-0.3 ms.
READER_TURNS = 2


class Engine:
    def __init__(self, model: Model, max_draft: int = 8, draft_len: int | None = None,
                 max_queue: int = 8, batch: int = 512, clock: Clock = time.perf_counter,
                 grammar_s: float = 1.0, ngram: int = 0, parallel: int = 1,
                 cache_bytes: int = 0, memory: int = 0) -> None:
        """`clock` times steps for the cost model (tests give fakes a virtual one);
        `parallel`: generations at once (the model's slots bound it); `cache_bytes`: host
        memory for prompts' cells pushed out of their slots; `memory`: tokens of finished
        sessions lead's own drafts copy from."""
        self.model, self.max_draft, self.clock, self.batch = model, max_draft, clock, batch
        self.max_post = min(2 * max_draft, MAX_DRAFT_WIRE)  # this step's draft and the next's
        self.cost = CostModel(max_draft=max_draft, fixed=draft_len, longest=ngram)
        # lead's own drafts (`ngram`: their most tokens; 0, or no drafts at all: none)
        self.own = OwnDrafts(ngram, memory) if ngram and max_draft else None
        self.metrics = Metrics()
        self.n_slots = max(1, min(parallel, slots_of(model)))
        self.admission = Admission(max_queue, self.n_slots)
        self.model_thread = ModelThread("model")  # every model call, calibration too
        self.decoder = Decoder(model, self.cost, self.model_thread, clock, cache_bytes)
        self.slot_work = SlotWork(self.model_thread)  # saves, restores, erases of a slot
        self.grammar_s = grammar_s  # most verifying seconds a token (lead/decode/runs.py)
        self.planner = Planner(self.cost, model.n_ctx)
        # What the web page's live panel hears (lead/server/app.py connects it): sessions or
        # backs changed, and a session ended (with the time it ended).
        self.on_change: Callable[[], None] = lambda: None
        self.on_end: Callable[[Session, float], None] = lambda session, now: None
        self.events = EngineEvents()  # what lead/backs hears of the sessions
        self.backs_drafting: Callable[[], bool] = lambda: False  # a back drafts when asked
        self.runs: list[Run] = []  # in arrival order: seated, or waiting for a slot
        self.session: Session | None = None  # the session started last (running or not)
        self._loop: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)

    @property
    def busy(self) -> bool:
        return bool(self.runs)

    def calibrate(self, passes: int = 2) -> None:
        """Price verify batches before serving (blocking)."""
        self.model_thread.call(self.decoder.calibrate, passes, self.own.longest if self.own else 0)

    def reserve(self) -> Place:
        """A place in line for one generation, or QueueFull (counted) if there is none."""
        try:
            return self.admission.reserve()
        except QueueFull:
            self.metrics.rejected += 1
            raise

    async def generate(self, req: GenRequest, place: Place | None = None
                       ) -> AsyncIterator[Emission]:
        """Wait in `place` (reserved now if None), then run one generation, yielding text as
        it is decided. A caller that never starts it gives the place back (`place.leave`)."""
        place = place or self.reserve()
        async with place.turn():
            run = self._add(req)
            prompt: Session | None = run.session  # told with the first emission
            try:
                async for emission in run.emissions():
                    yield replace(emission, prompt=prompt) if prompt else emission
                    prompt = None
            finally:
                if not run.session.done:  # its reader left: it ends now, its slot free for the
                    self._end(run)  # next step (the one under way, if any, is dropped)

    async def on_slot(self, slot: int, work: Callable[[], T]) -> T:
        """`work` (a model-thread call on slot `slot`'s cache: lead/decode/slotwork.py) done
        between steps once no generation holds the slot; its result."""
        self._ensure_loop()  # (it starts once this call awaits)
        return await self.slot_work.add(slot, work)

    def _add(self, req: GenRequest) -> Run:
        self._ensure_loop()
        session = Session(id=f"s{next(self._ids)}-{uuid.uuid4().hex[:8]}",
                          tokens=list(req.prompt_ids), n_prompt=len(req.prompt_ids),
                          params=req.params, rng=make_rng(req.params.seed),
                          constraint=req.constraint, t_start=self.clock())
        run = Run(req, session, DraftBoard(scores=self.cost.scores))
        self.runs.append(run)
        self.session = session
        self.events.sessions_changed([run])
        self.on_change()
        return run

    def _ensure_loop(self) -> None:
        loop, running = self._loop, asyncio.get_running_loop()
        if loop is not None and not loop.done() and loop.get_loop() is not running:
            for stale in list(self.runs):  # a test's earlier event loop closed under them
                self._end(stale)
            self.slot_work.drop()
        if loop is None or loop.done() or loop.get_loop() is not running:
            self._loop = asyncio.create_task(self._steps())

    async def _steps(self) -> None:
        changed: list[Run] = []  # runs whose news backs have not been sent
        try:
            while self.runs or self.slot_work:
                if self.slot_work:
                    await self.slot_work.run({r.slot for r in self.runs if r.slot is not None})
                await self._seat_waiting()
                if self.runs:  # (else only slot work was waiting)
                    changed = await self._step(changed)
                # The readers write what this step emitted before the next step starts:
                # Python work overlapping a step preempts llama.cpp's threads, and holds
                # the GIL the model thread needs to begin it.
                for _ in range(READER_TURNS):
                    await asyncio.sleep(0)
            self.events.step_began(None)
            self.events.sessions_changed(changed)
        except BaseException as exc:
            self.events.step_began(None)  # no step under way: backs hear none is
            error = exc if isinstance(exc, Exception) else RuntimeError("lead is shutting down")
            for run in list(self.runs):
                self._end(run, error)
            self.slot_work.fail(error)
            if not isinstance(exc, Exception):
                raise

    async def _step(self, changed: list[Run]) -> list[Run]:
        """One step of every seated run: plan, one evaluation (each session verified on the
        model thread), each verdict applied in its run, which emits to its reader. The
        runs whose tokens it changed (`changed`: the last step's, told to backs now)."""
        jobs, offered = self._plan()
        # The last step's news goes out as this one begins, with its price: a back posts
        # its next draft before this step is due to end.
        self.events.step_began(self.planner.price(jobs))
        self.events.sessions_changed(changed)
        if not jobs:
            return []
        step = await self.decoder.step(jobs)
        done = self._still_running(jobs, step)
        verified = [run for run, _, res in done if res is not None]
        self._price(step, verified, len(jobs))
        for run, job, result in done:
            if result is None:
                run.prefilled(len(job.prompt), self.clock())
                continue
            self._score(run, job, result, offered.get(run.session.id))
            run.apply(result, self.model, self.grammar_s, self.clock())
            self.cost.scores.settle(run.session.id, run.session.tokens)
            if run.session.finish_reason is not None:
                self._end(run)
        return verified

    async def _seat_waiting(self) -> None:
        """Give waiting runs the free slots, in arrival order (one that names its slot waits
        for that one)."""
        for run in [r for r in self.runs if r.slot is None]:
            taken = {r.slot for r in self.runs if r.slot is not None}
            free = [i for i in range(self.n_slots)
                    if i not in taken and pinned(run.req.slot, i, self.n_slots)]
            if not free:
                continue
            prompt = run.session.tokens
            run.slot, held = await self.decoder.seat(prompt, free)
            run.todo = list(prompt[held:-1])
            run.prefilled(0, self.clock())  # all of it cached: it decodes from now

    def _plan(self) -> tuple[list[Job], dict[str, Draft | None]]:
        """This step's jobs: each decoding session's last token and draft, then a chunk of
        each prompt still being evaluated; and what each session was offered."""
        decoding = [r for r in self.runs if r.decoding]
        chunks = self._chunks([r for r in self.runs if r.slot is not None and r.todo],
                              bool(decoding))
        offered = {r.session.id: self._offered(r) for r in decoding}
        drafts = self.planner.plan([(r.session, offered[r.session.id]) for r in decoding],
                                   [r.req.max_tokens for r in decoding],
                                   len(decoding) + sum(len(c) for _, c in chunks))
        jobs = [self._job(r, d) for r, d in zip(decoding, drafts, strict=True)]
        jobs += [Job(r.slot or 0, (), 0, r.session.params, r.session.rng, prompt=tuple(c))
                 for r, c in chunks]
        return jobs, offered

    def _chunks(self, prefilling: list[Run], beside: bool) -> list[tuple[Run, list[int]]]:
        """Prompt chunks for this step, oldest first: up to the batch, or beside decoding
        sessions, what costs at most PREFILL_STEPS of their steps."""
        budget = self.batch
        if beside:
            budget = min(budget // 2, self.cost.prices.within(PREFILL_STEPS))
        out: list[tuple[Run, list[int]]] = []
        for run in prefilling:
            if budget <= 0:
                break
            out.append((run, run.todo[:budget]))
            budget -= len(out[-1][1])
        return out

    def _job(self, run: Run, draft: Draft | None) -> Job:
        s = run.session
        return Job(run.slot or 0, tuple(s.tokens), s.n_prompt, s.params, s.rng, draft,
                   run.req.top_logprobs, s.constraint, post_sampling=run.req.post_sampling,
                   mu=s.mu)

    def _offered(self, run: Run) -> Draft | None:
        """The draft on the run's board expected to yield the most, lead's own kinds' among
        them; what every drafter offers is watched on the scoreboard."""
        session, board = run.session, run.board
        tokens = session.tokens
        proposals = self.own.propose(session.id, tokens) if self.own is not None else {}
        for kind, p in proposals.items():
            board.post(tokens, Candidate(OWN, len(tokens), p.token_ids, known=p.known,
                                         scale=p.scale, kind=kind))
        self.cost.scores.offered(session.id, tokens, session.n_generated == 0,
                                 board.offers(tokens))
        return board.best(tokens, self.max_draft)

    def _still_running(self, jobs: Sequence[Job], step: Step
                       ) -> list[tuple[Run, Job, StepResult | None]]:
        """Each job with its run and result, but for runs that ended during the step (what
        it did for them is dropped)."""
        by_slot = {r.slot: r for r in self.runs if r.slot is not None}
        return [(by_slot[j.slot], j, res) for j, res in zip(jobs, step.results, strict=True)
                if j.slot in by_slot]

    def _price(self, step: Step, verified: list[Run], n_jobs: int) -> None:
        """The step's seconds to the prices: busy where a back drafted for a session it
        verified; only a step of one session prices the model (a batch of several sessions'
        tokens is not the batch of one sequence that calibration priced)."""
        busy = self.backs_drafting() and any(
            self.cost.draft_len(first=r.session.n_generated == 0) > 0 for r in verified)
        self.cost.record_step(step.n_tokens, step.seconds, busy,
                              priced=n_jobs == 1 and bool(verified))

    def _score(self, run: Run, job: Job, result: StepResult, offered: Draft | None) -> None:
        """What one session's verify step tells of drafts: metrics (the offers are settled
        on the scoreboard once the verdict is applied)."""
        self.metrics.record_step(run.after_rejection, bool(offered and offered.token_ids),
                                 bool(job.draft and offered and offered.branch))
        run.after_rejection = result.rejected
        if log.isEnabledFor(logging.DEBUG):
            self._trace(run.session, offered, result)

    def _end(self, run: Run, error: BaseException | None = None) -> None:
        """End `run`: its session's counts and log line, its slot freed (its cache stays,
        for the next prompt that shares its prefix)."""
        if run in self.runs:
            self.runs.remove(run)
        session = run.session
        self.cost.scores.settle(session.id, session.tokens, final=True)
        if session.finish_reason is None:
            session.finish_reason = "cancelled"
        now = self.clock()
        self.metrics.record_session(session, now)
        log.info("%s", self.metrics.session_line(session, now))
        run.board.clear()
        self.events.session_ended(run)
        if self.own is not None:
            self.own.forget(session.id, session.tokens)
        self.on_end(session, now)
        if error is not None:
            run.fail(error)

    def _trace(self, session: Session, offered: Draft | None, result: StepResult) -> None:
        """The step about to be applied to `session`, for --log-level debug."""
        cost = self.cost
        log.debug("%s step %d: offered %d, verified %d, accepted %d in %.0f ms; alpha %.2f, "
                  "slowdown %.2f, wanted %d%s", session.id, session.steps + 1,
                  len(offered.token_ids) if offered else 0, result.batch - 1,
                  len(result.verdict.accepted), result.seconds * 1000, cost.alpha,
                  cost.prices.slowdown, cost.draft_len(), " (probe)" if cost.probes.probing else "")

    def slot_views(self) -> list[dict[str, object]]:
        """What each slot holds now (idle, a prompt being evaluated or a reply decoding)."""
        by_slot = {r.slot: r for r in self.runs if r.slot is not None}
        return [slot_view(i, by_slot.get(i)) for i in range(self.n_slots)]

    def gauges(self) -> dict[str, float]:
        return {"draft_len": self.cost.draft_len(), "verify_len": self.cost.verify_len(),
                "queue_waiting": self.admission.waiting,
                "slots": self.n_slots, "slots_busy": sum(r.slot is not None for r in self.runs),
                "prompt_cache_bytes": self.decoder.prompts.bytes,
                "prompt_cache_entries": len(self.decoder.prompts), **self.cost.snapshot()}

    def shutdown(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
        self.model_thread.shutdown()


def pinned(wanted: int | None, slot: int, n_slots: int) -> bool:
    """Whether a request naming slot `wanted` may take `slot`: any slot for None or -1;
    past the last one, as llama-server's, it wraps round."""
    return wanted is None or wanted < 0 or slot == wanted % n_slots
