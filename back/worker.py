"""The back's loop: follow lead's sessions, catch up, draft ahead for every one that wants
drafts in one model call, post, repeat.

Only the event loop touches the pieces wired here (a `Link`, a `Follower` per session on
a slot of the draft model of its own, the drafting in back/batcher.py); model-thread jobs
get what they need as arguments and return what they did. A failure means "lead is gone
for now" (logged once, retried with backoff) but for those back/failures.py names. How the
loop works, and why: docs/back-loop.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from back.backoff import Backoff
from back.batcher import DraftBatcher
from back.client import LeadClient, LeadError
from back.drafter import Drafter
from back.failures import BackFatal, ModelFailed, brief, fatal, outage
from back.follower import Follower
from back.leadlink import NEWS_S, Link
from back.mirror import GRAMMARS_KEPT, LeadMirror
from back.stats import History
from shared.bounded import Lru
from shared.model import reusing_slot
from shared.placement import Placement
from shared.wire.protocol import Hello, Info, Update, grammar_id

__all__ = ["BackFatal", "Worker"]
log = logging.getLogger("back")


class Worker:
    def __init__(self, client: LeadClient, drafter: Drafter | Sequence[Drafter],
                 fingerprint: str | None, n_vocab: int | None, max_ahead: int = 16,
                 back_id: str = "", model: Any = None) -> None:
        """`drafter`: one per slot of `model` (back/batcher.py); one alone follows one
        session."""
        self.client = client
        self.fingerprint, self.n_vocab = fingerprint, n_vocab
        self.max_ahead = max_ahead
        self.back_id = back_id or f"{socket.gethostname()}-{os.getpid()}"
        drafters = [drafter] if not isinstance(drafter, Sequence) else list(drafter)
        self.batcher = DraftBatcher(drafters, model, self.back_id, max_ahead)
        # lead's step as the last session measured it: a new session's first drafts (those
        # made while lead evaluates its prompt) grow branches before its own steps are seen
        self.lead_step_s: float | None = None
        # Called with lead's Info at every handshake, before any model work: where this
        # back runs, and so whether it sits out or works only when asked (beside lead).
        self.on_attach: Callable[[Info], Awaitable[Placement]] | None = None
        self.placement = Placement(None, 1)
        self.lead_id = ""
        self.followers: dict[str, Follower] = {}  # by session id
        self.version = -1  # of the last update taken (-1: none from this lead yet)
        self.history = History()
        self.grammars: Lru[str, str] = Lru(GRAMMARS_KEPT)  # id -> text, shared by the mirrors
        self.ignored: set[str] = set()  # sessions not followed: no slot was free
        self.backoff = Backoff()
        self._link: Link | None = None
        self._wants: Hello | None = None  # as last told to lead
        self._stop = asyncio.Event()
        self._news = asyncio.Event()  # set when news was taken, or the link ended

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
                if (stop := fatal(exc, self.client.base_url, bool(self.lead_id))):
                    raise stop from None
                await self._back_off(exc)
        self.close()

    async def _back_off(self, exc: Exception) -> None:
        began, wait = self.backoff.failed(time.monotonic())
        if began:
            log.warning("%s (%s); retrying with backoff", outage(exc), brief(exc))
        log.debug("failure", exc_info=exc)
        with contextlib.suppress(TimeoutError):  # (asyncio.timeout: see shared/broadcast.py)
            async with asyncio.timeout(wait):
                await self._stop.wait()

    def close(self) -> None:
        for sid in list(self.followers):  # a back stopped mid-session still reports it
            self._end(sid)
        self.batcher.model_thread.shutdown(wait=False)

    async def handshake(self) -> None:
        self.backoff.steady = False
        info = await self.client.info()
        if self.n_vocab is not None and (info.n_vocab != self.n_vocab
                                         or info.fingerprint != self.fingerprint):
            raise BackFatal(
                f"draft model does not match lead's {info.model}: vocabulary {self.n_vocab} vs "
                f"{info.n_vocab}, token table {self.fingerprint} vs {info.fingerprint}")
        if self.on_attach is not None:
            self.placement = await self.on_attach(info)
        self.batcher.attached(max(1, min(self.max_ahead, info.max_post)),
                              frozenset(info.eos_token_ids))
        if info.lead_id != self.lead_id:  # lead restarted (or a first attach): start over
            for sid in list(self.followers):
                self._end(sid)
            self.version, self.lead_step_s = -1, None
        if not info.link:
            raise BackFatal(f"lead at {self.client.base_url} serves no link (GET /duo/link): "
                            "it predates this back; run lead and back of one duo version")
        self.lead_id = info.lead_id
        log.info("attached to lead: model %s, context %d, max draft %d, %d slot%s", info.model,
                 info.n_ctx, info.max_draft, info.slots, "" if info.slots == 1 else "s")

    # --- inner loop: one lead ---
    async def follow(self) -> None:
        """Follow one lead over one link: its news taken as it comes (`_receive`), drafting
        whenever a session wants drafts."""
        async with (self.client.link() as socket_,
                    contextlib.aclosing(Link(socket_, time.monotonic)) as link):
            self._link, self._wants = link, None
            await self._tell_wants()
            receiver = asyncio.create_task(self._receive(link))
            try:
                while not self._stop.is_set() and not receiver.done():
                    self._news.clear()
                    with contextlib.suppress(ModelFailed):  # those sessions are skipped
                        await self._draft_ahead()
                    await self._news.wait()
                if receiver.done():
                    receiver.result()  # its error ends this lead: run() backs off and retries
            finally:
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
                self._link = None

    async def _receive(self, link: Link) -> None:
        try:
            async for update in link.updates():
                if update.lead_id != self.lead_id:
                    log.info("lead restarted; starting over")
                    await self.handshake()
                    continue
                self._take(update)
                self.backoff.steady = True
                await self._fetch_grammars()
                await self._tell_wants()
        finally:
            self._news.set()  # wake follow(): it reads how the link ended

    def _take(self, update: Update) -> None:
        """Take an update: each session's news to its follower (a new session gets one
        where a slot is free), the sessions gone ended."""
        if update.version < self.version:
            return  # older news (a lead restarting was handshaken anew: version -1)
        self.version = update.version
        for sid in update.ended:  # first: their slots are free for the sessions below
            self._end(sid)
        # when the news left lead (its step_left_s was measured then), on this back's clock
        now = time.monotonic() - (self._link.news_s if self._link is not None else NEWS_S)
        for news in sorted(update.sessions, key=lambda n: not n.done):  # ends first, again
            follower = self.followers.get(news.session_id) or self._begin(news)
            if follower is None:
                self.ignored.add(news.session_id)
                continue
            state = news.as_state(update.version, update.lead_id, follower.mirror.state.sampling,
                                  update.step_left_s)
            if follower.take(state, now):
                log.warning("session %s: lead holds %d tokens, more than this draft model's "
                            "context; not drafting for it (raise --ctx-size)",
                            news.session_id, len(follower.mirror.tokens))
            if news.done:
                self._end(news.session_id)
        self.ignored -= {s.session_id for s in update.sessions if s.done} | set(update.ended)
        self._news.set()

    def _begin(self, news: Any) -> Follower | None:
        """A follower for a session new to this back, on a free slot (None: none is free,
        or the session is over)."""
        taken = {f.slot for f in self.followers.values()}
        drafters = self.batcher.drafters
        free = [i for i in range(len(drafters)) if i not in taken]
        if news.done or not free or news.sampling is None or news.session_id in self.ignored:
            return None  # (without its sampling: news of a session begun unfollowed)
        # (a free slot's last job may still run on the model thread: a stale view of what
        # it holds only makes the choice worse, catching up reads the cache itself)
        slot = reusing_slot(news.token_ids if news.offset == 0 else (),
                            [tuple(d.local) for d in drafters], free)
        mirror = LeadMirror(drafters[slot].fits)
        mirror.grammars = self.grammars
        follower = Follower(news.session_id, slot, mirror, news.sampling.seed, self.lead_step_s)
        self.followers[news.session_id] = follower
        return follower

    def _end(self, session_id: str) -> None:
        follower = self.followers.pop(session_id, None)
        if follower is not None:
            self.lead_step_s = follower.lead_step.step_s or self.lead_step_s
            self.history.ended(follower.stats)
            log.info("%s", follower.stats.line())

    # --- drafting: which sessions, until nothing is left (back/batcher.py drafts them) ---
    def _drafting(self) -> list[Follower]:
        sit_out = self.placement.sit_out
        return [f for f in self.followers.values() if f.mirror.should_draft(sit_out)]

    async def _draft_ahead(self) -> None:
        """Draft for every session that wants drafts, in one model call a guess, posting as
        it goes, until nothing is left to draft or post (a post returns at once). Where no
        session wants drafts, take in lead's tokens all the same, so that a probe finds this
        back ready; not where that work slows lead: beside it, sitting out, or for a
        session lead says its backs slow (Stop.SLOWED)."""
        drafting = self._drafting()
        if not drafting:
            if not (self.placement.beside_lead or self.placement.sit_out):
                await self.batcher.catch_up(self.followers)
            return
        while drafting and not self._stop.is_set():
            if not await self.batcher.draft_once(drafting, self.followers, self._link):
                return  # nothing new to draft or post: wait for lead's news
            drafting = self._drafting()

    async def _fetch_grammars(self) -> None:
        """Each followed session's grammar text, once, where a state names one not held."""
        for follower in list(self.followers.values()):
            gid, sid = follower.mirror.missing_grammar(), follower.session_id
            if gid is None:
                continue
            try:
                got = await self.client.grammar(sid)
            except LeadError as exc:
                if exc.status != 404:
                    raise
                got = None  # that session is over (or lead's a stranger to it)
            if got is None or got.session_id != sid or grammar_id(got.grammar) != gid:
                log.info("session %s: lead sent no grammar named %s; not drafting for it",
                         sid, gid)
                follower.mirror.skipped = sid
            else:
                follower.mirror.hold_grammar(gid, got.grammar)

    async def _tell_wants(self) -> None:
        """Tell lead what news this back wants, where that changed: none but sessions
        starting and ending while it sits out; of a session it does not draft for, news
        only when it wants drafts."""
        sit_out = self.placement.sit_out
        quiet = sorted(sid for sid, f in self.followers.items() if f.mirror.quiet(sit_out))
        wants = Hello(back_id=self.back_id, kind=getattr(self.client, "kind", ""),
                      idle=sit_out, quiet=quiet[:64], ignored=sorted(self.ignored)[:64])
        if wants != self._wants and self._link is not None:
            self._wants = wants
            await self._link.hello(wants)
