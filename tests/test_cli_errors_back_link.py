"""How a back takes a link lead closes or that closes under it: an outage it retries with
backoff and names in one short line, never a fatal error or a frame dumped into the log."""

from __future__ import annotations

import asyncio
import logging

import pytest
from httpx_ws import WebSocketDisconnect
from httpx_ws.transport import ASGIWebSocketTransport
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from wsproto.utilities import LocalProtocolError

from back import leadlink
from back.backoff import Backoff
from back.client import LeadClient, LinkClosed
from back.drafter import NgramDrafter
from back.failures import brief, outage
from back.leadlink import Link
from back.worker import Worker
from shared.wire.protocol import DraftPost, Hello
from tests.conftest import async_wait_until
from tests.test_worker import info

FULL = "too many links open from this address"


def full_lead(links: list[int]) -> Starlette:
    """A lead that offers the link and turns every one away as it opens (1013), as lead
    does past its links per address; `links` counts them."""
    async def duo_info(_request: object) -> JSONResponse:
        return JSONResponse(info().model_copy(update={"link": True}).model_dump())

    async def link(ws: WebSocket) -> None:
        links.append(1)
        await ws.accept()
        await ws.close(1013, FULL)

    return Starlette(routes=[Route("/duo/info", duo_info),
                             WebSocketRoute("/duo/link", link)])


def test_a_link_lead_turns_away_for_now_is_retried_with_backoff(
        caplog: pytest.LogCaptureFixture) -> None:
    links: list[int] = []

    async def body() -> None:
        async with ASGIWebSocketTransport(app=full_lead(links)) as transport:
            worker = Worker(LeadClient("http://lead", transport=transport),
                            [NgramDrafter()], None, None)
            worker.backoff = Backoff(first=0.001, most=0.001)
            task = asyncio.create_task(worker.run())
            # the back's count, not lead's: a link lead took may not be counted yet
            await async_wait_until(lambda: worker.backoff.outages >= 3 or task.done(),
                                   what="retries")
            assert not task.done(), task  # neither fatal nor ended
            worker.stop()
            await task
            assert len(links) >= 3 and worker.backoff.outages >= 3  # each turned away: an outage,
            assert worker.backoff.flaps >= 2  # waited out longer each time (no tight loop)

    with caplog.at_level(logging.WARNING, logger="back"):
        asyncio.run(asyncio.wait_for(body(), 20))
    said = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert said and said[0] == f"lead closed the link (1013: {FULL}); retrying with backoff"


class ClosingSocket:
    """A link closing under the back: a send fails as wsproto fails it, whole frame quoted;
    what closed it waits to be read (`closed`), or nothing does."""

    def __init__(self, closed: BaseException | None) -> None:
        self.closed = closed

    async def send_text(self, text: str) -> None:
        raise LocalProtocolError(f"Event TextMessage(data='{text}') cannot be sent in state "
                                 "ConnectionState.LOCAL_CLOSING")

    async def receive(self) -> object:
        if self.closed is None:
            await asyncio.Event().wait()
        raise self.closed  # type: ignore[misc]


def test_a_post_on_a_closing_link_is_the_link_lost_in_a_short_line() -> None:
    link = Link(ClosingSocket(None), lambda: 0.0)
    post = DraftPost(session_id="s", start=0, token_ids=list(range(64)), back_id="b")
    with pytest.raises(LinkClosed) as lost:
        asyncio.run(link.post(post))
    line = f"{outage(lost.value)} ({brief(lost.value)})"
    assert line.startswith("lead unreachable (") and "TextMessage" not in line, line


def test_a_hello_on_a_closed_link_says_what_closed_it(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = WebSocketDisconnect(1013, FULL)
    with pytest.raises(WebSocketDisconnect) as said:
        asyncio.run(Link(ClosingSocket(closed), lambda: 0.0).hello(Hello()))
    assert said.value is closed
    monkeypatch.setattr(leadlink, "PONG_S", 0.01)  # nothing says: the link was lost
    with pytest.raises(LinkClosed):
        asyncio.run(Link(ClosingSocket(None), lambda: 0.0).hello(Hello()))
