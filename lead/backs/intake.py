"""Draft posts as they come on the link: bounded, checked, put on the session's board; and
the link's socket (lead/backs/link.py holds what it sends).

A back chooses its own id, so what one address may post is bounded: posts per second
(PostLimiter) and places on a board. Every refusal (`Refused`) names its cause with an HTTP
status: a 400 naming the field, a 429 with the seconds to wait. Draft probabilities count
only from a back with the back key (lead/backs/keys.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import math

import numpy as np
from fastapi import HTTPException, WebSocket, WebSocketDisconnect
from pydantic import TypeAdapter, ValidationError

from lead.apis.renames import field_path, validation_message
from lead.apis.shapes import FieldRefused
from lead.backs.feed import BackFeed
from lead.backs.keys import Keys
from lead.backs.limits import BACKS_PER_ADDRESS, PostLimiter
from lead.backs.link import LinkedBack
from lead.decode.metrics import Metrics
from shared.branch import Branch
from shared.sampling import Dist
from shared.wire.protocol import BackMessage, DraftBranch, DraftDist, DraftPost, Hello, Refused

HEARTBEAT_S = 10.0  # an update, empty if need be, at least this often: a dead link shows
MESSAGES = TypeAdapter(BackMessage)


class DraftTaker:
    def __init__(self, feed: BackFeed, metrics: Metrics, n_vocab: int, max_post: int,
                 limiter: PostLimiter, keys: Keys) -> None:
        self.feed, self.metrics, self.n_vocab, self.max_post = feed, metrics, n_vocab, max_post
        self.limiter, self.keys = limiter, keys
        self.retry_after = max(1, math.ceil(1 / limiter.per_back.rate))  # one refills

    def take(self, post: DraftPost, address: str, authorization: bytes) -> None:
        """Put the post on its session's board, or raise the HTTPException that refuses it."""
        if not self.limiter.allow(address, post.back_id):
            raise HTTPException(429, f"more than {self.limiter.per_back.rate:g} draft posts "
                                     "per second from this back, or more than "
                                     f"{BACKS_PER_ADDRESS} backs' worth from its address",
                                headers={"Retry-After": str(self.retry_after)})
        _check_size(post, self.max_post, self.metrics)
        _check_vocab(post, self.n_vocab, self.metrics)
        if self.feed.board_full_for(address, post.back_id, post.session_id):
            raise HTTPException(429, f"{BACKS_PER_ADDRESS} other backs from this address hold "
                                     "drafts on lead's board; this one's post was not taken",
                                headers={"Retry-After": str(self.retry_after)})
        self.feed.post_draft(post.session_id, post.start, post.token_ids, _dists(post.dists),
                             post.back_id, [_branch(b) for b in post.branches],
                             address=address, trusted=self.keys.trusted_back(authorization),
                             probs=post.probs)


async def serve_link(ws: WebSocket, feed: BackFeed, posts: DraftTaker, metrics: Metrics,
                     max_message: int) -> None:
    """One back's link, until it closes: its messages taken as they come, news pushed."""
    address = ws.client.host if ws.client else "?"
    if not feed.links.take(address):  # accepted first: a close before it is a 403
        await ws.accept()
        await ws.close(1013, "too many links open from this address")
        return
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # closed (RuntimeError:
        await _serve(ws, feed, posts, metrics, max_message, address)  # mid-send)


async def _serve(ws: WebSocket, feed: BackFeed, posts: DraftTaker, metrics: Metrics,
                 max_message: int, address: str) -> None:
    authorization = ws.headers.get("authorization", "").encode("latin-1")
    link = LinkedBack(feed)
    pusher: asyncio.Task[None] | None = None  # news goes out once the back said hello
    try:
        await ws.accept()
        while True:
            text = await _text_frame(ws)
            refused = _handle(text, link, posts, address, authorization, max_message) \
                if text is not None else Refused(status=400, message="a frame is JSON text, "
                                                                     "not binary")
            if refused is not None:
                await ws.send_text(refused.model_dump_json(exclude_none=True))
            elif pusher is None and link.greeted:
                pusher = asyncio.create_task(_push(ws, link, metrics))
    finally:
        if pusher is not None:
            pusher.cancel()
            await asyncio.gather(pusher, return_exceptions=True)
        feed.links.give(address)


async def _text_frame(ws: WebSocket) -> str | None:
    """The next frame's text (None for a binary frame); WebSocketDisconnect at the end."""
    frame = await ws.receive()
    if frame["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(frame.get("code", 1000))
    return frame.get("text")


async def _push(ws: WebSocket, link: LinkedBack, metrics: Metrics) -> None:
    feed = link.feed
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            await feed.wait_news(link.version, HEARTBEAT_S, link.has_news)
            update = link.update() or link.heartbeat()  # (nothing new: the heartbeat)
            metrics.link_updates += 1
            await ws.send_text(update.model_dump_json(exclude_none=True))


def _handle(text: str, link: LinkedBack, posts: DraftTaker, address: str, authorization: bytes,
            max_message: int) -> Refused | None:
    """Take one message from the back; what refuses it, if anything does."""
    if len(text) > max_message:
        return Refused(status=413, message=f"message over {max_message} bytes")
    try:
        message = MESSAGES.validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = field_path(_in_message(tuple(first.get("loc", ())), first.get("type")))
        said = validation_message(first)
        return Refused(status=400, message=f"{where}: {said}" if where else said,
                       param=where or None)
    if isinstance(message, Hello):
        link.hello(message)
        link.feed.back_seen(message.back_id, address, message.kind, sits_out=message.idle)
        return None
    try:
        posts.take(message.draft, address, authorization)
    except HTTPException as exc:
        wait = float((exc.headers or {}).get("Retry-After", 0))
        return Refused(status=exc.status_code, message=str(exc.detail),
                       param=getattr(exc, "param", None), retry_after=wait,
                       session_id=message.draft.session_id)
    return None


def _in_message(loc: tuple[int | str, ...], kind: str | None) -> tuple[int | str, ...]:
    """A field's place in the message the back sent, as lead's HTTP errors name it: past the
    message's type, and a draft's own name (("draft", "draft", "start") -> ("start",)),
    unless the draft itself is what is missing or no object."""
    inside = loc[1:]
    own = inside[:1] == ("draft",) and (len(inside) > 1 or kind == "value_error")
    return inside[1:] if own else inside


def _dists(dists: list[DraftDist] | None) -> list[Dist] | None:
    return [Dist(np.asarray(d.token_ids, np.int64), np.asarray(d.probs, np.float64))
            for d in dists] if dists else None


def _branch(branch: DraftBranch) -> Branch:
    dists = _dists(branch.dists)
    return Branch(branch.at, tuple(branch.token_ids), tuple(dists) if dists else None)


def _check_size(post: DraftPost, max_post: int, metrics: Metrics) -> None:
    """A 400 for a chain (main or branch) longer than lead takes in one post."""
    chains = [("token_ids", post.token_ids)] + [
        (f"branches[{i}].token_ids", b.token_ids) for i, b in enumerate(post.branches)]
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
        (f"branches[{i}].", b.token_ids, b.dists) for i, b in enumerate(post.branches)]
    for prefix, ids, dists in fields:
        groups = [(f"{prefix}token_ids", ids)] + [
            (f"{prefix}dists[{j}].token_ids", d.token_ids) for j, d in enumerate(dists or [])]
        for where, group in groups:
            token = next((t for t in group if not 0 <= t < n_vocab), None)
            if token is not None:
                return where, token
    return None
