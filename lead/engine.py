"""The lead's engine: one generation at a time, drafts verified, never awaited.

It joins four jobs, each its own class: Admission (the queue), Decoder (prefill, step,
verify, apply on the model thread), OfferLedger (what offers were worth, fed to the
cost model) and BackFeed (what backs see and post). All session state lives on the
event loop; model work runs on one dedicated thread, so model calls are serialised
even when a cancelled request leaves a step running.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence

from lead.admission import Admission, Place, QueueFull
from lead.backfeed import BackFeed
from lead.cost import CostModel
from lead.decoder import Clock, Decoder
from lead.drafts import Branch, Candidate, Draft
from lead.live import LiveNews
from lead.metrics import Metrics
from lead.offers import OfferLedger
from lead.owndrafts import OWN, OwnDrafts
from lead.session import Emission, GenRequest, Session, StepResult
from lead.textstream import TextStream
from shared.model import Model
from shared.modelthread import ModelThread
from shared.protocol import MAX_DRAFT_WIRE
from shared.sampling import Dist, make_rng

__all__ = ["Emission", "Engine", "GenRequest", "QueueFull", "Session"]
log = logging.getLogger("lead")


class Engine:
    def __init__(self, model: Model, max_draft: int = 8, draft_len: int | None = None,
                 max_queue: int = 8, batch: int = 512, clock: Clock = time.perf_counter,
                 tree: int = 0, grammar_s: float = 1.0, ngram: int = 0) -> None:
        """`clock` times steps for the cost model (tests give fakes a virtual one); `tree`:
        most branches verified beside a draft (the model's branch slots bound it)."""
        self.model, self.max_draft, self.clock = model, max_draft, clock
        self.max_post = min(2 * max_draft, MAX_DRAFT_WIRE)  # this step's draft and the next's
        self.cost = CostModel(max_draft=max_draft, fixed=draft_len, longest=ngram)
        # lead's own drafts (`ngram`: their most tokens; 0, or no drafts at all: none)
        self.own = OwnDrafts(ngram) if ngram and max_draft else None
        self.metrics = Metrics()
        self.admission = Admission(max_queue)
        self.model_thread = ModelThread("model")  # every model call, calibration too
        self.decoder = Decoder(model, self.cost, self.model_thread, clock, batch, grammar_s)
        self.decoder.tree_slots = self.cost.tree_width = min(tree, self.decoder.tree_slots)
        self.live = LiveNews()  # what the web page's live panel is woken by
        self.feed = BackFeed(self.cost, self.metrics, on_arrival=self.live.bump)
        self._ids = itertools.count(1)

    @property
    def session(self) -> Session | None:
        return self.feed.session

    def calibrate(self, passes: int = 2) -> None:
        """Price verify batches before serving (blocking)."""
        self.decoder.calibrate(self.max_draft, passes, self.own.longest if self.own else 0)

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
            session = self._new_session(req)
            try:
                async for emission in self._run(req, session):
                    yield emission
            finally:
                self._finish(session)

    def _new_session(self, req: GenRequest) -> Session:
        return Session(id=f"s{next(self._ids)}-{uuid.uuid4().hex[:8]}",
                       tokens=list(req.prompt_ids), n_prompt=len(req.prompt_ids),
                       params=req.params, rng=make_rng(req.params.seed),
                       constraint=req.constraint, t_start=self.clock())

    async def _run(self, req: GenRequest, session: Session) -> AsyncIterator[Emission]:
        self.feed.start(session)
        self.live.bump()
        await self.decoder.prefill(session)
        text = TextStream(req.stop)
        offers = OfferLedger(self.cost.record_outcome, max(self.max_draft, 1))
        after_rejection = False
        while session.finish_reason is None:
            # One hop at a time, on purpose: Python work overlapping a step would preempt
            # llama.cpp's threads on a fully used CPU.
            offered = self._offered(session)
            busy = self.feed.back_drafting(session)
            first = session.n_generated == 0
            draft = self.decoder.plan(session, offered, req.max_tokens)
            self.metrics.record_step(after_rejection, bool(offered and offered.token_ids),
                                     bool(draft and offered and offered.branch))
            result = await self.decoder.step(session, draft, req.top_logprobs)
            self.metrics.record_tree(result.tree, result.verdict.branch is not None)
            after_rejection = result.rejected
            if offered is not None and offered.back_id != OWN:  # verified or not, a back's
                # offer shows what backs' drafts are worth (lead's own are priced apart)
                offers.offered(session.tokens, offered.token_ids, first)
            emitted = self.decoder.apply(session, result, req.max_tokens, busy)
            chunks = self._texts(emitted, text)
            if text.stopped:  # tokens past a stop string are no part of the reply
                self.decoder.cut(session, len(emitted) - len(chunks))
                session.finish_reason = "stop"
            offers.settle(session.tokens, final=session.finish_reason is not None)
            self.feed.log_hush()
            if log.isEnabledFor(logging.DEBUG):
                self._trace(session, offered, result)
            self.feed.notify()
            for i, chunk in enumerate(chunks):
                yield self._emission(result, i, emitted[i], chunk)
        offers.settle(session.tokens, final=True)  # a stop string may end a watched offer
        yield Emission(text.finish(), 0, 0, session=session)

    def _offered(self, session: Session) -> Draft | None:
        """The draft on the board expected to yield the most, lead's own among them."""
        tokens = session.tokens
        own = self.own.propose(session.id, tokens) if self.own is not None else None
        if own is not None:
            self.feed.board.post(tokens, Candidate(OWN, len(tokens), own[0], odds=own[1]))
        return self.feed.board.best(tokens, self.max_draft)

    def _texts(self, emitted: list[int], text: TextStream) -> list[str]:
        """The text each token releases, up to the one that completes a stop string."""
        chunks: list[str] = []
        for token in emitted:
            eos = token in self.model.eos_token_ids
            chunks.append("" if eos else text.push(self.model.token_bytes(token)))
            if text.stopped:
                break
        return chunks

    def _emission(self, result: StepResult, i: int, token: int, chunk: str) -> Emission:
        """The step's i-th token, `token`, releasing `chunk`."""
        drafted = result.from_draft(i)
        # An end-of-generation token has no logprob entry: its text is no part of the reply.
        logprobs = [] if result.logprobs is None or token in self.model.eos_token_ids else \
            [result.logprobs[i]]
        return Emission(chunk, 1, int(drafted), back=result.back_id if drafted else "",
                        logprobs=logprobs)

    def _finish(self, session: Session) -> None:
        """End `session`, the one this generation made (the feed's may be another by now
        only if this one never started: then nothing of the feed is touched)."""
        if session.finish_reason is None:
            session.finish_reason = "cancelled"
        session.done = True
        now = self.clock()
        self.metrics.record_session(session, now)
        log.info("%s", self.metrics.session_line(session, now))
        self.feed.backs.credit(session.drafted_by_back, session.accepted_by_back)
        if self.feed.session is session:
            self.feed.end()
        self.live.add_reply(session, now)

    def _trace(self, session: Session, offered: Draft | None, result: StepResult) -> None:
        cost = self.cost
        log.debug("step %d: offered %d, verified %d, accepted %d in %.0f ms; alpha %.2f, "
                  "slowdown %.2f, wanted %d%s", session.steps,
                  len(offered.token_ids) if offered else 0, result.batch - 1,
                  len(result.verdict.accepted), result.seconds * 1000, cost.alpha,
                  cost.slowdown, cost.wanted(), " (probe)" if cost.probing else "")

    def post_draft(self, session_id: str, start: int, token_ids: list[int],
                   dists: list[Dist] | None, back_id: str, branches: Sequence[Branch] = ()
                   ) -> bool:
        return self.feed.post_draft(session_id, start, token_ids, dists, back_id, branches)

    def gauges(self) -> dict[str, float]:
        return {"draft_len": self.cost.wanted(), "verify_len": self.cost.choose(),
                "backs_active": self.feed.backs.active(),
                "queue_waiting": self.admission.waiting, **self.cost.snapshot()}

    def shutdown(self) -> None:
        self.live.close()
        self.model_thread.shutdown()
