"""create_app(settings, target=None): the lead's HTTP surface.

OpenAI-compatible chat/completions (streaming as SSE), the back protocol under
/duo, /metrics, /health, and a web page at / (lead/webroutes.py). Tests inject a fake
target; production loads GGUF.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lead import api
from lead.admission import QueueFull
from lead.backroutes import back_router
from lead.engine import Engine
from lead.session import Emission, GenRequest, Session
from lead.settings import LeadSettings
from lead.webroutes import STATIC_PREFIX, mount_web
from shared.model import Model
from shared.placement import LeadPlace, Placement, allowed_cpus, choose_lead


def lead_placement(settings: LeadSettings) -> Placement:
    return choose_lead(settings.cpus, settings.threads, allowed_cpus(),
                       on_gpu=settings.n_gpu_layers < 0)


def create_app(settings: LeadSettings, target: Model | None = None,
               clock: Callable[[], float] = time.perf_counter) -> FastAPI:
    """`clock` prices the target's steps: tests give a fake target a virtual one."""
    placement = lead_placement(settings)
    model = target if target is not None else _load_target(settings, placement.threads)
    engine = Engine(model, max_draft=settings.max_draft, draft_len=settings.draft_len,
                    max_queue=settings.max_queue, batch=settings.batch_size, clock=clock)
    if settings.calibrate and settings.max_draft > 0 and settings.draft_len is None:
        engine.calibrate()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.shutdown()

    app = FastAPI(title="duo lead", version="0.1.0", lifespan=lifespan)
    app.state.engine, app.state.settings = engine, settings
    # For lead/serve.py to call as a signal starts the shutdown: uvicorn drains requests
    # before the lifespan ends, and the page's live stream would never end by itself.
    app.state.on_exit = engine.live.close
    _install_error_handlers(app)
    app.add_middleware(_Gate, limit=settings.max_body_kb * 1024, api_key=settings.api_key)
    app.include_router(_openai_router(engine, settings))
    place = LeadPlace.of(placement, allowed_cpus())
    app.include_router(back_router(engine, place, settings.max_draft_posts, settings.max_poll_s))
    mount_web(app, engine)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        # api_key: whether a key is needed, so that the page asks for one before any 401
        return {"status": "ok", "model": model.name, "busy": engine.session is not None
                and not engine.session.done, "api_key": settings.api_key is not None}

    return app


def _load_target(settings: LeadSettings, threads: int) -> Model:
    from shared.llm import load_model  # the llama.cpp edge, imported only when needed

    return load_model(settings.model, threads=threads, n_gpu_layers=settings.n_gpu_layers,
                      n_ctx=settings.ctx_size, n_batch=settings.batch_size, rpc=settings.rpc,
                      tensor_split=settings.tensor_split)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        return JSONResponse(api.error_body(message), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
        return JSONResponse(api.error_body(str(exc.detail), kind), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))


class _Gate:
    """Body size limit and API key, checked before routing.

    A plain ASGI middleware, the cheapest kind: a back polls and posts several times per
    token to a lead whose cores llama.cpp may be using."""

    OPEN = ("/health", "/docs", "/redoc", "/openapi.json", "/")  # and the page's files

    def __init__(self, app: ASGIApp, limit: int, api_key: str | None) -> None:
        self.app, self.limit = app, limit
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if scope["type"] == "http" and not _header(scope, b"content-length"):
            receive = self._counted(receive)  # a chunked body: no length to check up front
        await self.app(scope, receive, send)

    def _counted(self, receive: Receive) -> Receive:
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:  # FastAPI lets an HTTPException from its body read through
                raise StarletteHTTPException(413, f"request body over {self.limit} bytes")
            return message
        return counted

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"0")  # chunked bodies are counted as read
        if not length.isdigit() or int(length) > self.limit:
            return JSONResponse(api.error_body(f"request body over {self.limit} bytes"),
                                status_code=413)
        path = scope["path"]
        if self.expected is None or path in self.OPEN or path.startswith(STATIC_PREFIX) or \
                hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            return None
        return JSONResponse(api.error_body("missing or wrong API key (Authorization: Bearer "
                                           "KEY)", "authentication_error"), status_code=401)


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k == name), None)


