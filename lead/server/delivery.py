"""A streamed reply's way to its client: a sender reads the generation's emissions and
writes them as server-sent events.

Decoding never waits on the client: the engine queues a run's emissions (lead/decode/runs.py,
the one buffer between a generation and its client), so a slow reader only lets that queue
grow (by at most the reply: one emission per token), and lead's one running slot is freed
when decoding ends, not when the client has read it all. A client that reads nothing is cut
off by its connection's watch (lead/server/wire.py); the reply then logs it and its
generation is cancelled at once, as a client that leaves is.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from lead.apis import shapes, toolreply
from lead.apis.prepare import Prepared
from lead.apis.toolparse import Delta
from lead.decode.session import Emission, Session
from lead.server.wire import Stall, wire_of

log = logging.getLogger("lead")
T = TypeVar("T")

Events = Callable[[AsyncIterator[Emission]], AsyncIterator[str]]  # an API's stream format


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
        wire = wire_of(scope)
        if wire is not None:
            wire.on_stall = partial(self._stalled, sending)
        try:
            await unless_gone(receive, sending)
        finally:
            if wire is not None:
                wire.on_stall = None
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


async def sse(model: str, emissions: AsyncIterator[Emission], rid: str,
              shape: shapes.ReplyShape, prepared: Prepared | None = None, n: int = 1
              ) -> AsyncIterator[str]:
    """An OpenAI reply's events: a chunk per emission, each choice's finish, the usage
    with the last, then [DONE]. `n`: the choices, each parsed (tool calls, reasoning) on
    its own."""
    head = shapes.envelope(f"{shape.kind}.chunk" if shape.chat else shape.kind, rid, model)
    deltas = [prepared.deltas() if prepared else toolreply.Deltas(None) for _ in range(n)]
    sessions: dict[int, Session] = {}

    def event(i: int, e: Emission | None, part: Delta | None = None,
              finish: str | None = None, opening: bool = False, **extra: Any) -> str:
        part = part or {}
        choice = shape.choice(part.get("content", ""), finish, e.logprobs if e else None,
                              delta=True, opening=opening, index=i)
        if "tool_calls" in part:
            choice["delta"]["tool_calls"] = part["tool_calls"]
        if "reasoning" in part:  # a thinking model's, as llama-server sends it
            choice["delta"]["reasoning_content"] = part["reasoning"]
        duo: dict[str, Any] = {"tokens": e.n_tokens if e else 0,
                               "accepted": e.n_from_draft if e else 0}
        if e and e.n_from_draft:
            duo["back"] = e.back  # which back drafted them (the page shows it on hover)
        payload = {**head, "choices": [choice], "duo": duo, **extra}
        return f"data: {json.dumps(payload)}\n\n"

    if shape.chat:
        for i in range(n):
            yield event(i, None, opening=True)
    async for e in emissions:
        i = e.choice
        if e.text or e.n_tokens:  # a token with no text yet still counts: EOS, held text
            parts = deltas[i].push(e.text)
            yield event(i, e, parts[0] if parts else None)
            for part in parts[1:]:
                yield event(i, None, part)
        if e.session is None:
            continue
        for part in deltas[i].finish():
            yield event(i, None, part)
        sessions[i] = e.session
        last = {"usage": usage(*sessions.values())} if len(sessions) == n else {}
        yield event(i, None, finish=deltas[i].finish_reason(e.session.finish_reason), **last)
    assert len(sessions) == n, "each choice's last emission carries its session"
    yield "data: [DONE]\n\n"


async def chain(first: Emission, rest: AsyncIterator[Emission]) -> AsyncIterator[Emission]:
    yield first
    async for e in rest:
        yield e


def usage(*sessions: Session) -> dict[str, Any]:
    """A reply's usage: its prompt once, every choice's tokens."""
    first = sessions[0]
    return shapes.usage(first.n_prompt, sum(s.n_generated for s in sessions),
                        sum(s.drafted for s in sessions), sum(s.accepted for s in sessions),
                        first.n_cached)
