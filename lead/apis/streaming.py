"""A streamed reply's way to its client: a sender reads the generation's emissions and
writes them as server-sent events (each API's format: openaireply.py, anthropicreply.py,
responsereply.py, infill.py), and the waits every route shares (`unless_gone`).

Decoding never waits on the client: the engine queues a run's emissions (lead/decode/runs.py,
the one buffer between a generation and its client), so a slow reader only lets that queue
grow (by at most the reply: one emission per token), and lead's one running slot is freed
when decoding ends, not when the client has read it all. A client that reads nothing is cut
off by its connection's watch (lead/server/sendwatch.py, which finds a reply here through
`Watched`); the reply then logs it and its generation is cancelled at once, as a client
that leaves is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from lead.decode.session import Emission, Session

log = logging.getLogger("lead")
T = TypeVar("T")

Events = Callable[[AsyncIterator[Emission]], AsyncIterator[str]]  # an API's stream format


WATCH = "duo.wire"  # the key in scope["extensions"] of the connection's watch, if any


@dataclass(frozen=True)
class Stall:
    """A client that read nothing for the watch's timeout, as the watch saw it."""

    silent_s: float  # how long the client acknowledged nothing while lead had bytes for it
    unsent: int  # bytes lead held for it: asyncio's buffer and the kernel's send queue
    request: str  # "POST /v1/chat/completions"
    client: str  # its address


class Watched(Protocol):
    """A connection's watch as a reply sees it: whom it tells of a stall before it cuts
    the client off (lead/server/sendwatch.py `Wire`)."""

    on_stall: Callable[[Stall], None] | None


def watch_of(scope: Scope) -> Watched | None:
    """The request's watch; None where lead/server/serve.py's protocol did not accept it
    (tests' in-process transports)."""
    watch: Watched | None = (scope.get("extensions") or {}).get(WATCH)
    return watch


KEEPALIVE_S = 10.0  # a comment line this often while a reply waits for its first token
KEEPALIVE = b": waiting for the first token (in line, or the prompt being read)\n\n"


class StreamedReply(Response):
    """The reply as an ASGI response: the server-sent events `events` makes of `gen`'s
    emissions. Its headers go out at once, and a comment line every KEEPALIVE_S while the
    reply waits for its turn and its prompt: an agent's first prompt takes minutes on a CPU,
    and clients give up on a silent stream (Claude Code and Codex after 300 s). `release`:
    what frees its places in line, if decoding never takes them."""

    def __init__(self, gen: AsyncGenerator[Emission, None], events: Events,
                 release: Callable[[], None] = lambda: None) -> None:
        # Response's own __init__ would give it a body, and so a Content-Length of 0.
        self.status_code, self.media_type, self.background = 200, "text/event-stream", None
        self.init_headers({"Cache-Control": "no-cache"})
        self.gen, self.events, self.release = gen, events, release
        self.sessions: list[Session] = []  # its generations' (each told with its first)
        self.passed = 0  # tokens handed to `events`

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sending = asyncio.ensure_future(self._send_all(send))
        watch = watch_of(scope)
        if watch is not None:
            watch.on_stall = partial(self._stalled, sending)
        try:
            await unless_gone(receive, sending)
        finally:
            if watch is not None:
                watch.on_stall = None
            await self.gen.aclose()  # the client left (or was cut off): the generation ends
            self.release()

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        first = asyncio.ensure_future(_next(self.gen))
        try:
            while not (await asyncio.wait({first}, timeout=KEEPALIVE_S))[0]:
                await send({"type": "http.response.body", "body": KEEPALIVE,
                            "more_body": True})
        finally:  # (cancelled: the first emission is no longer awaited)
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
        async for text in self.events(self._counted(first.result())):
            await send({"type": "http.response.body", "body": text.encode(),
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _counted(self, first: Emission | None) -> AsyncIterator[Emission]:
        """The emissions, `first` and the rest, each counted as it is handed on."""
        e = first
        while e is not None:
            self.passed += e.n_tokens
            if e.prompt is not None:
                self.sessions.append(e.prompt)
            yield e
            e = await _next(self.gen)

    def _stalled(self, sending: asyncio.Future[None], stall: Stall) -> None:
        sid = self.sessions[0].id if self.sessions else "?"
        done = bool(self.sessions) and all(s.done for s in self.sessions)
        unsent = sum(s.n_generated for s in self.sessions) - self.passed
        log.warning("%s: client %s read nothing for %.1f s; %d bytes and %d tokens unsent: "
                    "%s", sid, stall.client, stall.silent_s, stall.unsent, unsent,
                    "connection closed" if done else "generation cancelled")
        sending.cancel()  # nothing more goes out, not even the stream's end


async def _next(gen: AsyncGenerator[Emission, None]) -> Emission | None:
    return await anext(gen, None)


async def unless_gone(receive: Receive, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None if the client disconnects first (`work` is cancelled then).
    Its errors are raised."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, gone):
            pending.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    return None if task.cancelled() else task.result()


async def until_disconnect(receive: Receive) -> None:
    """Returns when the client disconnects (the body is read: nothing else comes); never
    where the server cannot tell, and the reply then runs to its end."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:
        await asyncio.get_running_loop().create_future()  # until cancelled


async def chain(first: Emission, rest: AsyncIterator[Emission]) -> AsyncIterator[Emission]:
    yield first
    async for e in rest:
        yield e
