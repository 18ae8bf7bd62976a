"""The back protocol (/duo/*): the info, the grammar of a session, and the link
(lead/backs/intake.py), on which a back hears every session's news and posts its drafts.

Backs choose their own ids, so what one address may hold is bounded: posts per second
(PostLimiter), places on the draft board, links open (LinkSlots); a back over a bound is
refused with a 429 and the seconds to wait, which a back waits out."""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import APIRouter, HTTPException, Query, WebSocket

from lead.backs.feed import BackFeed
from lead.backs.intake import DraftTaker, serve_link
from lead.backs.keys import Keys
from lead.backs.limits import PostLimiter
from lead.decode.engine import Engine
from shared.placement import LeadPlace
from shared.wire.protocol import Grammar, Info


def back_router(engine: Engine, feed: BackFeed, place: LeadPlace,
                max_posts_per_s: float = 500.0, keys: Keys | None = None,
                clock: Callable[[], float] = time.monotonic,
                max_message: int = 1 << 20) -> APIRouter:
    """`feed`: what backs see of `engine`'s sessions (lead/backs/feed.py `attach`); `keys`:
    who is a trusted back; None: no key at all, every back is trusted; `clock`: the time
    posts are rated by (tests give a fake one); `max_message`: the largest message a back
    may send on the link, bytes."""
    router = APIRouter()
    model = engine.model
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

    @router.get("/duo/grammar", response_model=Grammar)
    async def grammar(session: str = Query(..., max_length=64, description="the session "
                                           "whose grammar to send")) -> Grammar:
        held = feed.grammar_of(session)
        if held is None:
            raise HTTPException(404, f"session {session!r} is not running on lead, or its "
                                     "reply follows no grammar")
        return Grammar(session_id=session, grammar_id=held[0], grammar=held[1])

    @router.get("/duo/state", include_in_schema=False)
    @router.post("/duo/draft", include_in_schema=False)
    async def gone() -> None:
        raise HTTPException(410, "the long-polls are gone: a back hears news and posts drafts "
                                 "on the link (GET /duo/link, a WebSocket; docs/protocol.md)")

    @router.websocket("/duo/link")
    async def link(ws: WebSocket) -> None:
        await serve_link(ws, feed, posts, engine.metrics, max_message)

    return router
