"""The back protocol (/duo/*) and /metrics."""

from __future__ import annotations

import math

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse, Response

from lead.drafts import BACKS_PER_ADDRESS, PostLimiter
from lead.engine import Engine
from shared.placement import LeadPlace
from shared.protocol import DraftPost, Info, State
from shared.sampling import Dist

MAX_WAIT_S = 30.0


def back_router(engine: Engine, place: LeadPlace, max_posts_per_s: float = 500.0,
                max_poll_s: float = MAX_WAIT_S) -> APIRouter:
    router = APIRouter()
    model, feed = engine.model, engine.feed
    limiter = PostLimiter(max_posts_per_s)
    retry_after = str(max(1, math.ceil(1 / max_posts_per_s)))  # seconds until one refills
    fingerprint = model.fingerprint()  # hashed here, before serving: not per request

    @router.get("/duo/info")
    async def info() -> Info:
        return Info(model=model.name, lead_id=feed.lead_id, n_vocab=model.n_vocab,
                    fingerprint=fingerprint, eos_token_ids=sorted(model.eos_token_ids),
                    n_ctx=model.n_ctx, max_draft=engine.max_draft, max_post=engine.max_post,
                    host=place.host, cpus=sorted(place.cpus), threads=place.threads)

    @router.get("/duo/state", response_model=State)
    async def state(request: Request,
                    since: int = Query(-1, description="return once version > since"),
                    offset: int = Query(0, ge=0, description="first token to return"),
                    wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S,
                                        description="seconds to wait for news"),
                    back: str = Query("", max_length=64, description="the asking back's id"),
                    quiet: str = Query("", max_length=64, description="a session id: wake "
                                       "only when it wants drafts, changes or ends"),
                    idle: bool = Query(False, description="with quiet: wake only when the "
                                       "session changes or ends (a back sitting out)"),
                    kind: str = Query("", max_length=16, description="the asking back's "
                                      "drafter (model, ngram), shown on lead's page"),
                    ) -> Response:
        if back:
            feed.back_seen(back, _address(request), kind, sits_out=idle)
        if wait > 0 and feed.version <= since:
            await feed.wait_state(since, min(wait, max_poll_s), quiet or None, idle)
        engine.metrics.state_polls += 1
        return _json(feed.state(offset, back))

    @router.post("/duo/draft", response_model=State)
    async def draft(post: DraftPost, request: Request) -> Response:
        address = _address(request)
        if not limiter.allow(address, post.back_id):
            raise HTTPException(429, f"more than {max_posts_per_s:g} draft posts per second "
                                     "from this back, or more than "
                                     f"{BACKS_PER_ADDRESS} backs' worth from its address",
                                headers={"Retry-After": retry_after})
        if len(post.token_ids) > engine.max_post:
            engine.metrics.drafts_invalid += 1
            raise HTTPException(400, f"draft of {len(post.token_ids)} tokens; lead takes at "
                                     f"most {engine.max_post} (max_post in /duo/info)")
        bad = _out_of_vocab(post, model.n_vocab)
        if bad is not None:
            engine.metrics.drafts_invalid += 1
            raise HTTPException(400, f"token id {bad} is outside the vocabulary "
                                     f"(0..{model.n_vocab - 1})")
        dists = [Dist(np.asarray(d.token_ids, np.int64), np.asarray(d.probs, np.float64))
                 for d in post.dists] if post.dists else None
        feed.back_seen(post.back_id, address)
        feed.post_draft(post.session_id, post.start, post.token_ids, dists, post.back_id)
        return _json(feed.state(post.start, post.back_id))

    @router.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return engine.metrics.prometheus(engine.gauges())

    return router


def _address(request: Request) -> str:
    return request.client.host if request.client else "?"


def _json(state: State) -> Response:
    # Serialised directly: FastAPI would validate the model it was just given again, on
    # lead's CPU, for every poll and post.
    return Response(state.model_dump_json(), media_type="application/json")


def _out_of_vocab(post: DraftPost, n_vocab: int) -> int | None:
    ids = list(post.token_ids)
    for d in post.dists or []:
        ids += d.token_ids
    return next((t for t in ids if not 0 <= t < n_vocab), None)
