"""The OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions.

A request takes its place in line first, so that a full queue is a 429 before any work;
then it is prepared on a worker thread (lead/apis/prepare.py) while it holds its place, then
waits for its turn. A client that leaves before its reply starts gives its place back.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from functools import partial
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from lead.apis import shapes, toolreply
from lead.apis.choices import choice_requests, interleaved
from lead.apis.openaireply import sessions_usage, sse
from lead.apis.prepare import Defaults, Prepared, prepare_chat, prepare_completion
from lead.apis.streaming import StreamedReply, unless_gone
from lead.apis.timings import timings
from lead.decode.admission import Place, QueueFull
from lead.decode.engine import Engine
from lead.decode.session import Emission
from shared.modelthread import Threads

Generation = AsyncGenerator[Emission, None]


def openai_router(engine: Engine, defaults: Defaults, workers: Threads,
                  card: dict[str, Any] | None = None) -> APIRouter:
    """`defaults`: what a request leaves out gets; `workers`: where requests are prepared;
    `card`: the model's aliases and tags, for /v1/models."""
    router = APIRouter()
    model = engine.model
    # each path also without /v1, as llama-server serves them (out of the schema: the same)

    @router.get("/models", include_in_schema=False, response_model=None)
    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        card_ = card or {}
        names = {"id": model.name, "aliases": card_.get("aliases") or [model.name],
                 "tags": card_.get("tags") or []}
        return {"object": "list", "data": [{**names, "object": "model", "owned_by": "duo",
                                            "n_ctx": model.n_ctx}]}

    @router.post("/chat/completions", include_in_schema=False, response_model=None)
    @router.post("/v1/chat/completions", response_model=None)
    async def chat(body: shapes.ChatRequest, request: Request) -> Response:
        shapes.check_served(body)
        check_choices(engine, body.n)
        shape = shapes.ReplyShape(chat=True, token_bytes=model.token_bytes,
                               logprobs=body.top_logprobs_wanted() is not None)
        prepare = partial(prepare_chat, model, defaults, body)
        return await _reply(engine, workers, request, body, shape, prepare,
                            body.verbose or defaults.verbose)

    @router.post("/v1/completions", response_model=None)
    async def completions(body: shapes.CompletionRequest, request: Request) -> Response:
        shapes.check_served(body)
        check_choices(engine, body.n)
        shape = shapes.ReplyShape(chat=False, token_bytes=model.token_bytes,
                                  prompt=None if body.logprobs is None else body.prompt)
        prepare = partial(prepare_completion, model, defaults, body)
        return await _reply(engine, workers, request, body, shape, prepare)

    return router


Whole = Callable[[list[Emission], Prepared], Response]  # a reply not streamed
# a streamed reply: its generation, not started, and what frees its places if never taken
Streamed = Callable[[Generation, Prepared, Callable[[], None]], Response]


async def reply(engine: Engine, workers: Threads, request: Request, stream: bool,
                prepare: Callable[[], Prepared], whole: Whole, streamed: Streamed,
                n: int = 1) -> Response:
    """A request's places in line (429 before any work; one per choice), its preparation
    off the event loop; then its reply, whole or streamed (from before its turn: the
    stream keeps the client waiting), in its API's shape."""
    places = _reserve(engine, n)  # 429 before any template, tokens or grammar

    def release() -> None:  # gone, refused or failed before its turn: free again
        for place in places:
            place.leave()
    try:
        prepared = await unless_gone(request.receive, workers.run(prepare))
    except BaseException:
        release()
        raise
    if prepared is None:
        release()
        return Response(status_code=499)  # the client left while it waited: nobody reads it
    gen = _generation(engine, prepared, places)
    if stream:
        return streamed(gen, prepared, release)
    try:
        emissions = await unless_gone(request.receive, _all(gen))
    finally:
        release()
    if emissions is None:
        return Response(status_code=499)
    return whole(emissions, prepared)


async def _reply(engine: Engine, workers: Threads, request: Request,
                 body: shapes.CommonRequest, shape: shapes.ReplyShape,
                 prepare: Callable[[], Prepared], verbose: bool = False) -> Response:
    rid = shapes.new_id("chatcmpl" if shape.chat else "cmpl")
    name = engine.model.name

    def streamed(gen: Generation, prepared: Prepared, release: Callable[[], None]
                 ) -> Response:
        return StreamedReply(gen, partial(sse, name, rid=rid, shape=shape, prepared=prepared,
                                          n=body.n, usage_apart=body.usage_apart(),
                                          clock=engine.clock,
                                          per_token=body.timings_per_token), release)
    return await reply(engine, workers, request, body.stream, prepare,
                       partial(_whole, name, rid, shape, verbose, engine.clock), streamed,
                       body.n)


def _whole(model: str, rid: str, shape: shapes.ReplyShape, verbose: bool,
           clock: Callable[[], float], emissions: list[Emission], prepared: Prepared
           ) -> JSONResponse:
    """A reply not streamed, from all of its emissions (each choice's)."""
    choices, sessions = [], []
    for i, own in sorted(by_choice(emissions).items()):
        text = "".join(e.text for e in own)
        session = own[-1].session
        assert session is not None, "the last emission carries the session"
        entries = [lp for e in own for lp in e.logprobs]
        choice = shape.choice(text, session.finish_reason, entries, index=i)
        chat = shape.chat and (prepared.plan is not None or prepared.thinks)
        choices.append(toolreply.with_parts(choice, prepared.parts(text)) if chat else choice)
        sessions.append(session)
    body = {**shapes.envelope(shape.kind, rid, model), "choices": choices,
            "usage": sessions_usage(*sessions), "timings": timings(sessions[-1], clock())}
    if verbose:  # llama-server's debugging aid: what the model was given
        body["__verbose"] = {"prompt": prepared.prompt,
                             "prompt_tokens": len(prepared.req.prompt_ids)}
    return JSONResponse(body)


def by_choice(emissions: list[Emission]) -> dict[int, list[Emission]]:
    out: dict[int, list[Emission]] = {}
    for e in emissions:
        out.setdefault(e.choice, []).append(e)
    return out


def _reserve(engine: Engine, n: int) -> list[Place]:
    places: list[Place] = []
    try:
        for _ in range(n):
            places.append(engine.reserve())
    except QueueFull:
        for place in places:
            place.leave()
        raise HTTPException(429, "lead is busy: the queue is full; retry shortly",
                            headers={"Retry-After": "1"}) from None
    return places


def check_choices(engine: Engine, n: int) -> None:
    """A 400 for more choices than lead can hold in line at once."""
    most = engine.admission.parallel + engine.admission.max_queue
    if n > most:
        raise shapes.FieldRefused("n", f"n: at most {most} choices (lead's --parallel and "
                                       "--max-queue together)")


def _generation(engine: Engine, prepared: Prepared, places: list[Place]) -> Generation:
    """The request's generation (each choice's, merged), not started: it waits for its
    turn in its places when first read."""
    gens = [engine.generate(req, place) for req, place in
            zip(choice_requests(prepared.req, len(places)), places, strict=True)]
    return gens[0] if len(gens) == 1 else interleaved(gens)


async def _all(gen: Generation) -> list[Emission]:
    try:
        return [e async for e in gen]
    finally:
        await gen.aclose()  # cancelled while queued, in its prompt or mid-reply: it ends here
