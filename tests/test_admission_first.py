"""A request takes its place in line before any expensive work: a full queue is a 429
before a template, tokeniser or grammar runs; that work runs on a worker thread while the
request holds its place; a client that leaves while its request is prepared or queued
gives its place back."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import numpy as np

from bench.fake import FakeModel
from lead.server.app import create_app
from tests.conftest import async_wait_until, chat_body, make_settings

SCHEMA = {"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": "object"}}}}


class CountingModel(FakeModel):
    """Counts the work a request's preparation does, and on which threads; its evaluations
    wait until `gate` opens, so the running request holds lead; its template waits until
    `template_free` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.template_free = threading.Event(), threading.Event()
        self.template_free.set()
        self.work: list[str] = []
        self.work_threads: set[int] = set()

    def _count(self, what: str) -> None:
        self.work.append(what)
        self.work_threads.add(threading.get_ident())

    def tokenize(self, text: str, special: bool = False, add_bos: bool = True) -> list[int]:
        self._count("tokenize")
        return super().tokenize(text, special, add_bos)

    def format_chat(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None, **switches: Any) -> str:
        self._count("template")
        if not self.template_free.wait(30):
            raise RuntimeError("the test never let the template run")
        return super().format_chat(messages, tools, **switches)

    def schema_grammar(self, schema: dict[str, Any], strict: bool = True) -> str:
        self._count("schema")
        return super().schema_grammar(schema, strict)

    def constraint(self, gbnf: str) -> Any:
        parsed = super().constraint(gbnf)
        self._count("grammar")  # after: a request's last piece of preparation
        return parsed

    def evaluate(self, tokens: Sequence[int], n_logits: int,
                 abort: Callable[[], bool] | None = None) -> np.ndarray:
        if not self.gate.wait(30):
            raise RuntimeError("the test never opened the gate")
        return super().evaluate(tokens, n_logits, abort)


class RawCall:
    """A request driven as a server drives the app: the client can leave (`leave`), and
    the app learns it only from an http.disconnect message."""

    def __init__(self, app: Any, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.gone = asyncio.Event()
        self.messages: list[dict[str, Any]] = []
        self._body = [{"type": "http.request", "body": raw, "more_body": False}]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
                 "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(raw)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 5555)}
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if self._body:
            return self._body.pop()
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def leave(self) -> None:
        self.gone.set()

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.messages if m["type"] == "http.response.start")


def lead(**settings: object) -> tuple[Any, CountingModel]:
    model = CountingModel()
    app = create_app(make_settings(calibrate=False, **settings), model)
    return app, model


def run(app: Any, body: Callable[[httpx.AsyncClient], Any]) -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            await asyncio.wait_for(body(http), 60)
    try:
        asyncio.run(main())
    finally:
        app.state.engine.shutdown()


def test_a_full_queue_refuses_before_any_template_token_or_grammar_work() -> None:
    app, model = lead(max_queue=1)
    admission = app.state.engine.admission

    async def body(http: httpx.AsyncClient) -> None:
        post = http.post("/v1/chat/completions", json=chat_body("a", max_tokens=3, **SCHEMA))
        running = asyncio.create_task(post)
        queued = asyncio.create_task(http.post("/v1/chat/completions",
                                               json=chat_body("b", max_tokens=3, **SCHEMA)))
        try:
            await async_wait_until(lambda: admission.running and admission.waiting == 1
                                   and model.work.count("grammar") == 2,
                                   what="one running, one prepared and queued")
            before = list(model.work)
            refused = await http.post("/v1/chat/completions",
                                      json=chat_body("c", max_tokens=3, **SCHEMA))
            assert refused.status_code == 429 and refused.headers["retry-after"], refused.text
            assert "queue is full" in refused.json()["error"]["message"]
            assert model.work == before  # nothing of the refused request was prepared
        finally:
            model.gate.set()
        for done in await asyncio.gather(running, queued):
            assert done.status_code == 200, done.text
    run(app, body)
    assert sorted(set(model.work)) == ["grammar", "schema", "template", "tokenize"]
    assert app.state.engine.metrics.rejected == 1


def test_preparation_runs_on_a_worker_thread_not_the_loop_nor_the_model_thread() -> None:
    app, model = lead()
    model.gate.set()
    loop_threads: set[int] = set()

    async def body(http: httpx.AsyncClient) -> None:
        loop_threads.add(threading.get_ident())
        r = await http.post("/v1/chat/completions", json=chat_body("a", max_tokens=3, **SCHEMA))
        assert r.status_code == 200, r.text
    run(app, body)
    assert model.work_threads and not model.work_threads & loop_threads
    assert not model.work_threads & model.threads  # model.threads: those that evaluated


def test_preparation_errors_are_still_400s_naming_the_field() -> None:
    app, model = lead()
    model.gate.set()

    async def body(http: httpx.AsyncClient) -> None:
        r = await http.post("/v1/chat/completions", json=chat_body(grammar="not gbnf"))
        assert r.status_code == 400 and r.json()["error"]["param"] == "grammar", r.text
        long = await http.post("/v1/completions", json={"prompt": "x" * 3000})
        assert long.status_code == 400 and "context" in long.json()["error"]["message"]
        assert app.state.engine.admission.waiting == 0  # refused: the places are free again
        ok = await http.post("/v1/chat/completions", json=chat_body(max_tokens=2))
        assert ok.status_code == 200
    run(app, body)


def test_a_client_that_leaves_while_queued_gives_its_place_back() -> None:
    app, model = lead(max_queue=1)
    admission = app.state.engine.admission

    async def body(http: httpx.AsyncClient) -> None:
        running = asyncio.create_task(http.post("/v1/chat/completions",
                                                json=chat_body("a", max_tokens=3)))
        try:
            await async_wait_until(lambda: admission.running, what="the first to run")
            queued = RawCall(app, chat_body("b", max_tokens=3))
            await async_wait_until(lambda: admission.waiting == 1 and
                                   model.work.count("tokenize") == 2,
                                   what="the second prepared and queued")
            assert (await http.post("/v1/chat/completions", json=chat_body("c"))).status_code \
                == 429
            queued.leave()
            await queued.task
            assert queued.status == 499 and admission.waiting == 0
            taken = asyncio.create_task(http.post("/v1/chat/completions",
                                                  json=chat_body("d", max_tokens=3)))
            await async_wait_until(lambda: admission.waiting == 1, what="its place taken")
        finally:
            model.gate.set()
        assert (await running).status_code == 200 and (await taken).status_code == 200
    run(app, body)
    assert app.state.engine.metrics.requests == 2  # the one that left never generated


def test_a_client_that_leaves_while_its_request_is_prepared_gives_its_place_back() -> None:
    app, model = lead(max_queue=0)
    admission = app.state.engine.admission
    model.gate.set()
    model.template_free.clear()  # the template (on its worker thread) waits

    async def body(http: httpx.AsyncClient) -> None:
        preparing = RawCall(app, chat_body("a", max_tokens=3))
        await async_wait_until(lambda: "template" in model.work and admission.waiting == 1,
                               what="the request in its template")
        refused = await http.post("/v1/chat/completions", json=chat_body("b"))
        assert refused.status_code == 429  # one place (max_queue=0), and it is taken
        preparing.leave()
        await preparing.task
        assert preparing.status == 499 and admission.waiting == 0  # free: the template still
        assert not model.template_free.is_set()  # has not returned on its thread
        model.template_free.set()
        ok = await http.post("/v1/chat/completions", json=chat_body("c", max_tokens=2))
        assert ok.status_code == 200, ok.text
    run(app, body)
