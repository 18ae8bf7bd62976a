"""One log line per API request: method, path, status, seconds to the end of the reply, and
an error's own message, so that a user sees what a client sent and what lead answered
(uvicorn's access log is off: backs poll and post many times a second, and it says no
more than the status).

    lead INFO POST /v1/messages 200 in 3.41 s
    lead INFO POST /v1/responses 400 in 0.01 s: reasoning.effort: ...
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("lead")
QUIET = ("/duo/", "/web/", "/metrics", "/health", "/favicon.ico")  # polled, or the page's
MESSAGE_BYTES = 4096  # an error body read for its message, at most


class RequestLog:
    def __init__(self, app: ASGIApp, clock: Callable[[], float] = time.perf_counter) -> None:
        self.app, self.clock = app, clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path == "/" or path.startswith(QUIET):
            await self.app(scope, receive, send)
            return
        seen = _Seen(self.clock())

        async def watched(message: Message) -> None:
            seen.take(message)
            await send(message)
        try:
            await self.app(scope, receive, watched)
        finally:
            log.info("%s", seen.line(scope["method"], path, self.clock()))


class _Seen:
    """What one reply has sent: its status, and the start of an error's body."""

    def __init__(self, start: float) -> None:
        self.start, self.status, self.body = start, 0, b""

    def take(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body" and self.status >= 400 and \
                len(self.body) < MESSAGE_BYTES:
            self.body += message.get("body", b"")[:MESSAGE_BYTES]

    def line(self, method: str, path: str, now: float) -> str:
        status = self.status or "(no reply: the client left)"
        line = f"{method} {path} {status} in {now - self.start:.2f} s"
        why = error_message(self.body)
        return f"{line}: {why}" if why else line


def error_message(body: bytes) -> str:
    """The message of an error body in OpenAI's or Anthropic's shape; "" if none."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return ""
    return str(error.get("message", "")) if isinstance(error, dict) else ""
