"""How the back hears from lead and posts to it: the link (GET /duo/link, one WebSocket),
every session's news pushed as `Update`s, drafts sent with no reply awaited.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import statistics
from collections.abc import AsyncIterator, Callable
from typing import Any

from httpx_ws import HTTPXWSException
from pydantic import TypeAdapter, ValidationError
from wsproto.utilities import LocalProtocolError

from back.client import BadAnswer, LeadError, LinkClosed
from back.failures import brief
from shared.wire.protocol import DraftPost, Hello, Posted, Refused, Update

log = logging.getLogger("back")
LEAD_MESSAGES: TypeAdapter[Update | Refused] = TypeAdapter(Update | Refused)
SILENT_S = 30.0  # no message on the link for this long: it is dead (lead beats every 10 s)
NEWS_S = 0.0005  # news's way from lead, until the link measures it
PING_S = 2.0  # the link's round trip is measured this often
PONG_S = 1.0  # a ping unanswered this long: the link is not measured (an ASGI test server)
TRIPS = 5  # round trips news_s is the median of


class Link:
    """The link, over an open WebSocket; `news_s`: seconds lead's news takes to reach the
    back (an estimate)."""

    def __init__(self, socket: Any, clock: Callable[[], float]) -> None:
        self._ws = socket  # an httpx-ws AsyncWebSocketSession
        self.clock = clock
        self.news_s = NEWS_S
        self._trips: collections.deque[float] = collections.deque(maxlen=TRIPS)
        self._paused_until = 0.0  # no posts before this time (lead refused one with a 429)
        self._logged: str | None = None  # the session a refused post was last logged for

    async def hello(self, hello: Hello) -> None:
        """Who the back is and what news it wants (sent again whenever that changes)."""
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
        """Lead's news as it comes; raises what ends the link (LeadError, transport errors)."""
        pinger = asyncio.create_task(self._measure())
        try:
            async for update in self._updates():
                yield update
        finally:
            pinger.cancel()

    async def _measure(self) -> None:
        """Time the link's round trip (a ping) every PING_S: news is taken to have left lead
        that long before it arrived, a bound from above (docs/back-loop.md). The median of
        the last TRIPS: one slow answer (lead busy a moment) moves nothing."""
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
                self._refused(message)
                continue
            yield message

    def _refused(self, refused: Refused) -> None:
        """Lead refused a post: wait out a 429 (posting nothing meanwhile), log other 4xx
        once per session and drop the post, stop on a refused key."""
        status, session_id = refused.status, refused.session_id or ""
        if status == 429:
            self._paused_until = self.clock() + max(refused.retry_after, 0.05)
        elif status in (401, 403) or not 400 <= status < 500:
            raise LeadError(f"lead refused a draft post: {refused.message}", status)
        elif self._logged != session_id:  # one line per session, not per post
            log.warning("lead refused a draft post (%s); dropped", refused.message)
            self._logged = session_id

    async def post(self, post: DraftPost) -> None:
        if self.clock() < self._paused_until:
            return
        await self._send(Posted(draft=post).model_dump_json(exclude_none=True))

    async def aclose(self) -> None:  # (as contextlib.aclosing names it: Worker.follow)
        with contextlib.suppress(Exception):
            await self._ws.close()
