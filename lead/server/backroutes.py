"""The back protocol (/duo/*): the info, the link (lead/server/backposts.py), and a
back following one session by long-polls (state, grammar, draft posts).

Backs choose their own ids, so what one address may hold is bounded: posts per second
(PostLimiter), places on the draft board, links and long-polls open (PollSlots); a back over
a bound gets a 429 with Retry-After, which a back waits out."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, HTTPException, Query, Request, WebSocket
from fastapi.responses import Response

from lead.apis.streaming import unless_gone
from lead.decode.engine import Engine
from lead.drafts.limits import POLLS_PER_ADDRESS, PostLimiter
from lead.server.backposts import DraftTaker, serve_link
from lead.server.keys import Keys
from shared.placement import LeadPlace
from shared.protocol import DraftPost, Grammar, Info, State

MAX_WAIT_S = 30.0
POLL_RETRY_S = "1"  # a back refused a long-poll waits this long, seconds


def back_router(engine: Engine, place: LeadPlace, max_posts_per_s: float = 500.0,
                max_poll_s: float = MAX_WAIT_S, keys: Keys | None = None,
                clock: Callable[[], float] = time.monotonic,
                max_message: int = 1 << 20) -> APIRouter:
    """`keys`: who is a trusted back; None: no key at all, every back is trusted; `clock`:
    the time posts are rated by (tests give a fake one); `max_message`: the largest
    message a back may send on the link, bytes."""
    router = APIRouter()
    model, feed = engine.model, engine.feed
    posts = DraftTaker(feed, engine.metrics, model.n_vocab, engine.max_post,
                       PostLimiter(max_posts_per_s, clock), keys or Keys())
    fingerprint = model.fingerprint()  # hashed here, before serving: not per request

    @router.get("/duo/info")
    async def info() -> Info:
        return Info(model=model.name, lead_id=feed.lead_id, n_vocab=model.n_vocab,
                    fingerprint=fingerprint, eos_token_ids=sorted(model.eos_token_ids),
                    n_ctx=model.n_ctx, max_draft=engine.max_draft, max_post=engine.max_post,
                    host=place.host, cpus=sorted(place.cpus), threads=place.threads,
                    slots=engine.n_slots, link=True)

    @router.get("/duo/state", response_model=State)
    async def state(request: Request,
                    since: int = Query(-1, description="return once version > since"),
                    offset: int = Query(0, ge=0, description="first token to return"),
                    wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S, allow_inf_nan=False,
                                        description="seconds to wait for news"),
                    back: str = Query("", max_length=64, description="the asking back's id"),
                    quiet: str = Query("", max_length=64, description="a session id: wake "
                                       "only when it wants drafts, changes or ends"),
                    idle: bool = Query(False, description="with quiet: wake only when the "
                                       "session changes or ends (a back sitting out)"),
                    kind: str = Query("", max_length=16, description="the asking back's "
                                      "drafter (model, ngram), shown on lead's page"),
                    ) -> Response:
        address = _address(request)
        if back:
            feed.back_seen(back, address, kind, sits_out=idle)
        if wait > 0 and feed.version <= since:
            if not feed.polls.take(address):
                raise HTTPException(429, f"more than {POLLS_PER_ADDRESS} long-polls open at "
                                         "once from this address",
                                    headers={"Retry-After": POLL_RETRY_S})
            try:  # a back gone while it waits frees its place at once
                waited = await unless_gone(request.receive, _waited(feed.wait_state(
                    since, min(wait, max_poll_s), quiet or None, idle, back)))
            finally:
                feed.polls.give(address)
            if waited is None:
                return Response(status_code=499)  # nobody reads it
        engine.metrics.state_polls += 1
        return _json(feed.state(offset, back))

    @router.get("/duo/grammar", response_model=Grammar)
    async def grammar(session: str = Query(..., max_length=64, description="the session "
                                           "whose grammar to send")) -> Grammar:
        held = feed.grammar_of(session)
        if held is None:
            raise HTTPException(404, f"session {session!r} is not running on lead, or its "
                                     "reply follows no grammar")
        return Grammar(session_id=session, grammar_id=held[0], grammar=held[1])

    @router.post("/duo/draft", response_model=State)
    async def draft(post: DraftPost, request: Request) -> Response:
        posts.take(post, _address(request), _authorization(request))
        return _json(feed.state(post.start, post.back_id, post.session_id))

    @router.websocket("/duo/link")
    async def link(ws: WebSocket) -> None:
        await serve_link(ws, feed, posts, engine.metrics, max_message)

    return router


async def _waited(wait: Awaitable[None]) -> bool:
    await wait
    return True


def _address(request: Request) -> str:
    return request.client.host if request.client else "?"


def _authorization(request: Request) -> bytes:
    # Starlette decodes headers as latin-1: encoding back gives the bytes as sent.
    return request.headers.get("authorization", "").encode("latin-1")


def _json(state: State) -> Response:
    # Serialised directly: FastAPI would validate the model it was just given again, on
    # lead's CPU, for every poll and post.
    return Response(state.model_dump_json(), media_type="application/json")


