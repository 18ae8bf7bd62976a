"""create_app(settings, target=None): the lead's HTTP surface.

OpenAI-compatible chat/completions (streaming as SSE), the back protocol under
/duo, /metrics, /health, and a web page at / (lead/webroutes.py). Tests inject a fake
target; production loads GGUF.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lead import api, structured, toolreply
from lead.admission import QueueFull
from lead.backroutes import back_router
from lead.engine import Engine
from lead.session import Emission, GenRequest, Session
from lead.settings import LeadSettings
from lead.toolparse import Delta
from lead.tools import ToolPlan
from lead.webroutes import STATIC_PREFIX, mount_web
from shared.model import Model
from shared.placement import LeadPlace, Placement, allowed_cpus, choose_lead

T = TypeVar("T")


def lead_placement(settings: LeadSettings) -> Placement:
    return choose_lead(settings.cpus, settings.threads, allowed_cpus(),
                       on_gpu=settings.n_gpu_layers < 0)


def create_app(settings: LeadSettings, target: Model | None = None,
               clock: Callable[[], float] = time.perf_counter) -> FastAPI:
    """`clock` prices the target's steps: tests give a fake target a virtual one."""
    placement = lead_placement(settings)
    model = target if target is not None else _load_target(settings, placement.threads)
    engine = Engine(model, max_draft=settings.max_draft, draft_len=settings.draft_len,
                    max_queue=settings.max_queue, batch=settings.batch_size, clock=clock,
                    tree=settings.tree)
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
                      tensor_split=settings.tensor_split, branches=settings.tree)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        return JSONResponse(api.error_body(message, param=where or None), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
        body = api.error_body(str(exc.detail), kind, param=getattr(exc, "param", None))
        return JSONResponse(body, status_code=exc.status_code,
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
    async def chat(body: api.ChatRequest, request: Request) -> Response:
        api.check_served(body)
        try:
            plan, prompt = toolreply.chat_prompt(model, body)
        except ValueError as exc:  # the model's template refuses these messages
            raise HTTPException(400, f"messages: the chat template refuses them: {exc}") \
                from None
        prompt_ids = model.tokenize(prompt, special=True, add_bos=False)
        shape = api.ReplyShape(chat=True, token_bytes=model.token_bytes,
                               logprobs=body.top_logprobs_wanted() is not None)
        return await _serve(engine, settings, body, prompt_ids, shape, request, plan)

    @router.post("/v1/completions", response_model=None)
    async def completions(body: api.CompletionRequest, request: Request) -> Response:
        api.check_served(body)
        prompt_ids = model.tokenize(body.prompt, special=False, add_bos=True)
        logprobs = None if body.logprobs is None else \
            api.CompletionLogprobs(body.prompt, model.token_bytes)
        shape = api.ReplyShape(chat=False, token_bytes=model.token_bytes, completion=logprobs)
        return await _serve(engine, settings, body, prompt_ids, shape, request)

    return router


def _gen_request(engine: Engine, settings: LeadSettings, body: api.CommonRequest,
                 prompt_ids: list[int], plan: ToolPlan | None) -> GenRequest:
    n_ctx = engine.model.n_ctx
    if not prompt_ids:
        raise HTTPException(400, "the prompt is empty")
    if len(prompt_ids) >= n_ctx:
        raise HTTPException(400, f"the prompt is {len(prompt_ids)} tokens; the context holds "
                                 f"{n_ctx} (start lead with a larger --ctx-size)")
    wanted = body.wanted_tokens()
    if wanted is not None and wanted > n_ctx:
        raise HTTPException(400, f"max_tokens {wanted} exceeds the context size {n_ctx}")
    outside = [t for t in body.logit_bias or {} if t >= engine.model.n_vocab]
    if outside:
        raise api.FieldRefused("logit_bias", f"logit_bias: token id {outside[0]} is outside "
                                             f"the vocabulary (0-{engine.model.n_vocab - 1})")
    forced = toolreply.forced_grammar(plan, engine.model) if plan is not None else None
    params = body.sampling(0.0)
    constrained = structured.constraint_of(body, engine.model, forced)
    if constrained is not None:
        params = params.model_copy(update={"grammar": constrained[0]})
    return GenRequest(prompt_ids, wanted or settings.max_tokens, params, body.stops(),
                      body.top_logprobs_wanted(), constrained[1] if constrained else None)


async def _serve(engine: Engine, settings: LeadSettings, body: api.CommonRequest,
                 prompt_ids: list[int], shape: api.ReplyShape, request: Request,
                 plan: ToolPlan | None = None) -> Response:
    gen = engine.generate(_gen_request(engine, settings, body, prompt_ids, plan))
    first = await _unless_gone(request, gen, _first(gen))  # its turn in the queue
    if first is None:
        return Response(status_code=499)  # the client left while it waited: nobody reads it
    rid = api.new_id("chatcmpl" if shape.chat else "cmpl")
    if body.stream:
        return StreamingResponse(_sse(engine, gen, first, rid, shape, toolreply.Deltas(plan)),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    emissions = await _unless_gone(request, gen, _rest(first, gen))
    if emissions is None:
        return Response(status_code=499)
    text = "".join(e.text for e in emissions)
    session = emissions[-1].session
    assert session is not None, "the last emission carries the session"
    entries = [lp for e in emissions for lp in e.logprobs]
    choice = shape.choice(text, session.finish_reason, entries)
    if plan is not None:
        choice = toolreply.with_calls(choice, plan, text)
    return JSONResponse({**api.envelope(shape.kind, rid, engine.model.name),
                         "choices": [choice], "usage": _usage(session)})


async def _first(gen: AsyncGenerator[Emission, None]) -> Emission:
    try:
        return await anext(gen)  # 429 before any header
    except QueueFull:
        raise HTTPException(429, "lead is busy: the queue is full; retry shortly",
                            headers={"Retry-After": "1"}) from None


async def _rest(first: Emission, gen: AsyncGenerator[Emission, None]) -> list[Emission]:
    return [first, *[e async for e in gen]]


async def _unless_gone(request: Request, gen: AsyncGenerator[Emission, None],
                       work: Coroutine[Any, Any, T]) -> T | None:
    """`work`'s result, or None if the client disconnects first: then the generation
    ends at once, as a stream's does (Starlette watches a stream; nothing else does)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await gen.aclose()
    return task.result() if not task.cancelled() else None


async def _disconnect(request: Request) -> None:
    """Returns when the client disconnects (the body is read: nothing else comes); never
    where the server cannot tell, and the reply then runs to its end."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:
        await asyncio.get_running_loop().create_future()  # until cancelled


async def _sse(engine: Engine, gen: AsyncGenerator[Emission, None], first: Emission, rid: str,
               shape: api.ReplyShape, deltas: toolreply.Deltas | None = None) -> AsyncIterator[str]:
    head = api.envelope(f"{shape.kind}.chunk" if shape.chat else shape.kind, rid,
                        engine.model.name)
    deltas = deltas or toolreply.Deltas(None)  # None: the text is all content

    def event(e: Emission | None, part: Delta | None = None, finish: str | None = None,
              opening: bool = False, **extra: Any) -> str:
        part = part or {}
        choice = shape.choice(part.get("content", ""), finish, e.logprobs if e else None,
                              delta=True, opening=opening)
        if "tool_calls" in part:
            choice["delta"]["tool_calls"] = part["tool_calls"]
        duo: dict[str, Any] = {"tokens": e.n_tokens if e else 0,
                               "accepted": e.n_from_draft if e else 0}
        if e and e.n_from_draft:
            duo["back"] = e.back  # which back drafted them (the page shows it on hover)
        payload = {**head, "choices": [choice], "duo": duo, **extra}
        return f"data: {json.dumps(payload)}\n\n"

    try:
        if shape.chat:
            yield event(None, opening=True)
        last = first
        async for e in _chain(first, gen):
            if e.text or e.n_tokens:  # a token with no text yet still counts: EOS, held text
                parts = deltas.push(e.text)
                yield event(e, parts[0] if parts else None)
                for part in parts[1:]:
                    yield event(None, part)
            last = e
        for part in deltas.finish():
            yield event(None, part)
        session = last.session
        assert session is not None, "the last emission carries the session"
        yield event(None, finish=deltas.finish_reason(session.finish_reason),
                    usage=_usage(session))
        yield "data: [DONE]\n\n"
    finally:
        await gen.aclose()  # a client gone mid-stream ends its generation here


async def _chain(first: Emission, rest: AsyncIterator[Emission]) -> AsyncIterator[Emission]:
    yield first
    async for e in rest:
        yield e


def _usage(s: Session) -> dict[str, int]:
    return api.usage(s.n_prompt, s.n_generated, s.drafted, s.accepted)