def _openai_router(engine: Engine, settings: LeadSettings) -> APIRouter:
    router = APIRouter()
    model = engine.model

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model.name, "object": "model",
                                            "owned_by": "duo", "n_ctx": model.n_ctx}]}

    @router.post("/v1/chat/completions", response_model=None)
    async def chat(body: api.ChatRequest) -> Response:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        prompt_ids = model.tokenize(model.format_chat(messages), special=True, add_bos=False)
        return await _serve(engine, settings, body, prompt_ids, chat=True)

    @router.post("/v1/completions", response_model=None)
    async def completions(body: api.CompletionRequest) -> Response:
        prompt_ids = model.tokenize(body.prompt, special=False, add_bos=True)
        return await _serve(engine, settings, body, prompt_ids, chat=False)

    return router


def _gen_request(engine: Engine, settings: LeadSettings, body: api.CommonRequest,
                 prompt_ids: list[int]) -> GenRequest:
    n_ctx = engine.model.n_ctx
    if not prompt_ids:
        raise HTTPException(400, "the prompt is empty")
    if len(prompt_ids) >= n_ctx:
        raise HTTPException(400, f"the prompt is {len(prompt_ids)} tokens; the context holds "
                                 f"{n_ctx} (start lead with a larger --ctx-size)")
    wanted = body.wanted_tokens()
    if wanted is not None and wanted > n_ctx:
        raise HTTPException(400, f"max_tokens {wanted} exceeds the context size {n_ctx}")
    return GenRequest(prompt_ids, wanted or settings.max_tokens, body.sampling(0.0), body.stops())


async def _serve(engine: Engine, settings: LeadSettings, body: api.CommonRequest,
                 prompt_ids: list[int], chat: bool) -> Response:
    gen = engine.generate(_gen_request(engine, settings, body, prompt_ids))
    try:
        first = await anext(gen)  # waits its turn in the queue; 429 before any header
    except QueueFull:
        raise HTTPException(429, "lead is busy: the queue is full; retry shortly",
                            headers={"Retry-After": "1"}) from None
    kind = "chat.completion" if chat else "text_completion"
    rid = api.new_id("chatcmpl" if chat else "cmpl")
    if body.stream:
        return StreamingResponse(_sse(engine, gen, first, rid, kind, chat),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    emissions = [first, *[e async for e in gen]]
    text = "".join(e.text for e in emissions)
    session = emissions[-1].session
    assert session is not None, "the last emission carries the session"
    choice = api.chat_choice(text, session.finish_reason, False) if chat else \
        api.text_choice(text, session.finish_reason)
    return JSONResponse({**api.envelope(kind, rid, engine.model.name), "choices": [choice],
                         "usage": _usage(session)})


async def _sse(engine: Engine, gen: AsyncGenerator[Emission, None], first: Emission, rid: str,
               kind: str, chat: bool) -> AsyncIterator[str]:
    chunk_kind = f"{kind}.chunk" if chat else kind
    head = api.envelope(chunk_kind, rid, engine.model.name)

    def event(text: str, finish: str | None, n: int, from_draft: int, opening: bool = False,
              back: str = "", **extra: Any) -> str:
        choice = api.chat_choice(text, finish, True, opening) if chat else \
            api.text_choice(text, finish)
        duo: dict[str, Any] = {"tokens": n, "accepted": from_draft}
        if from_draft:
            duo["back"] = back  # which back drafted them (the page shows it on hover)
        payload = {**head, "choices": [choice], "duo": duo, **extra}
        return f"data: {json.dumps(payload)}\n\n"

    try:
        if chat:
            yield event("", None, 0, 0, opening=True)
        last = first
        async for e in _chain(first, gen):
            if e.text or e.n_tokens:  # a token with no text yet still counts: EOS, held text
                yield event(e.text, None, e.n_tokens, e.n_from_draft, back=e.back)
            last = e
        session = last.session
        assert session is not None, "the last emission carries the session"
        yield event("", session.finish_reason, 0, 0, usage=_usage(session))
        yield "data: [DONE]\n\n"
    finally:
        await gen.aclose()  # a client gone mid-stream ends its generation here


async def _chain(first: Emission, rest: AsyncIterator[Emission]) -> AsyncIterator[Emission]:
    yield first
    async for e in rest:
        yield e


def _usage(s: Session) -> dict[str, int]:
    return api.usage(s.n_prompt, s.n_generated, s.drafted, s.accepted)
