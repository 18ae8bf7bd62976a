"""The back's loop: follow lead's state, catch up, draft ahead, post, repeat.

Never spins: with nothing to do it waits on lead's long-poll. Model work runs on
one thread; the network stays on the event loop. Any network failure means
"lead is gone for now": back logs once, retries with backoff and resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import numpy as np

from back.client import LeadClient, LeadError
from back.drafter import Drafter
from shared.modelthread import ModelThread
from shared.placement import Placement
from shared.protocol import DraftDist, DraftPost, Info, State
from shared.sampling import make_draft_rng

log = logging.getLogger("back")


class BackFatal(Exception):
    """A problem retrying cannot fix; the back stops with this one-line message."""


class IncompatibleModel(BackFatal):
    pass


@dataclass
class SessionStats:
    session_id: str
    catch_up_s: float = 0.0
    caught_up: int = 0
    drafted: int = 0
    posts: int = 0
    accepted: int = 0  # as lead reports back
    cut_short: int = 0  # draft evaluations stopped midway: lead had left their path
    t0: float = field(default_factory=time.perf_counter)

    def line(self) -> str:
        share = f" ({100 * self.accepted / self.drafted:.0f}%)" if self.drafted else ""
        return (f"session {self.session_id}: caught up {self.caught_up} tokens in "
                f"{self.catch_up_s:.2f} s; drafted {self.drafted} in {self.posts} posts, "
                f"accepted {self.accepted}{share}; dead drafts cut short: {self.cut_short}")


class Worker:
    def __init__(self, client: LeadClient, drafter: Drafter, fingerprint: str | None,
                 n_vocab: int | None, max_ahead: int = 16, back_id: str = "") -> None:
        self.client, self.drafter = client, drafter
        self.fingerprint, self.n_vocab = fingerprint, n_vocab
        self.max_ahead = max_ahead
        self.back_id = back_id or f"{socket.gethostname()}-{os.getpid()}"
        self.lead_tokens: list[int] = []
        self.state = State()
        self.lead_id = ""
        self.stats: SessionStats | None = None
        self.sessions_done: list[SessionStats] = []
        self.outages = 0
        self.max_post = max_ahead
        self.eos_token_ids: frozenset[int] = frozenset()
        self.burst = 1  # tokens drafted per post (ngram drafting is free: use more)
        self.send_dists = True
        self._dists: dict[int, DraftDist] = {}  # absolute position -> its draft distribution
        self._last_post: tuple[int, tuple[int, ...]] = (0, ())  # (start, token ids)
        self.model_thread = ModelThread("draft")
        self._stop = asyncio.Event()
        self._news = asyncio.Event()  # set when a state was taken, or the watch ended
        self._rng = np.random.default_rng()
        self._too_long: str | None = None  # a session longer than the draft model's context
        self._floor = -1  # no state older than this is taken, even while refetching
        self._news_seen = 0  # states taken so far
        self._parted_at = 0  # the state (by that count) that last parted from our draft
        # Called with lead's Info at every handshake, before any model work: where this
        # back runs, and so whether it sits out or works only when asked (beside lead).
        self.on_attach: Callable[[Info], Awaitable[Placement]] | None = None
        self.placement = Placement(None, 1)

    def stop(self) -> None:
        self._stop.set()
        self._news.set()

    # --- outer loop: connection and backoff ---
    async def run(self) -> None:
        delay, down_since = 0.25, None
        while not self._stop.is_set():
            try:
                await self.handshake()
                if down_since is not None:
                    log.info("lead is back after %.1f s", time.monotonic() - down_since)
                    down_since, delay = None, 0.25
                await self.follow()
            except (httpx.TransportError, LeadError) as exc:
                if isinstance(exc, LeadError) and exc.status == 401:
                    raise BackFatal("lead refused the API key: pass --api-key "
                                    "(or BACK_API_KEY)") from None
                if down_since is None:
                    down_since = time.monotonic()
                    self.outages += 1
                    log.warning("lead unreachable (%s); retrying with backoff", _brief(exc))
                await self._sleep(delay)
                delay = min(delay * 2, 5.0)
        self.close()

    def close(self) -> None:
        self._end_session()  # a back stopped mid-session still reports it
        self.model_thread.shutdown(wait=False)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):  # (asyncio.timeout: see Engine.wait_state)
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def handshake(self) -> Info:
        info = await self.client.info()
        if self.n_vocab is not None and (info.n_vocab != self.n_vocab
                                         or info.fingerprint != self.fingerprint):
            raise IncompatibleModel(
                f"draft model does not match lead's {info.model}: vocabulary {self.n_vocab} vs "
                f"{info.n_vocab}, token table {self.fingerprint} vs {info.fingerprint}")
        if self.on_attach is not None:
            self.placement = await self.on_attach(info)
        self.max_post = max(1, min(self.max_ahead, info.max_post))
        self.eos_token_ids = frozenset(info.eos_token_ids)
        self.state = State(version=-1)  # lead may have restarted: versions start over
        self._floor = -1
        self.lead_id = info.lead_id
        self.lead_tokens = []
        log.info("attached to lead: model %s, context %d, max draft %d", info.model, info.n_ctx,
                 info.max_draft)
        return info

    # --- inner loop: one lead ---
    async def follow(self) -> None:
        """Follow one lead: one long-poll stays open throughout (`_watch`) and takes lead's
        news as it comes; drafting runs whenever lead wants drafts. (A first version
        opened a second long-poll for each burst of drafting and dropped it after; lead
        held each dropped poll until its next step: an extra request per token.)"""
        watch = asyncio.create_task(self._watch())
        try:
            while not self._stop.is_set() and not watch.done():
                self._news.clear()
                await self._draft_ahead()
                await self._news.wait()
            if watch.done():
                watch.result()  # its error ends this lead: run() backs off and retries
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def _watch(self) -> None:
        try:
            while not self._stop.is_set():
                s = self.state
                quiet = s.session_id if s.session_id and not s.done and (
                    s.draft_len == 0 or s.session_id == self._too_long
                    or self.placement.sit_out) else ""
                state = await self.client.state(s.version, len(self.lead_tokens),
                                                back_id=self.back_id, quiet=quiet,
                                                idle=self.placement.sit_out)
                if state.lead_id != self.lead_id:  # (a lower version may just be stale)
                    log.info("lead restarted; starting over")
                    await self.handshake()
                    continue
                self._settle(state)
        finally:
            self._news.set()  # wake follow(): it reads how the watch ended

    def _absorb(self, state: State) -> None:
        """Take lead's state (its tokens from `state.offset` on) into lead_tokens."""
        if state.session_id != self.state.session_id:
            self._end_session()
            self.lead_tokens = []
            self._last_post = (0, ())
            if state.session_id is not None and not state.done:
                self.stats = SessionStats(state.session_id)
                self._rng = make_draft_rng(state.sampling.seed)
        if state.offset > len(self.lead_tokens):
            # Its tokens start past ours (we asked from our offset for an old session, or a
            # reconnect reset ours): splicing would garble them, so fetch them whole.
            self._floor = state.version
            self.state = state.model_copy(update={"version": -1})
            return
        self.lead_tokens = self.lead_tokens[:state.offset] + state.token_ids
        self.state = state
        self._news_seen += 1
        if self._draft_parted():
            self._parted_at = self._news_seen
        self._check_room()
        if self.stats:
            self.stats.accepted = max(self.stats.accepted, state.your_accepted)
        if state.done:
            self._end_session()

    def _check_room(self) -> None:
        """Sit out a session the draft model cannot hold (lead's context may be larger)."""
        sid = self.state.session_id
        if sid and not self.state.done and sid != self._too_long \
                and not self.drafter.fits(len(self.lead_tokens)):
            self._too_long = sid
            log.warning("session %s: lead holds %d tokens, more than this draft model's "
                        "context; not drafting for it (raise --ctx-size)", sid,
                        len(self.lead_tokens))

    def _draft_parted(self) -> bool:
        """Whether lead's tokens leave the path the model thread is drafting on."""
        local = self.drafter.local  # (read whole: the model thread may be extending it)
        n = min(len(local), len(self.lead_tokens))
        return local[:n] != self.lead_tokens[:n]

    def _end_session(self) -> None:
        if self.stats is not None:
            log.info("%s", self.stats.line())
            self.sessions_done.append(self.stats)
            self.stats = None

    def _following(self) -> bool:
        s = self.state
        return (s.session_id is not None and not s.done and s.session_id != self._too_long
                and len(self.lead_tokens) == s.n_tokens > 0)

    def _should_draft(self) -> bool:
        return self._following() and self.state.draft_len > 0 and not self.placement.sit_out

    def _already_posted(self, start: int, draft: list[int]) -> bool:
        last_start, last = self._last_post
        skip = start - last_start
        return skip >= 0 and list(last[skip: skip + len(draft)]) == draft

    async def _draft_ahead(self) -> None:
        """Draft token by token and post as we go, until nothing is left to draft or post.

        A post's reply is not awaited before drafting on: a round trip (~2.4 ms on one
        host) is as long as a small draft's token, and waiting made the back half as fast.
        One post at a time is in flight, so posts arrive in order; each carries the whole
        draft. Lead's news meanwhile arrives through the watch, within a millisecond:
        after a rejection lead's next step comes right away, and every token of draft
        ready by then counts."""
        if self._following() and not self._should_draft():
            # Lead wants no drafts now, but take in its tokens all the same: a probe then
            # finds this back ready. (Catching up on a 200-token prompt only when a probe
            # came took longer than the probe: lead never saw a draft on code edits.)
            # Not where that work slows lead: beside it on its host, or when it hushes us.
            if not (self.state.hush or self.placement.beside_lead or self.placement.sit_out):
                await self.model_thread.run(self._catch_up, list(self.lead_tokens))
            return
        in_flight: asyncio.Task[State | None] | None = None
        try:
            while self._should_draft() and not self._stop.is_set():
                grown = await self.model_thread.run(self._extend, list(self.lead_tokens),
                                                    self.state, self._news_seen)
                if in_flight is not None and (grown == 0 or in_flight.done()):
                    self._settle(await in_flight)
                    in_flight = None
                if in_flight is None:
                    in_flight = self._launch_post()
                    if in_flight is None and grown == 0:
                        return  # nothing new to draft or post: wait for lead's news
            if in_flight is not None:
                self._settle(await in_flight)
                in_flight = None
        finally:
            if in_flight is not None:
                in_flight.cancel()

    def _launch_post(self) -> asyncio.Task[State | None] | None:
        n = len(self.lead_tokens)
        local = self.drafter.local
        if local[:n] != self.lead_tokens:
            # Lead's news came while the model thread drafted on the old path: what lies
            # past n continues tokens lead did not take. (Posted, it read as a fresh draft,
            # and a step verifying it could accept nothing.) The next _extend catches up.
            return None
        draft = local[n: n + self.max_post]
        if not draft or self._already_posted(n, draft):
            return None
        positions = range(n, n + len(draft))
        dists = [self._dists[p] for p in positions] if self.send_dists and \
            all(p in self._dists for p in positions) else None
        post = DraftPost(session_id=self.state.session_id or "", start=n, token_ids=draft,
                         back_id=self.back_id, dists=dists)
        if self.stats:
            last_start, last = self._last_post
            self.stats.drafted += max(0, n + len(draft) - max(last_start + len(last), n))
            self.stats.posts += 1
        self._last_post = (n, tuple(draft))
        log.debug("post %d tokens at %d", len(draft), n)
        return asyncio.create_task(self._post(post))

    async def _post(self, post: DraftPost) -> State | None:
        try:
            return await self.client.post_draft(post)
        except LeadError as exc:
            if exc.status != 429:
                raise
            await self._sleep(exc.retry_after)  # lead asked this back to post less often
            return None

    def _settle(self, reply: State | None) -> None:
        """Take a state from the watch or a post's reply, unless a newer one came first."""
        if reply is not None and reply.version >= max(self.state.version, self._floor):
            log.debug("state v%d: %d tokens, draft_len %d", reply.version, reply.n_tokens,
                      reply.draft_len)
            self._absorb(reply)
            self._news.set()

    def _catch_up(self, lead_tokens: list[int]) -> None:
        """Model thread: make the draft model hold lead's tokens (its own draft past them
        stays where it agrees)."""
        t0 = time.perf_counter()
        evaluated = self.drafter.catch_up(lead_tokens)
        if self.stats and evaluated:
            self.stats.caught_up += evaluated
            self.stats.catch_up_s += time.perf_counter() - t0

    def _extend(self, lead_tokens: list[int], state: State, seen: int) -> int:
        """Model thread: catch up with lead (as of the `seen`-th state), then draft up to
        `burst` more tokens. A draft evaluation stops as soon as a newer state parts from
        the draft: right after a rejection, evaluating lead's correction cannot wait for
        a guess on the dead path to finish (it cost lead the next draft, most times)."""
        self._catch_up(lead_tokens)
        n_local = len(self.drafter.local)
        self._dists = {p: d for p, d in self._dists.items() if p < n_local}
        # catch_up made local agree with lead_tokens, so what lies past them is our draft.
        # Draft two steps ahead, so that a step accepting a whole draft finds the next one
        # ready (2 x draft_len left lead without a draft on 70 % of its steps at k = 1),
        # but no further: a draft model running beside lead slows it (here 8 %, measured
        # with a draft loop on the other core), and tokens far ahead are rarely used.
        ahead = min(self.max_post, 2 * (state.draft_len + 1))
        room = ahead - (n_local - len(lead_tokens))
        grown = 0
        while grown < min(self.burst, room):
            got = self.drafter.next_token(state.sampling, self._rng,
                                          lambda: self._parted_at > seen)
            if got is None:
                if self.stats and self._parted_at > seen:
                    self.stats.cut_short += 1
                break
            token, dist = got
            if dist is not None:
                position = len(self.drafter.local) - 1
                self._dists[position] = DraftDist(token_ids=dist.token_ids.tolist(),
                                                  probs=dist.probs.tolist())
            grown += 1
            if token in self.eos_token_ids:
                break
        return grown


def _brief(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
