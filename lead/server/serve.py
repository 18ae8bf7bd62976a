"""Run the lead app under uvicorn; SIGTERM/SIGINT drain in-flight work, then exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol  # httptools lower-cases header names

from lead.server.gate import exposure_warning
from lead.server.headercase import with_canonical_headers
from lead.server.sendwatch import Wire

log = logging.getLogger("lead")


class _Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn re-raises captured signals after shutting down, so the process would
        # die of SIGTERM; a server that drained cleanly exits 0 instead.
        self._captured_signals.clear()
        if sig == signal.SIGINT and self.force_exit:
            self._captured_signals.append(sig)  # a second Ctrl-C still kills at once
        # Endless streams (the page's live feed) end now, not at the drain timeout.
        on_exit = getattr(self.config.app.state, "on_exit", None)
        if on_exit is not None:
            with contextlib.suppress(RuntimeError):  # no loop running: nothing to end
                asyncio.get_running_loop().call_soon_threadsafe(on_exit)


def protocol_class(write_timeout: float, on_cut: Callable[[], None] = lambda: None
                   ) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with a Wire on every connection (lead/server/sendwatch.py):
    small send buffers, and a client that reads nothing for `write_timeout` seconds cut off.
    Only the protocol sees the transport, and only there is a silent client visible at all.
    Outermost, header names as llama-server writes them (lead/server/headercase.py)."""

    class LeadHttpProtocol(H11Protocol):
        wire: Wire

        def connection_made(self, transport: Any) -> None:
            self.wire = Wire(transport, write_timeout, self.loop, on_cut=on_cut)
            # a fresh protocol per connection
            self.app = with_canonical_headers(self.wire.wrap(self.app))
            super().connection_made(transport)

        def pause_writing(self) -> None:
            super().pause_writing()
            self.wire.paused()

        def connection_lost(self, exc: Exception | None) -> None:
            self.wire.close()
            super().connection_lost(exc)

    return LeadHttpProtocol


def uvicorn_config(app: FastAPI, host: str, port: int, log_level: str = "info",
                   drain_s: float = 30.0) -> uvicorn.Config:
    """The config lead runs under (tests' live servers too); the write timeout is the
    app's settings'."""
    # One line per HTTP request would flood the console: a back polls and posts several
    # times per token. Lead logs one line per generation; --log-level debug shows all.
    return uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(),
                          access_log=log_level.lower() == "debug",
                          timeout_graceful_shutdown=drain_s,
                          # written lower-case after the app: headercase.py writes Date
                          server_header=False, date_header=False,
                          # the link's frames: one up to the limit (max_body_kb) gets a
                          # 413 and the link stays; one over twice that ends the link (1009)
                          ws_max_size=2 * app.state.settings.max_body_kb * 1024,
                          ssl_keyfile=app.state.settings.ssl_key_file,
                          ssl_certfile=app.state.settings.ssl_cert_file,
                          http=protocol_class(app.state.settings.write_timeout,
                                              app.state.engine.metrics.count_cut))


def serve(app: FastAPI, host: str, port: int, log_level: str = "info",
          drain_s: float = 30.0, sockets: list[socket.socket] | None = None) -> None:
    """Serve until a signal on `sockets` (bound to each of host's addresses, comma-separated
    as llama-server takes them, at port here if not given); in-flight requests get up to
    `drain_s` to finish."""
    for address in host.split(","):
        warning = exposure_warning(address.strip(), app.state.settings.first_api_key)
        if warning is not None:
            log.warning("%s", warning)
    bound = sockets if sockets is not None else bound_sockets(host, port)
    with contextlib.ExitStack() as closing:
        for sock in bound:
            closing.enter_context(contextlib.closing(sock))
        _Server(uvicorn_config(app, host.split(",")[0].strip(), port, log_level,
                               drain_s)).run(sockets=bound)


def bound_sockets(host: str, port: int) -> list[socket.socket]:
    """A socket for each of host's comma-separated addresses (llama-server's --host
    127.0.0.1,::1), all bound or none."""
    bound: list[socket.socket] = []
    try:
        for address in host.split(","):
            bound.append(bound_socket(address.strip(), port))
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


def bound_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, of the family uvicorn would choose (IPv6 only for a
    host with a colon: "localhost" stays 127.0.0.1 where /etc/hosts lists ::1 first).
    Bound before the model loads, a port in use or a host that does not resolve is an
    OSError at once, not after a minute's load and a "listening" line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
