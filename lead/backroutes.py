"""The back protocol (/duo/*) and /metrics.

Backs choose their own ids, so what one address may hold is bounded: posts per second
(PostLimiter), places on the draft board, long-polls open (PollSlots); a back over a bound
gets a 429 with Retry-After, which a back waits out. Draft probabilities count only from a
back with the back key (lead/keys.py)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse, Response

from lead.api import FieldRefused
from lead.backfeed import POLLS_PER_ADDRESS
from lead.drafts import BACKS_PER_ADDRESS, Branch, PostLimiter
from lead.engine import Engine
from lead.keys import Keys
from lead.metrics import Metrics
from shared.placement import LeadPlace
from shared.protocol import DraftBranch, DraftDist, DraftPost, Grammar, Info, State
from shared.sampling import Dist

MAX_WAIT_S = 30.0
POLL_RETRY_S = "1"  # a back refused a long-poll waits this long, seconds


def back_router(engine: Engine, place: LeadPlace, max_posts_per_s: float = 500.0,
                max_poll_s: float = MAX_WAIT_S, keys: Keys | None = None,
                clock: Callable[[], float] = time.monotonic) -> APIRouter:
    """`keys`: who is a trusted back; None: no key at all, every back is trusted; `clock`:
    the time posts are rated by (tests give a fake one)."""
    router = APIRouter()
    keys = keys or Keys()
    model, feed = engine.model, engine.feed
    limiter = PostLimiter(max_posts_per_s, clock)
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
        address = _address(request)
        if back:
            feed.back_seen(back, address, kind, sits_out=idle)
        if wait > 0 and feed.version <= since:
            if not feed.polls.take(address):
                raise HTTPException(429, f"more than {POLLS_PER_ADDRESS} long-polls open at "
                                         "once from this address",
                                    headers={"Retry-After": POLL_RETRY_S})
            try:
                await feed.wait_state(since, min(wait, max_poll_s), quiet or None, idle)
            finally:
                feed.polls.give(address)
        engine.metrics.state_polls += 1
        return _json(feed.state(offset, back))

    @router.get("/duo/grammar", response_model=Grammar)
    async def grammar(session: str = Query(..., max_length=64, description="the session "
                                           "whose grammar to send")) -> Grammar:
        held = feed.grammar_of(session)
        if held is None:
            raise HTTPException(404, f"session {session!r} is not lead's current session, or "
                                     "its reply follows no grammar")
        return Grammar(session_id=session, grammar_id=held[0], grammar=held[1])

    @router.post("/duo/draft", response_model=State)
    async def draft(post: DraftPost, request: Request) -> Response:
        address = _address(request)
        if not limiter.allow(address, post.back_id):
            raise HTTPException(429, f"more than {max_posts_per_s:g} draft posts per second "
                                     "from this back, or more than "
                                     f"{BACKS_PER_ADDRESS} backs' worth from its address",
                                headers={"Retry-After": retry_after})
        _check_size(post, engine.max_post, engine.metrics)
        _check_vocab(post, model.n_vocab, engine.metrics)
        if feed.board_full_for(address, post.back_id):
            raise HTTPException(429, f"{BACKS_PER_ADDRESS} other backs from this address hold "
                                     "drafts on lead's board; this one's post was not taken",
                                headers={"Retry-After": retry_after})
        feed.post_draft(post.session_id, post.start, post.token_ids, _dists(post.dists),
                        post.back_id, [_branch(b) for b in post.branches], address=address,
                        trusted=keys.trusted_back(_authorization(request)), probs=post.probs)
        return _json(feed.state(post.start, post.back_id))

    @router.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return engine.metrics.prometheus(engine.gauges())

    return router


def _address(request: Request) -> str:
    return request.client.host if request.client else "?"


def _authorization(request: Request) -> bytes:
    # Starlette decodes headers as latin-1: encoding back gives the bytes as sent.
    return request.headers.get("authorization", "").encode("latin-1")


def _json(state: State) -> Response:
    # Serialised directly: FastAPI would validate the model it was just given again, on
    # lead's CPU, for every poll and post.
    return Response(state.model_dump_json(), media_type="application/json")


def _dists(dists: list[DraftDist] | None) -> list[Dist] | None:
    return [Dist(np.asarray(d.token_ids, np.int64), np.asarray(d.probs, np.float64))
            for d in dists] if dists else None


def _branch(branch: DraftBranch) -> Branch:
    dists = _dists(branch.dists)
    return Branch(branch.at, tuple(branch.token_ids), tuple(dists) if dists else None)


def _check_size(post: DraftPost, max_post: int, metrics: Metrics) -> None:
    """A 400 for a chain (main or branch) longer than lead takes in one post."""
    chains = [("token_ids", post.token_ids)] + [
        (f"branches.{i}.token_ids", b.token_ids) for i, b in enumerate(post.branches)]
    for where, ids in chains:
        if len(ids) > max_post:
            metrics.drafts_invalid += 1
            raise FieldRefused(where, f"{where}: draft of {len(ids)} tokens; lead takes at "
                                      f"most {max_post} (max_post in /duo/info)")


def _check_vocab(post: DraftPost, n_vocab: int, metrics: Metrics) -> None:
    """A 400 naming the first field that holds an id outside the vocabulary."""
    bad = _out_of_vocab(post, n_vocab)
    if bad is not None:
        metrics.drafts_invalid += 1
        where, token = bad
        raise FieldRefused(where, f"{where}: token id {token} is outside the vocabulary "
                                  f"(0..{n_vocab - 1})")


def _out_of_vocab(post: DraftPost, n_vocab: int) -> tuple[str, int] | None:
    """(field, id) of the first id outside the vocabulary, in the main chain, the
    branches or any of their dists."""
    fields = [("", post.token_ids, post.dists)] + [
        (f"branches.{i}.", b.token_ids, b.dists) for i, b in enumerate(post.branches)]
    for prefix, ids, dists in fields:
        groups = [(f"{prefix}token_ids", ids)] + [
            (f"{prefix}dists.{j}.token_ids", d.token_ids) for j, d in enumerate(dists or [])]
        for where, group in groups:
            token = next((t for t in group if not 0 <= t < n_vocab), None)
            if token is not None:
                return where, token
    return None
