"""How the back hears from lead and posts to it: the link (one WebSocket, every session's
news pushed, drafts sent with no reply awaited) or, where lead offers none, long-polls
(one session at a time: GET /duo/state, POST /duo/draft). Both give the worker the same
`Update`s and take the same posts; a post returns at once either way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import statistics
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from httpx_ws import HTTPXWSException
from pydantic import TypeAdapter, ValidationError
from wsproto.utilities import LocalProtocolError

from back.client import BadAnswer, LeadClient, LeadError, LinkClosed
from back.failures import brief
from shared.protocol import DraftPost, Hello, Posted, Refused, SessionState, State, Update

log = logging.getLogger("back")
LEAD_MESSAGES: TypeAdapter[Update | Refused] = TypeAdapter(Update | Refused)
SILENT_S = 30.0  # no message on the link for this long: it is dead (lead beats every 10 s)
NEWS_S = 0.0005  # news's way from lead, until the link measures it
PING_S = 2.0  # the link's round trip is measured this often
PONG_S = 1.0  # a ping unanswered this long: the link is not measured (an ASGI test server)
TRIPS = 5  # round trips news_s is the median of


class Link(Protocol):
    news_s: float  # seconds lead's news takes to reach the back (an estimate)

    async def hello(self, hello: Hello) -> None:
        """Who the back is and what news it wants (sent again whenever that changes)."""
        ...

    def updates(self) -> AsyncIterator[Update]:
        """Lead's news as it comes; raises what ends the link (LeadError, transport errors)."""
        ...

    async def post(self, post: DraftPost) -> None: ...

    async def close(self) -> None: ...


