"""Run the lead app under uvicorn; SIGTERM/SIGINT drain in-flight work, then exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI


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


def serve(app: FastAPI, host: str, port: int, log_level: str = "info",
          drain_s: float = 30.0) -> None:
    """Serve until a signal; in-flight requests get up to `drain_s` to finish."""
    # One line per HTTP request would flood the console: a back polls and posts several
    # times per token. Lead logs one line per generation; --log-level debug shows all.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(),
                            access_log=log_level.lower() == "debug",
                            timeout_graceful_shutdown=drain_s)
    _Server(config).run()
