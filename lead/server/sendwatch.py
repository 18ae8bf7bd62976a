"""One connection's sending side: small buffers, and a watch that ends a client that
reads nothing.

A client that stops reading shows on the server only as bytes that stop leaving: the
kernel keeps a reply's bytes in the client's receive buffer, then in lead's send
buffer (autotuned up to 4 MiB), then asyncio holds them, and only then does a `send` wait.
So each connection gets a small send buffer and small asyncio limits (bounding what a
silent client costs and how late it is noticed), and a watch that, while lead holds
unsent bytes, checks that the client acknowledges some every `timeout` seconds; one that
does not is cut off (`abort`): its request then sees a disconnect, as if it had left.

Progress is bytes the client acknowledged (TCP_INFO on Linux), not asyncio's buffer
shrinking: the kernel wakes a writer only once a third of its buffer is free, so a slow but
steady reader can free no asyncio byte for seconds while it reads all the time. Even so a
reader shows progress only as TCP reopens its window (after it has read about half its
buffer, on loopback): one that reads far less than that per timeout looks silent.
lead/server/serve.py installs this on every connection uvicorn accepts; the app finds it in the
ASGI scope's extensions under WATCH (lead/apis/streaming.py: what a reply is told, `Stall`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from lead.apis.streaming import WATCH, Stall

log = logging.getLogger("lead")

SEND_BUFFER = 32 * 1024  # SO_SNDBUF; the kernel doubles it
WRITE_HIGH, WRITE_LOW = 16 * 1024, 4 * 1024  # asyncio's buffer: a `send` waits above HIGH
_BYTES_ACKED = struct.Struct("Q")  # struct tcp_info's tcpi_bytes_acked (Linux >= 4.1) ...
_BYTES_ACKED_AT = 120  # ... at this offset: the struct only ever grows at its end


class StallWatch:
    """Pure: whether a connection's progress mark has stood still for `timeout` seconds."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.mark, self.since = 0, 0.0

    def start(self, mark: int, now: float) -> None:
        self.mark, self.since = mark, now

    def silent_for(self, mark: int, now: float) -> float | None:
        """Seconds without progress if they reach the timeout, else None (a moved mark
        is progress and starts the count again)."""
        if mark != self.mark:
            self.start(mark, now)
            return None
        silent = now - self.since
        return silent if silent >= self.timeout else None


class Wire:
    """A connection's transport as the watch and the app use it."""

    def __init__(self, transport: asyncio.WriteTransport, timeout: float,
                 loop: asyncio.AbstractEventLoop,
                 clock: Callable[[], float] = time.monotonic,
                 on_cut: Callable[[], None] = lambda: None) -> None:
        """`on_cut`: called when a silent client is cut off (lead counts them)."""
        self.transport, self.loop, self.clock, self.on_cut = transport, loop, clock, on_cut
        self.watch = StallWatch(timeout)
        self.tick = min(max(timeout / 5, 0.01), 1.0)
        self.request = ""  # the request being answered, for the log
        self.on_stall: Callable[[Stall], None] | None = None  # set by a reply while it sends
        self._timer: asyncio.TimerHandle | None = None
        self._socket = transport.get_extra_info("socket")
        peer = transport.get_extra_info("peername")
        self.client = f"{peer[0]}:{peer[1]}" if peer else "?"
        _shrink(transport, self._socket)

    def buffered(self) -> int:
        """Bytes asyncio holds for the client."""
        return self.transport.get_write_buffer_size()

    def unsent(self) -> int:
        """Bytes lead holds for the client: asyncio's and the kernel's (not yet acked)."""
        return self.buffered() + _kernel_queue(self._socket)

    @property
    def watching(self) -> bool:
        """Whether lead holds bytes the client has not taken and is timing it."""
        return self._timer is not None

    def paused(self) -> None:
        """The transport stopped taking writes (its buffer is over WRITE_HIGH): watch it."""
        if self._timer is None and not self.transport.is_closing():
            self.watch.start(self._mark(), self.clock())
            self._timer = self.loop.call_later(self.tick, self._check)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self.unsent() == 0:
            return  # all sent, or gone: the watch starts again at the next pause
        silent = self.watch.silent_for(self._mark(), self.clock())
        if silent is None:
            self._timer = self.loop.call_later(self.tick, self._check)
            return
        stall = Stall(silent, self.unsent(), self.request, self.client)
        try:
            if self.on_stall is not None:
                self.on_stall(stall)  # the reply logs it, with what it had left to send
            else:
                log.warning("client %s read nothing for %.1f s of %s; %d bytes unsent: "
                            "connection closed", stall.client, stall.silent_s, stall.request,
                            stall.unsent)
        finally:
            self.transport.abort()  # the request sees a disconnect; nothing waits on a flush
            self.on_cut()

    def _mark(self) -> int:
        """Grows as the client takes bytes: bytes acked, else asyncio's buffer emptying."""
        acked = _bytes_acked(self._socket)
        return acked if acked is not None else -self.buffered()

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """`app` with this wire in every HTTP request's scope (scope["extensions"][WATCH]),
        where a streamed reply finds it (lead/apis/streaming.py `watch_of`)."""
        async def with_wire(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                self.request = f"{scope.get('method', '?')} {scope.get('path', '?')}"
                scope["extensions"] = {**(scope.get("extensions") or {}), WATCH: self}
            await app(scope, receive, send)
        return with_wire


def _shrink(transport: asyncio.WriteTransport, sock: Any) -> None:
    """Small buffers: lead holds ~80 KiB for a client that reads nothing (not the 4 MiB
    the kernel would autotune to), so it is noticed that much sooner; the client's own
    receive buffer (~100-200 KiB) still fills first. A reply streams at most ~25 KB/s;
    the largest bodies (a long reply's logprobs, ~1 MB) still leave at ~600 KB/s over a
    100 ms round trip."""
    transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)


def _bytes_acked(sock: Any) -> int | None:
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return None
    if len(raw) < _BYTES_ACKED_AT + _BYTES_ACKED.size:
        return None  # a kernel older than the field
    return int(_BYTES_ACKED.unpack_from(raw, _BYTES_ACKED_AT)[0])


def _kernel_queue(sock: Any) -> int:
    """Bytes in the kernel's send queue (sent and unacked, or unsent); 0 where unknown."""
    try:
        import fcntl
        import termios
    except ImportError:  # not a Unix
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, AttributeError):  # no socket, or not one that knows
        return 0
    return int(struct.unpack("i", raw)[0])
