"""Shared fixtures: a lead app over a fake target, and condition waits (never sleep-sync)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx_ws.transport import ASGIWebSocketTransport

from back.drafter import Drafter, Grown
from back.jobs import Drafted, DraftJob, extend_many
from bench.fake import FakeModel
from bench.procs import wait_until
from lead.server.app import create_app
from lead.server.settings import LeadSettings
from shared.model import EvaluationAborted
from shared.wire.protocol import SamplingParams

pytest_plugins = ("tests.tiers",)  # unit / process / real: see tests/tiers.py


async def async_wait_until(predicate: Callable[[], bool], timeout: float = 10.0,
                           what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


def make_settings(**overrides: object) -> LeadSettings:
    return LeadSettings(**overrides)  # type: ignore[arg-type]


@pytest.fixture
def fake_target() -> FakeModel:
    return FakeModel()


@pytest.fixture
def client(fake_target: FakeModel) -> Iterator[TestClient]:
    app = create_app(make_settings(max_tokens=64), fake_target)
    with TestClient(app) as c:
        yield c


def chat_body(text: str = "hello", **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], **extra}


class ScriptedModel(FakeModel):
    """A fake target that emits a fixed script of tokens after the prompt, then EOS."""

    def __init__(self, script: list[int], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.script = script
        self.prompt_len = 0

    def logits_for(self, context: list[int]) -> np.ndarray:  # type: ignore[override]
        i = len(context) - self.prompt_len
        token = self.script[i] if 0 <= i < len(self.script) else 0
        logits = np.zeros(self.n_vocab, dtype=np.float32)
        logits[token] = 10.0
        return logits


class LiveServer:
    """A lead app served as `python -m lead` serves it (lead/server/serve.py's uvicorn config), on
    a free loopback port, in a thread (for sockets and PTYs)."""

    def __init__(self, app: FastAPI) -> None:
        import socket
        import threading

        import uvicorn

        from lead.server.serve import uvicorn_config

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", self.port, "warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 10, "uvicorn to start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def event_stream(text: str) -> httpx.Response:
    """A response carrying `text` as a server-sent event stream."""
    return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


class InProcessLead(ASGIWebSocketTransport):
    """Lead's app in-process, over HTTP and the link (a WebSocket), as a back reaches it.
    `down()`: lead stops (requests are refused, each open link closes as a restarting
    server closes it); setting `lead` to another app brings another lead up. Entered once
    by the test: the clients over it (which enter and leave their transport) share it."""

    def __init__(self, lead: object | None) -> None:
        super().__init__(app=self._serve)
        self.lead = lead
        self._gone: set[asyncio.Event] = set()
        self._users = 0

    async def __aenter__(self) -> InProcessLead:
        self._users += 1
        if self._users == 1:
            await super().__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._users -= 1
        if self._users == 0:
            await super().__aexit__(*exc)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.lead is None:
            raise httpx.ConnectError("lead down", request=request)
        return await super().handle_async_request(request)

    def down(self) -> None:
        self.lead = None
        for gone in self._gone:
            gone.set()

    async def _serve(self, scope: dict, receive: Callable, send: Callable) -> None:
        lead: Any = self.lead
        if scope["type"] != "websocket":
            return await lead(scope, receive, send)
        gone = asyncio.Event()
        self._gone.add(gone)

        async def until_gone() -> dict:
            message = asyncio.ensure_future(receive())
            ended = asyncio.ensure_future(gone.wait())
            await asyncio.wait({message, ended}, return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            if message.done():
                return message.result()
            message.cancel()
            await send({"type": "websocket.close", "code": 1012, "reason": "restarting"})
            return {"type": "websocket.disconnect", "code": 1012}
        try:
            await lead(scope, until_gone, send)
        finally:
            self._gone.discard(gone)


def grow(drafter: Drafter, params: SamplingParams, rng: np.random.Generator,
         abort: Callable[[], bool] | None = None, n_prompt: int = 0) -> Grown | None:
    """One growth of a drafter's draft alone, as a back's job makes it (None: nothing to
    do, or `abort` stopped its model call)."""
    batch = drafter.begin_growth(params)
    if batch is None:
        return None
    try:
        rows = drafter.evaluate(batch, abort) if batch else {}
    except EvaluationAborted:
        return None
    return drafter.end_growth(rows, params, rng, n_prompt)


def extend(drafter: Drafter, job: DraftJob) -> Drafted:
    """One session's job, as a back drafting for it alone runs it."""
    return extend_many(None, [(0, drafter, job)])[0]