class Refusals:
    """What to do when lead refuses a post: wait out a 429 (posting nothing meanwhile),
    log other 4xx once per session and drop the post, stop on a refused key."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.until = 0.0  # no posts before this time
        self._logged: str | None = None

    def paused(self) -> bool:
        return self.clock() < self.until

    def refused(self, status: int, message: str, retry_after: float, session_id: str) -> None:
        if status == 429:
            self.until = self.clock() + max(retry_after, 0.05)
        elif status in (401, 403) or not 400 <= status < 500:
            raise LeadError(f"lead refused a draft post: {message}", status, retry_after)
        elif self._logged != session_id:  # one line per session, not per post
            log.warning("lead refused a draft post (%s); dropped", message)
            self._logged = session_id


class StreamLink:
    """The link (GET /duo/link, a WebSocket)."""

    def __init__(self, socket: Any, clock: Callable[[], float]) -> None:
        self._ws = socket  # an httpx-ws AsyncWebSocketSession
        self.refusals = Refusals(clock)
        self.clock = clock
        self.news_s = NEWS_S
        self._trips: collections.deque[float] = collections.deque(maxlen=TRIPS)

    async def hello(self, hello: Hello) -> None:
        try:
            await self._send(hello.model_dump_json())
        except LinkClosed as lost:  # nothing else reads the link as hello goes out (first
            raise await self._why_closed(lost) from None  # from follow, then from news)

    async def _send(self, text: str) -> None:
        try:
            await self._ws.send_text(text)
        except LocalProtocolError:  # (its message holds the whole frame: not logged)
            raise LinkClosed("the link was closing as the back sent on it") from None

    async def _why_closed(self, lost: LinkClosed) -> Exception:
        """What closed the link, as it says once read (lead's close and its code, a network
        error), or `lost` where it says nothing within PONG_S."""
        try:
            async with asyncio.timeout(PONG_S):
                while True:
                    await self._ws.receive()  # (news before the close: the link is over)
        except HTTPXWSException as exc:
            return exc
        except TimeoutError:
            return lost

    async def updates(self) -> AsyncIterator[Update]:
        pinger = asyncio.create_task(self._measure())
        try:
            async for update in self._updates():
                yield update
        finally:
            pinger.cancel()

    async def _measure(self) -> None:
        """Time the link's round trip (a ping, answered by lead's server) every PING_S.
        News is taken to have left lead that long before it arrived: a round trip bounds
        its way from above (here a message took 0.48 ms one way, a ping 0.54 ms there and
        back: the back's WebSocket client reads messages slower than pongs), and a post
        made too early costs a guess where one made too late misses lead's step. The median
        of the last TRIPS: one slow answer (lead busy a moment) moves nothing."""
        with contextlib.suppress(Exception):  # unanswered, or the link closed: unmeasured
            while True:
                began = self.clock()
                pong = await self._ws.ping()
                async with asyncio.timeout(PONG_S):
                    await pong.wait()
                self._trips.append(self.clock() - began)
                self.news_s = statistics.median(self._trips)
                await asyncio.sleep(PING_S)

    async def _updates(self) -> AsyncIterator[Update]:
        while True:
            try:  # lead sends at least a heartbeat every 10 s: silence is a dead link
                text = await self._ws.receive_text(timeout=SILENT_S)
            except TimeoutError:
                raise LeadError(f"lead sent nothing on the link for {SILENT_S:.0f} s") \
                    from None
            try:
                message = LEAD_MESSAGES.validate_json(text)
            except ValidationError as exc:
                raise BadAnswer(f"lead sent no update on the link: {brief(exc)}") from None
            if isinstance(message, Refused):
                self.refusals.refused(message.status, message.message, message.retry_after,
                                      message.session_id or "")
                continue
            yield message

    async def post(self, post: DraftPost) -> None:
        if self.refusals.paused():
            return
        await self._send(Posted(draft=post).model_dump_json(exclude_none=True))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._ws.close()


class PollLink:
    """Long-polls: lead shows the back one session at a time; news and post replies come
    as single-session updates (the session before ended when another is shown)."""

    def __init__(self, client: LeadClient, held: Callable[[str], int],
                 clock: Callable[[], float]) -> None:
        """`held`: how many tokens of a session the back holds (what to ask from)."""
        self.client, self.held = client, held
        self.refusals = Refusals(clock)
        self.news_s = NEWS_S
        self.wants = Hello()
        self.since = -1  # the version the next poll asks past
        self.shown: str | None = None  # the session lead shows this back
        self._news: asyncio.Queue[Update | BaseException] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._posting: dict[str, DraftPost | None] = {}  # session -> the post waiting
        self._failed = False  # a post's failure ends the link
        self._poller: asyncio.Task[None] | None = None

    async def hello(self, hello: Hello) -> None:
        self.wants = hello

    def refetch(self) -> None:
        """Ask for the whole state again: what came could not be spliced."""
        self.since = -1

    async def updates(self) -> AsyncIterator[Update]:
        """The next poll goes out once the worker has taken what the last one brought (a
        restart it found, say); post replies come in between, as they arrive."""
        while True:
            if self._poller is None or self._poller.done():
                self._poller = asyncio.create_task(self._poll())
            item = await self._news.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    async def _poll(self) -> None:
        try:
            await self._poll_once()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # ends the link: the worker backs off and retries
            self._news.put_nowait(exc)

    async def _poll_once(self) -> None:
        wants, sid = self.wants, self.shown
        quiet = sid if sid is not None and (sid in wants.quiet or wants.idle) else ""
        try:
            state = await self.client.state(self.since, self.held(sid) if sid else 0,
                                            back_id=wants.back_id, quiet=quiet,
                                            idle=wants.idle)
        except LeadError as exc:
            if exc.status != 429:
                raise
            await asyncio.sleep(exc.retry_after)  # lead asked this back to wait
            return await self._poll_once()
        self._take(state)

    def _take(self, state: State) -> None:
        """A state, as an update: the session shown, and the one before it ended."""
        self.since = max(self.since, state.version)
        before, self.shown = self.shown, state.session_id or self.shown
        ended = [before] if before is not None and before != state.session_id else []
        sessions = [] if state.session_id is None else [SessionState.model_validate(
            state.model_dump(include=set(SessionState.model_fields)))]
        self._news.put_nowait(Update(version=state.version, lead_id=state.lead_id,
                                     sessions=sessions, ended=ended,
                                     step_left_s=state.step_left_s))

    async def post(self, post: DraftPost) -> None:
        """Post now, or once the post in flight for its session is answered (only the
        latest waits: it holds the whole draft)."""
        if self.refusals.paused() or self._failed:
            return
        sid = post.session_id
        if sid in self._posting:
            self._posting[sid] = post
            return
        self._posting[sid] = None
        task = asyncio.create_task(self._send(post))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, post: DraftPost) -> None:
        sid = post.session_id
        try:
            while True:
                try:
                    self._take(await self.client.post_draft(post))
                except LeadError as exc:
                    if not 400 <= exc.status < 500:
                        raise
                    self.refusals.refused(exc.status, brief(exc), exc.retry_after, sid)
                waiting = self._posting.get(sid)
                if waiting is None or self.refusals.paused():
                    break
                post, self._posting[sid] = waiting, None
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the link is done: no post goes out after it
            self._failed = True
            self._news.put_nowait(exc)
        finally:
            self._posting.pop(sid, None)

    async def close(self) -> None:
        tasks = [t for t in (self._poller, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
