"""Shared fixtures: a lead app over a fake target, and condition waits (never sleep-sync)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from bench.procs import wait_until
from lead.server.app import create_app
from lead.server.settings import LeadSettings
from shared.fake import FakeModel

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
