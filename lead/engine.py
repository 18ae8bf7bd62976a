"""The lead's decode loop: one generation at a time, drafts verified, never awaited.

All session state lives on the event loop. Model work runs on one dedicated
thread, so model calls are serialised even when a cancelled request leaves a
step running; the model's own `cached` list is the truth about its KV cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from lead.cost import CostModel, OfferWatch
from lead.drafts import BackRegistry, Candidate, Draft, DraftBoard
from lead.metrics import Metrics
from lead.textstream import TextStream
from lead.verify import Verdict, verify
from shared.model import Model, sync_cache
from shared.modelthread import ModelThread
from shared.protocol import MAX_DRAFT_WIRE, SamplingParams, State
from shared.sampling import Dist, make_rng

log = logging.getLogger("lead")
CALIBRATE_MAX_BATCH = 17  # larger sizes are priced like the largest calibrated one


class QueueFull(Exception):
    pass


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)


@dataclass
class Emission:
    text: str
    n_tokens: int
    n_from_draft: int
    session: Session | None = None  # set on the last emission of a generation


@dataclass
class Session:
    id: str
    tokens: list[int]
    n_prompt: int
    params: SamplingParams
    rng: np.random.Generator
    done: bool = False
    finish_reason: str | None = None
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # verify steps that rejected a draft token
    steps: int = 0
    accepted_by_back: dict[str, int] = field(default_factory=dict)
    prompt_evaluated: int = 0
    t_start: float = field(default_factory=time.perf_counter)
    t_decode: float = 0.0

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.n_prompt


@dataclass
class StepResult:
    verdict: Verdict
    batch: int
    seconds: float
    back_id: str
    evaluated: int  # batch size evaluated: `batch` and any padding


class Engine:
    def __init__(self, model: Model, max_draft: int = 8, draft_len: int | None = None,
                 max_queue: int = 8, batch: int = 512) -> None:
        self.model = model
        self.max_draft, self.max_queue, self.batch = max_draft, max_queue, batch
        self.max_post = min(2 * max_draft, MAX_DRAFT_WIRE)  # this step's draft and the next's
        self.cost = CostModel(max_draft=max_draft, fixed=draft_len)
        self.board = DraftBoard()
        self.backs = BackRegistry()
        self.metrics = Metrics()
        self.session: Session | None = None
        self.version = 0
        self.lead_id = uuid.uuid4().hex[:12]  # versions restart with the process; this does not
        self._lock = asyncio.Lock()  # FIFO: one generation at a time
        # Replaced on every change. (An asyncio.Condition was used first: a long-poll
        # cancelled while waiting on it could leave its lock held, and lead froze.)
        self._news = asyncio.Event()
        self.model_thread = ModelThread("model")  # every model call, calibration too
        self._hushed = False  # as last logged
        self._waiting = 0
        self._ids = itertools.count(1)

    # --- model thread ---
    def _prefill(self, prompt_ids: list[int]) -> int:
        # The cache holds everything but the last token; each step evaluates that one.
        return sync_cache(self.model, prompt_ids[:-1], self.batch)

    def _step(self, tokens_before: int, last: int, draft: Draft | None, params: SamplingParams,
              rng: np.random.Generator, size: int) -> StepResult:
        """Evaluate `last` and the draft, padded to `size` tokens, and verify the draft."""
        if len(self.model.cached) != tokens_before - 1:  # e.g. after a cancelled request
            raise RuntimeError("model cache out of step with the session")
        draft_ids = draft.token_ids if draft else []
        n_rows = len(draft_ids) + 1
        padding = [last] * (size - n_rows)  # their rows are not read; truncate drops them
        t0 = time.perf_counter()
        rows = self.model.evaluate([last, *draft_ids, *padding], size)[:n_rows]
        seconds = time.perf_counter() - t0
        verdict = verify(draft_ids, rows, params, rng, draft.dists if draft else None)
        self.model.truncate(tokens_before + len(verdict.accepted))
        return StepResult(verdict, n_rows, seconds, draft.back_id if draft else "", size)

    def calibrate(self, passes: int = 2) -> None:
        """Price verify batches of 1..max_draft+1 tokens (the fastest of `passes`), before
        serving, so that lead need not explore batch sizes on live replies. Blocking; runs
        on the model thread, as every evaluation must."""
        self.model_thread.call(self._calibrate, passes)

    def _calibrate(self, passes: int) -> None:
        sizes = range(1, min(self.max_draft + 1, CALIBRATE_MAX_BATCH) + 1)
        log.info("pricing verify batches of 1-%d tokens", sizes[-1])
        best: dict[int, float] = {}
        self.model.evaluate([0], 1)  # the first evaluation allocates; it is not timed
        for _ in range(passes):
            for b in sizes:
                self.model.truncate(0)
                t0 = time.perf_counter()
                self.model.evaluate([0] * b, b)
                best[b] = min(best.get(b, 1e9), time.perf_counter() - t0)
        self.model.truncate(0)
        self.cost.calibrate(best)
        log.info("%s", self.cost.describe())

    # --- generation ---
    async def generate(self, req: GenRequest) -> AsyncIterator[Emission]:
        """Queue, then run one generation, yielding text as it is decided."""
        if self._lock.locked() and self._waiting >= self.max_queue:
            self.metrics.rejected += 1
            raise QueueFull()
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        try:
            async for emission in self._run(req):
                yield emission
        finally:
            await self._finish()
            self._lock.release()

    async def _run(self, req: GenRequest) -> AsyncIterator[Emission]:
        session = Session(id=f"s{next(self._ids)}-{uuid.uuid4().hex[:8]}",
                          tokens=list(req.prompt_ids), n_prompt=len(req.prompt_ids),
                          params=req.params, rng=make_rng(req.params.seed))
        self.board.clear()
        self.session = session
        await self._notify()
        session.prompt_evaluated = await self.model_thread.run(self._prefill, req.prompt_ids)
        session.t_decode = time.perf_counter()
        text = TextStream(req.stop)
        watch: OfferWatch | None = None
        while session.finish_reason is None:
            # Serial on purpose: Python work overlapping a step would preempt llama.cpp's
            # threads on a fully used CPU (measured: lead fell to 0.82x of a raw loop).
            offered = self.board.best(session.tokens, self.max_draft)
            first = session.n_generated == 0
            busy = self.backs.active() > 0 and self._wanted(session) > 0  # a back drafting
            draft = self._to_verify(session, offered, req.max_tokens)
            size = self.cost.batch_for(len(draft.token_ids) + 1) if draft else 1
            result = await self.model_thread.run(
                self._step, len(session.tokens), session.tokens[-1], draft, session.params,
                session.rng, min(size, self.model.n_ctx - len(session.tokens) + 1))
            if offered is not None:  # verified or not, an offer shows what drafts are worth
                watch = self._watch(watch, session, offered.token_ids, first)
            emitted = self._apply(session, result, req.max_tokens, busy)
            watch = self._settle(watch, session)
            self._say_hush()
            if log.isEnabledFor(logging.DEBUG):
                self._trace(session, offered, result)
            await self._notify()
            for i, token in enumerate(emitted):
                chunk = "" if token in self.model.eos_token_ids else \
                    text.push(self.model.token_bytes(token))
                yield Emission(chunk, 1, int(i < len(result.verdict.accepted)))
            if text.stopped:
                session.finish_reason = "stop"
        self._settle(watch, session)  # a stop string ended the reply with an offer watched
        yield Emission(text.finish(), 0, 0, session=session)

    def _watch(self, watch: OfferWatch | None, session: Session, draft_ids: Sequence[int],
               first: bool) -> OfferWatch:
        """The offer to watch: the watched one, extended if this offer continues it; or
        this one, after recording a used-up watch that it does not continue."""
        if watch is not None:
            longer = watch.extended(session.tokens, draft_ids)
            if longer is not watch or not watch.used_up(session.tokens):
                return longer
            self.cost.record_outcome(*watch.result(session.tokens), watch.first)
        return OfferWatch(len(session.tokens), tuple(draft_ids), first, max(self.max_draft, 1))

    def _settle(self, watch: OfferWatch | None, session: Session) -> OfferWatch | None:
        """Record the watched offer's outcome once lead's tokens settle it; keep watching
        it otherwise."""
        if watch is None:
            return None
        settled = watch.outcome(session.tokens, final=session.finish_reason is not None)
        if settled is None:
            return watch
        self.cost.record_outcome(*settled, watch.first)
        return None

    def _to_verify(self, session: Session, draft: Draft | None, max_tokens: int
                   ) -> Draft | None:
        """The offered draft cut to the length that pays and fits the context and the
        reply (a step emits its accepted tokens and one more)."""
        room = min(self.model.n_ctx - len(session.tokens),  # KV room for draft tokens
                   max_tokens - session.n_generated - 1)
        if draft is None:
            return None
        usable = self.cost.choose(min(len(draft.token_ids), room), session.n_generated == 0)
        if usable == 0:
            return None
        dists = draft.dists[:usable] if draft.dists else None
        return Draft(draft.back_id, draft.token_ids[:usable], dists)

    def _say_hush(self) -> None:
        if self.cost.hush == self._hushed:
            return
        self._hushed = self.cost.hush
        if self._hushed:
            log.info("backs hushed: lead's steps take %.2fx their quiet time while a back "
                     "works, more than even perfect drafts could make up", self.cost.slowdown)
        else:
            log.info("backs asked again: a probe measures what they cost and give")

    def _trace(self, session: Session, offered: Draft | None, result: StepResult) -> None:
        log.debug("step %d: offered %d, verified %d, accepted %d in %.0f ms; alpha %.2f, "
                  "slowdown %.2f, wanted %d%s", session.steps,
                  len(offered.token_ids) if offered else 0, result.batch - 1,
                  len(result.verdict.accepted), result.seconds * 1000, self.cost.alpha,
                  self.cost.slowdown, self.cost.wanted(), " (probe)" if self.cost.probing else "")

    def _apply(self, session: Session, result: StepResult, max_tokens: int, busy: bool
               ) -> list[int]:
        verdict = result.verdict
        drafted = result.batch - 1
        self.cost.record_step(result.evaluated, result.seconds, busy)
        emitted = verdict.emitted[: max_tokens - session.n_generated]
        eos = next((i for i, t in enumerate(emitted) if t in self.model.eos_token_ids), None)
        if eos is not None:
            emitted = emitted[: eos + 1]
            session.finish_reason = "stop"
        accepted = min(len(verdict.accepted), len(emitted))  # none counted past an EOS
        session.drafted += drafted
        session.rejections += int(len(verdict.accepted) < drafted)
        session.accepted += accepted
        if drafted:
            by_back = session.accepted_by_back
            by_back[result.back_id] = by_back.get(result.back_id, 0) + accepted
        session.steps += 1
        session.tokens.extend(emitted)
        if session.finish_reason is None and (session.n_generated >= max_tokens
                                              or len(session.tokens) >= self.model.n_ctx):
            session.finish_reason = "length"
        return emitted

    async def _finish(self) -> None:
        session = self.session
        if session is None:
            return
        if session.finish_reason is None:
            session.finish_reason = "cancelled"
        session.done = True
        self.board.clear()
        self.metrics.record_session(session, time.perf_counter())
        log.info("%s", self.metrics.session_line(session, time.perf_counter()))
        await self._notify()

    # --- back protocol ---
    async def _notify(self) -> None:
        self.version += 1
        news, self._news = self._news, asyncio.Event()
        news.set()

    def state(self, offset: int = 0, back_id: str = "") -> State:
        s = self.session
        if s is None:
            return State(version=self.version, lead_id=self.lead_id)
        offset = min(max(offset, 0), len(s.tokens))
        return State(version=self.version, lead_id=self.lead_id, session_id=s.id, offset=offset,
                     token_ids=s.tokens[offset:], n_tokens=len(s.tokens), n_prompt=s.n_prompt,
                     done=s.done, draft_len=0 if s.done else self._wanted(s),
                     hush=self.cost.hush,
                     sampling=s.params, your_accepted=s.accepted_by_back.get(back_id, 0))

    async def wait_state(self, since: int, timeout: float, quiet_session: str | None = None,
                         idle: bool = False) -> None:
        """Long-poll: return as soon as the state's version passes `since`, or at timeout.

        A back that may not draft (draft length 0) passes its session as `quiet_session`:
        it is then woken only when drafts are wanted or the session changes or ends, so
        a back that cannot help costs lead no request per token. With `idle` (a back that
        sits out) it is not woken when drafts are wanted either."""
        deadline = time.monotonic() + timeout
        while not (self.version > since and self._news_for(quiet_session, idle)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that lands as its event is set, and the poll lived on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._news.wait()

    def _news_for(self, quiet_session: str | None, idle: bool = False) -> bool:
        s = self.session
        if quiet_session is None or s is None or s.id != quiet_session or s.done:
            return True
        return not idle and self._wanted(s) > 0

    def _wanted(self, s: Session) -> int:
        return self.cost.wanted(first=s.n_generated == 0)

    def post_draft(self, session_id: str, start: int, token_ids: list[int],
                   dists: list[Dist] | None, back_id: str) -> bool:
        self.backs.seen(back_id)
        s = self.session
        self.metrics.drafts_posted += 1
        if s is None or s.done or s.id != session_id:
            self.metrics.drafts_stale += 1
            return False
        useful = self.board.post(s.tokens, Candidate(back_id, start, tuple(token_ids),
                                                     tuple(dists) if dists else None))
        self.metrics.drafts_stale += 0 if useful else 1
        return useful

    def gauges(self) -> dict[str, float]:
        return {"draft_len": self.cost.wanted(), "verify_len": self.cost.choose(),
                "backs_active": self.backs.active(), "queue_waiting": self._waiting,
                **self.cost.snapshot()}

    def shutdown(self) -> None:
        self.model_thread.shutdown()
