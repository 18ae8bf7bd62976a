"""The back's loop: follow lead's state, catch up, draft ahead, post, repeat.

The Worker wires small pieces to the network and the model thread: `LeadMirror` (its
copy of lead's state), `Sessions` (stats and draft generator per session), `PostBook`
(what it posted), `jobs` (the model-thread work) and `Backoff` (reconnecting). Only the
event loop touches them; model-thread jobs get what they need as arguments and return
what they did. With nothing to do it waits on lead's long-poll. A failure means "lead is
gone for now": it logs once, retries with backoff and resumes; only the few that
retrying cannot fix stop the back, and a draft model failing ends only that session's
drafting (back/failures.py). How the loop works, and why: docs/back-loop.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from back import jobs
from back.backoff import Backoff
from back.client import BadAnswer, LeadClient, LeadError
from back.drafter import Drafter, ModelDrafter
from back.failures import BackFatal, Flaps, IncompatibleModel, ModelFailed, brief, fatal, outage
from back.jobs import Drafted, DraftJob, LatestTokens, ahead_for
from back.mirror import LeadMirror
from back.posts import PostBook
from back.sessions import Sessions, SessionStats
from back.tree import hanging_off
from back.width import DraftPrices, StepClock, choose_width
from shared.modelthread import ModelThread
from shared.placement import Placement
from shared.protocol import DraftPost, Info, State, grammar_id

__all__ = ["BackFatal", "IncompatibleModel", "Worker"]
log = logging.getLogger("back")
T = TypeVar("T")


class Worker:
    def __init__(self, client: LeadClient, drafter: Drafter, fingerprint: str | None,
                 n_vocab: int | None, max_ahead: int = 16, back_id: str = "") -> None:
        self.client, self.drafter = client, drafter
        self.fingerprint, self.n_vocab = fingerprint, n_vocab
        self.max_ahead = max_ahead
        self.back_id = back_id or f"{socket.gethostname()}-{os.getpid()}"
        self.max_post = max_ahead  # (lead's limit, from the handshake)
        self.eos_token_ids: frozenset[int] = frozenset()
        self.burst = 1  # tokens drafted per model-thread job (ngram drafting is free: more)
        self.send_dists = True
        self.branches = 0  # most branches grown beside the draft (0: the main chain only)
        self.prices = DraftPrices()  # the draft model's seconds per call, by batch size
        self._width = 0  # the last width chosen (logged when it changes)
        self.lead_step = StepClock()  # lead's step time, from its states
        # Called with lead's Info at every handshake, before any model work: where this
        # back runs, and so whether it sits out or works only when asked (beside lead).
        self.on_attach: Callable[[Info], Awaitable[Placement]] | None = None
        self.placement = Placement(None, 1)
        self.mirror = LeadMirror(drafter.fits)
        self.sessions = Sessions()
        self.posts = PostBook()
        self.backoff = Backoff()
        self.flaps = Flaps()
        self._refused_in: str | None = None  # the session a refused post was logged for
        self.model_thread = ModelThread("draft")
        self._latest = LatestTokens()  # lead's tokens, for the model thread's abort check
        self._stop = asyncio.Event()
        self._news = asyncio.Event()  # set when a state was taken, or the watch ended

    @property
    def state(self) -> State:
        """Lead's state as last taken."""
        return self.mirror.state

    @property
    def stats(self) -> SessionStats | None:
        """The stats of the session being followed."""
        return self.sessions.current

    @property
    def sessions_done(self) -> list[SessionStats]:
        """The last few sessions that ended (`sessions.totals` counts all of them)."""
        return list(self.sessions.recent)

    @property
    def outages(self) -> int:
        return self.backoff.outages

    def stop(self) -> None:
        self._stop.set()
        self._news.set()

    # --- outer loop: connection and backoff ---
    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.handshake()
                if (down := self.backoff.reached(time.monotonic())) is not None:
                    log.info("lead is back after %.1f s", down)
                await self.follow()
            except BackFatal:
                raise
            except Exception as exc:  # whatever lead, the network or a bug throws
                if (stop := fatal(exc, self.client.base_url, bool(self.mirror.lead_id))):
                    raise stop from None
                await self._back_off(exc)
        self.close()

    async def _back_off(self, exc: Exception) -> None:
        began, wait = self.backoff.failed(time.monotonic())
        if began:
            log.warning("%s (%s); retrying with backoff", outage(exc), brief(exc))
        log.debug("failure", exc_info=exc)
        await self._sleep(self.flaps.wait(wait, self.backoff.first, self.backoff.most))

    def close(self) -> None:
        self._end_session()  # a back stopped mid-session still reports it
        self.model_thread.shutdown(wait=False)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):  # (asyncio.timeout: see Engine.wait_state)
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def handshake(self) -> Info:
        self.flaps.steady = False
        try:
            info = await self.client.info()
        except BadAnswer as exc:  # an answer, but no Info: another server, or another duo
            if self.mirror.lead_id:
                raise  # attached before: something answers while lead restarts
            raise BackFatal(f"{self.client.base_url}/duo/info is not a duo lead's answer: "
                            f"{brief(exc)}") from None
        if self.n_vocab is not None and (info.n_vocab != self.n_vocab
                                         or info.fingerprint != self.fingerprint):
            raise IncompatibleModel(
                f"draft model does not match lead's {info.model}: vocabulary {self.n_vocab} vs "
                f"{info.n_vocab}, token table {self.fingerprint} vs {info.fingerprint}")
        if self.on_attach is not None:
            self.placement = await self.on_attach(info)
        self.max_post = max(1, min(self.max_ahead, info.max_post))
        self.eos_token_ids = frozenset(info.eos_token_ids)
        self.mirror.attach(info.lead_id)  # lead may have restarted: versions start over
        log.info("attached to lead: model %s, context %d, max draft %d", info.model, info.n_ctx,
                 info.max_draft)
        return info

    # --- inner loop: one lead ---
    async def follow(self) -> None:
        """Follow one lead: one long-poll stays open throughout (`_watch`) and takes its
        news as it comes; drafting runs whenever lead wants drafts."""
        watch = asyncio.create_task(self._watch())
        try:
            while not self._stop.is_set() and not watch.done():
                self._news.clear()
                try:
                    await self._draft_ahead()
                except ModelFailed as exc:
                    log.warning("session %s: the draft model failed (%s); not drafting for "
                                "it", exc.session_id, exc)
                    self.mirror.skip(exc.session_id)
                await self._news.wait()
            if watch.done():
                watch.result()  # its error ends this lead: run() backs off and retries
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def _watch(self) -> None:
        try:
            while not self._stop.is_set():
                await self._fetch_grammar()
                state = await self._poll()
                if state is None:
                    continue
                if self.mirror.other_lead(state):
                    log.info("lead restarted; starting over")
                    await self.handshake()
                    continue
                self._settle(state)
                self.flaps.steady = True
        finally:
            self._news.set()  # wake follow(): it reads how the watch ended

    async def _poll(self) -> State | None:
        """Lead's next state (a long-poll); None where lead asked the back to wait (429)."""
        sit_out = self.placement.sit_out
        try:
            return await self.client.state(self.state.version, len(self.mirror.tokens),
                                           back_id=self.back_id,
                                           quiet=self.mirror.quiet(sit_out), idle=sit_out)
        except LeadError as exc:
            if exc.status != 429:
                raise
            await self._sleep(exc.retry_after)
            return None

    async def _fetch_grammar(self) -> None:
        """The followed session's grammar text, once, where a state named one not held."""
        gid, sid = self.mirror.missing_grammar(), self.state.session_id
        if gid is None or sid is None:
            return
        try:
            got = await self.client.grammar(sid)
        except LeadError as exc:
            if exc.status != 404:
                raise
            got = None  # that session is over (or lead's a stranger to it)
        if got is None or got.session_id != sid or grammar_id(got.grammar) != gid:
            log.info("session %s: lead sent no grammar named %s; not drafting for it", sid, gid)
            self.mirror.skip(sid)
        else:
            self.mirror.hold_grammar(gid, got.grammar)
        self._news.set()

    def _settle(self, reply: State | None) -> None:
        """Take a state from the watch or a post's reply, unless a newer one came first."""
        if reply is None or (taken := self.mirror.take(reply)) is None:
            return
        log.debug("state v%d: %d tokens, draft_len %d", reply.version, reply.n_tokens,
                  reply.draft_len)
        if taken.new_session:
            self._begin_session(reply)
        if not taken.refetch:
            self._latest.publish(self.mirror.tokens)
            self.lead_step.note(len(self.mirror.tokens), time.monotonic())
            if taken.outgrew:
                log.warning("session %s: lead holds %d tokens, more than this draft model's "
                            "context; not drafting for it (raise --ctx-size)",
                            reply.session_id, len(self.mirror.tokens))
            self.sessions.accepted(reply.your_accepted)
            if reply.done:
                self._end_session()
        self._news.set()

    def _begin_session(self, state: State) -> None:
        self._end_session()
        self.posts.new_session()
        self.lead_step.restart()
        if state.session_id is not None and not state.done:
            self.sessions.start(state.session_id, state.sampling.seed)

    def _end_session(self) -> None:
        ended = self.sessions.end()
        if ended is not None:
            log.info("%s", ended.line())

    def _should_draft(self) -> bool:
        return self.mirror.should_draft(self.placement.sit_out)

    async def _draft_ahead(self) -> None:
        """Draft and post as we go, until nothing is left to draft or post. A post's reply
        is not awaited before drafting on (a round trip costs about a draft token), and the
        next model call starts before this one's result is posted; one post is in flight at
        a time, so posts arrive in order, each with the whole draft."""
        if self.mirror.following and not self._should_draft():
            # Take in lead's tokens all the same, so that a probe finds this back ready;
            # not where that work slows lead: beside it, hushed by it, or sitting out.
            if not (self.state.hush or self.placement.beside_lead or self.placement.sit_out):
                await self._catch_up()
            return
        in_flight: asyncio.Task[State | None] | None = None
        job: asyncio.Task[Drafted] | None = None
        try:
            while self._should_draft() and not self._stop.is_set():
                drafted = await (job or asyncio.create_task(self._extend()))
                job = asyncio.create_task(self._extend()) if drafted.changed else None
                if in_flight is not None and (not drafted.changed or in_flight.done()):
                    self._settle(await in_flight)
                    in_flight = None
                if in_flight is None:
                    in_flight = self._launch_post(drafted)
                    if in_flight is None and not drafted.changed:
                        return  # nothing new to draft or post: wait for lead's news
            if in_flight is not None:
                self._settle(await in_flight)
                in_flight = None
        finally:
            if in_flight is not None:
                in_flight.cancel()
            if job is not None:  # (its model call cannot be stopped: its result is kept)
                await asyncio.gather(job, return_exceptions=True)

    async def _on_model(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the model thread; its failure is the session's (ModelFailed)."""
        session_id = self.state.session_id
        try:
            return await self.model_thread.run(fn, *args)
        except Exception as exc:
            raise ModelFailed(session_id, exc) from exc

    async def _catch_up(self) -> None:
        stats = self.sessions.current
        work = await self._on_model(jobs.catch_up, self.drafter, self.mirror.tokens)
        self.sessions.add(stats, work)  # dropped if that session ended meanwhile

    async def _extend(self) -> Drafted:
        stats, state = self.sessions.current, self.state
        job = DraftJob(self.mirror.tokens, state.sampling,
                       ahead_for(state.draft_len, self.max_post), self.burst,
                       self.eos_token_ids, self.sessions.rng, self._latest,
                       n_prompt=state.n_prompt, width=self.width(),
                       depth=min(max(1, state.draft_len), self.max_post - 1))
        drafted = await self._on_model(jobs.extend, self.drafter, job)
        self.sessions.add(stats, drafted.work)  # dropped if that session ended meanwhile
        self.posts.drafted(len(job.lead_tokens), drafted.kept, drafted.dists, drafted.probs)
        for tokens, seconds in drafted.calls:
            self.prices.note(tokens, seconds)
        return drafted

    def width(self) -> int:
        """Branches to grow beside the draft: as many as the draft's measured price per
        call leaves it time for in lead's measured step (back/width.py)."""
        if not (self.branches and self.max_post > 1 and isinstance(self.drafter, ModelDrafter)
                and self.drafter.can_branch):
            return 0
        width = choose_width(self.prices, self.lead_step.step_s,
                             ahead_for(self.state.draft_len, self.max_post), self.branches)
        if width != self._width:
            log.debug("branches: %d (draft call %s; lead step %s s)", width,
                      self.prices, self.lead_step.step_s)
            self._width = width
        return width

    def _launch_post(self, drafted: Drafted) -> asyncio.Task[State | None] | None:
        # A draft on a path lead has left since (its news came while the model thread
        # drafted) is not posted: at lead's new length it would read as a fresh draft.
        local = drafted.local
        draft = self.mirror.draft_past(local)
        if draft is None:
            return None
        start = len(self.mirror.tokens)
        made = self.posts.next_post(self.state.session_id or "", start,
                                    draft[:self.max_post], self.back_id, self.send_dists,
                                    hanging_off(local, drafted.branches), self.max_post)
        if made is None:
            return None
        post, new_tokens = made
        self.sessions.posted(new_tokens)
        log.debug("post %d tokens at %d, %d branches", len(post.token_ids), start,
                  len(post.branches))
        return asyncio.create_task(self._post(post))

    async def _post(self, post: DraftPost) -> State | None:
        try:
            return await self.client.post_draft(post)
        except LeadError as exc:
            if exc.status == 429:
                await self._sleep(exc.retry_after)  # lead asked this back to post less often
                return None
            if not 400 <= exc.status < 500 or exc.status == 401:
                raise
            if self._refused_in != post.session_id:  # one line per session, not per post
                log.warning("lead refused a draft post (%s); dropped", brief(exc))
                self._refused_in = post.session_id
            return None
