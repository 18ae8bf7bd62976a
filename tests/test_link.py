"""The link (GET /duo/link, a WebSocket): what lead pushes to a back and takes from it, and a
back drafting for several sessions at once over it (fake models, in one process)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import time
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from httpx_ws import connect_ws
from httpx_ws.transport import ASGIWebSocketTransport
from starlette.websockets import WebSocketDisconnect

from back import leadlink
from back.client import LeadClient
from back.drafter import ModelDrafter
from back.leadlink import NEWS_S, Link
from back.worker import Worker
from bench.fake import FakeModel, VirtualClock
from lead.backs.feed import BackFeed
from lead.backs.link import LinkedBack
from lead.decode.metrics import Metrics
from lead.decode.session import Session
from lead.policy.cost import CostModel
from lead.server.app import create_app
from shared.wire.protocol import Hello, SamplingParams, SessionState, State, Stop, Update
from tests.conftest import async_wait_until, make_settings
from tests.test_inprocess import text_of, with_workers


def session(sid: str, tokens: list[int], temperature: float = 0.0) -> Session:
    return Session(id=sid, tokens=list(tokens), n_prompt=len(tokens),
                   params=SamplingParams(temperature=temperature), rng=np.random.default_rng(0))


# --- what lead sends (pure over the feed) ---


def test_an_update_carries_only_what_the_back_was_not_sent() -> None:
    feed = BackFeed(CostModel(max_draft=8, fixed=4), Metrics())
    link = LinkedBack(feed)
    a = session("a", [1, 2, 3])
    feed.start(a)
    first = link.update()
    assert first is not None and [s.session_id for s in first.sessions] == ["a"]
    assert first.sessions[0].token_ids == [1, 2, 3] and first.sessions[0].sampling is not None
    assert link.update() is None  # nothing new
    a.tokens += [4, 5]
    feed.notify(["a"])
    second = link.update()
    assert second is not None
    only = second.sessions[0]
    assert (only.offset, only.token_ids, only.n_tokens) == (3, [4, 5], 5)
    assert only.sampling is None  # sent once
    b = session("b", [9])
    feed.start(b)
    a.tokens.append(6)
    feed.notify(["a"])
    third = link.update()
    assert third is not None and {s.session_id: s.token_ids for s in third.sessions} == \
        {"a": [6], "b": [9]}
    a.finish_reason = "stop"
    feed.end(a)
    ended = link.update()
    assert ended is not None and [(s.session_id, s.done) for s in ended.sessions] == \
        [("a", True)]


def test_an_update_says_how_long_lead_s_step_under_way_has_left() -> None:
    now = [10.0]
    feed = BackFeed(CostModel(max_draft=8, fixed=4), Metrics(), clock=lambda: now[0])
    link = LinkedBack(feed)
    feed.start(session("a", [1, 2, 3]))
    first = link.update()
    assert first is not None and first.step_left_s is None  # no step priced yet
    feed.step_began(0.03)
    now[0] += 0.01  # sent 10 ms into the step
    feed.notify(["a"])
    update = link.update()
    assert update is not None and update.step_left_s == pytest.approx(0.02)
    now[0] += 0.05  # the step ran over its price: none left, not less than none
    assert feed.step_left() == 0.0
    feed.step_began(None)
    assert feed.step_left() is None


def test_a_back_sitting_out_hears_only_of_sessions_starting_and_ending() -> None:
    feed = BackFeed(CostModel(max_draft=8, fixed=4), Metrics())
    link = LinkedBack(feed)
    link.hello(Hello(idle=True))
    a = session("a", [1, 2])
    feed.start(a)
    assert link.update() is not None  # it began
    a.tokens.append(3)
    feed.notify(["a"])
    assert not link.has_news() and link.update() is None  # a step: not for this back
    feed.end(a)
    assert link.update() is not None


def test_news_of_a_quiet_session_comes_only_when_it_wants_drafts() -> None:
    cost = CostModel(max_draft=8, fixed=0)  # no drafts wanted
    feed = BackFeed(cost, Metrics())
    link = LinkedBack(feed)
    a, b = session("a", [1, 2]), session("b", [5])
    feed.start(a)
    feed.start(b)
    link.update()
    link.hello(Hello(quiet=["a"], ignored=["b"]))
    a.tokens.append(3)
    b.tokens.append(6)
    feed.notify(["a", "b"])
    assert link.update() is None
    cost.fixed = 2  # now it does
    feed.notify(["a", "b"])
    got = link.update()
    assert got is not None and [s.session_id for s in got.sessions] == ["a"]  # never b


class Switched(CostModel):
    """A cost model whose hush a test sets."""

    hushed = False

    @property
    def hush(self) -> bool:
        return self.hushed


def test_one_field_says_why_lead_wants_no_drafts_and_a_hush_is_news_of_every_session() -> None:
    cost = Switched(max_draft=8, fixed=4)
    feed = BackFeed(cost, Metrics())
    link = LinkedBack(feed)
    a = session("a", [1, 2])
    feed.start(a)
    asked = link.update()
    assert asked is not None and (asked.sessions[0].draft_len, asked.sessions[0].stop) == (4, None)
    cost.hushed = True
    feed.log_hush()  # no token changed, yet every session has news: its stop
    hushed = link.update()
    assert hushed is not None and (hushed.sessions[0].draft_len, hushed.sessions[0].stop) == \
        (0, Stop.SLOWED)
    cost.hushed, cost.fixed = False, 0
    feed.log_hush()
    assert link.update().sessions[0].stop == Stop.UNPAID  # type: ignore[union-attr]
    a.finish_reason = "stop"
    feed.end(a)
    assert link.update().sessions[0].stop == Stop.DONE  # type: ignore[union-attr]


def test_a_state_from_a_lead_that_predates_stop_reads_its_reason_from_what_it_sent() -> None:
    live = {"session_id": "a", "done": False}
    assert SessionState.model_validate({**live, "draft_len": 3}).stop is None
    assert SessionState.model_validate({**live, "draft_len": 0}).stop == Stop.UNPAID
    assert State.model_validate({**live, "draft_len": 3, "hush": True}).stop == Stop.SLOWED
    assert State.model_validate({"session_id": "a", "draft_len": 3}).stop == Stop.DONE
    assert State.model_validate({**live, "draft_len": 2, "stop": None}).stop is None


# --- the socket ---


def link_app(**settings: object) -> TestClient:
    return TestClient(create_app(make_settings(calibrate=False, **settings), FakeModel()))


def link_post(ws: Any, draft: dict[str, Any] | str) -> dict[str, Any] | None:
    """Post `draft` (a draft's fields, or a whole message's text) on the link `ws` of a back
    that said no hello (so no update comes): lead's refusal, or None where it took the post
    (a binary frame sent after it, always refused, shows it was read)."""
    ws.send_text(draft if isinstance(draft, str) else
                 json.dumps({"type": "draft", "draft": draft}))
    ws.send_bytes(b"read?")
    answer = json.loads(ws.receive_text())
    if "binary" in answer["message"]:
        return None
    assert "binary" in json.loads(ws.receive_text())["message"]
    return answer


def test_messages_lead_cannot_take_are_refused_naming_why_and_the_link_stays() -> None:
    with link_app() as client, client.websocket_connect("/duo/link") as ws:
        ws.send_text("not json")
        assert json.loads(ws.receive_text())["status"] == 400
        ws.send_text(json.dumps({"type": "draft", "draft": {"session_id": "s", "start": 0,
                                                           "token_ids": []}}))
        refused = json.loads(ws.receive_text())
        assert refused["status"] == 400 and refused["param"] == "token_ids"  # as HTTP's
        ws.send_text(json.dumps({"type": "draft"}))  # no draft at all: its field named
        assert json.loads(ws.receive_text())["param"] == "draft"
        ws.send_bytes(b"x")  # a binary frame: refused, not a traceback and the link gone
        assert "binary" in json.loads(ws.receive_text())["message"]
        ws.send_text(json.dumps({"type": "draft", "draft": {
            "session_id": "s", "start": 0, "token_ids": [1, 2], "probs": [0.5]}}))
        refused = json.loads(ws.receive_text())  # a post's own check: no field, its words
        assert "param" not in refused and refused["message"].startswith("probs must"), \
            refused
        ws.send_text(json.dumps({"type": "draft", "draft": {
            "session_id": "s", "start": 0, "token_ids": [10_000]}}))
        refused = json.loads(ws.receive_text())
        assert refused["status"] == 400 and "vocabulary" in refused["message"]
        ws.send_text("x" * (2 << 20))
        assert json.loads(ws.receive_text())["status"] == 413
        ws.send_text(json.dumps({"type": "hello", "back_id": "b", "kind": "model"}))
        update = json.loads(ws.receive_text())  # still open: its first update
        assert update["type"] == "update" and update["sessions"] == []


def test_posts_over_their_rate_are_refused_with_the_wait() -> None:
    with link_app(max_draft_posts=1.0) as client, client.websocket_connect("/duo/link") as ws:
        post = json.dumps({"type": "draft", "draft": {"session_id": "s", "start": 0,
                                                     "token_ids": [5], "back_id": "b"}})
        ws.send_text(post)  # taken (stale: no such session) and nothing is answered
        ws.send_text(post)
        refused = json.loads(ws.receive_text())
        assert refused["status"] == 429 and refused["retry_after"] >= 1
        assert refused["session_id"] == "s"


def test_a_link_without_the_key_is_refused() -> None:
    app = create_app(make_settings(calibrate=False, api_key="k"), FakeModel())
    with TestClient(app) as client:
        with pytest.raises(WebSocketDisconnect) as closed, \
                client.websocket_connect("/duo/link"):
            pass
        assert closed.value.code == 1008
        with client.websocket_connect("/duo/link", headers={"Authorization": "Bearer k"}) \
                as ws:
            ws.send_text(json.dumps({"type": "hello"}))
            assert json.loads(ws.receive_text())["type"] == "update"


class ScriptedLink:
    """A scripted back on lead's link, in the calling thread (a process-tier test's stand-in
    back): each session's tokens as lead's news tells them, and drafts it posts."""

    def __init__(self, url: str, back_id: str = "t") -> None:
        self._open = contextlib.ExitStack()
        http = self._open.enter_context(httpx.Client())
        self.ws = self._open.enter_context(connect_ws(f"{url}/duo/link", http))
        self.back_id = back_id
        self.tokens: dict[str, list[int]] = {}  # session id -> its tokens as told
        self.ended: list[str] = []  # sessions told done, in order
        self.ws.send_text(json.dumps({"type": "hello", "back_id": back_id}))

    def news(self, timeout: float) -> list[dict[str, Any]]:
        """The sessions the next update tells of ([]: none within `timeout` seconds)."""
        try:
            update = json.loads(self.ws.receive_text(timeout=timeout))
        except (queue.Empty, TimeoutError):  # httpx-ws's timeout: newer versions raise the
            return []  # latter (from the queue's Empty)
        told = update.get("sessions", [])  # (a refusal: none)
        for news in told:
            held = self.tokens.setdefault(news["session_id"], [])
            held[news["offset"]:] = news["token_ids"]
            if news["done"]:
                self.ended.append(news["session_id"])
        return told

    def post(self, session_id: str, start: int, token_ids: list[int]) -> None:
        self.ws.send_text(json.dumps({"type": "draft", "draft": {
            "session_id": session_id, "start": start, "token_ids": token_ids,
            "back_id": self.back_id}}))

    def close(self) -> None:
        self._open.close()


# --- a back on the link ---


def linked_lead(slots: int) -> tuple[object, FakeModel]:
    clock = VirtualClock()
    target = FakeModel(slots=slots, cost_s=(0.003, 0.0005), eos_bias=-100.0, clock=clock)
    app = create_app(make_settings(max_tokens=120, parallel=slots, calibrate=False,
                                   draft_len=4, ngram=False), target, clock=clock)
    return app, target


def linked_worker(transport: httpx.AsyncBaseTransport, slots: int) -> tuple[Worker, FakeModel]:
    draft = FakeModel(slots=slots, salt="draft", agree=0.9, cost_s=(0.0005, 0.0))
    client = LeadClient("http://lead", transport=transport)
    drafters = [ModelDrafter(draft.slot(i)) for i in range(slots)]
    return Worker(client, drafters, draft.fingerprint(), draft.n_vocab, model=draft), draft


async def ask(http: httpx.AsyncClient, text: str) -> dict:
    r = await http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": text}], "max_tokens": 120})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_back_on_the_link_drafts_for_every_session_in_one_call() -> None:
    texts = ["hello there", "what now", "tell me more", "and then"]
    alone = {}

    async def reference() -> None:
        app, _ = linked_lead(1)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://lead") as http:
            for text in texts:
                alone[text] = text_of(await ask(http, text))

    async def body() -> None:
        await reference()
        app, _ = linked_lead(4)
        engine = app.state.engine  # type: ignore[attr-defined]
        async with ASGIWebSocketTransport(app=app) as transport:
            worker, draft = linked_worker(transport, 4)

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="the link")
                async with httpx.AsyncClient(transport=transport, base_url="http://lead") \
                        as http:
                    replies = await asyncio.gather(*(ask(http, t) for t in texts))
                for text, r in zip(texts, replies, strict=True):
                    assert text_of(r) == alone[text]  # drafts change nothing
                    # (how many, depends on how much CPU the back gets beside lead)
                    assert r["usage"]["accepted_tokens"] > 0, r["usage"]
                assert engine.metrics.link_updates > 0
                assert max(draft.slot_calls) >= 3  # guesses of several sessions in one call

            await with_workers([worker], check)

    asyncio.run(asyncio.wait_for(body(), 60))


def test_a_back_on_the_link_hears_when_lead_s_step_under_way_ends() -> None:
    async def body() -> None:
        app, _ = linked_lead(1)
        async with ASGIWebSocketTransport(app=app) as transport:
            worker, _ = linked_worker(transport, 1)
            lefts: list[float | None] = []
            take = worker._take

            def taking(update: Update) -> None:
                if update.sessions:
                    lefts.append(update.step_left_s)
                take(update)
            worker._take = taking  # type: ignore[method-assign]

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="the link")
                async with httpx.AsyncClient(transport=transport, base_url="http://lead") \
                        as http:
                    await ask(http, "hello there")
                priced = [s for s in lefts if s is not None]
                assert priced, lefts  # once lead priced its steps, its news says so
                assert all(0.0 <= s <= 1.0 for s in priced)

            await with_workers([worker], check)

    asyncio.run(asyncio.wait_for(body(), 60))


def test_lead_s_step_end_counts_its_own_time_between_steps() -> None:
    now = [0.0]
    feed = BackFeed(CostModel(max_draft=8, fixed=4), Metrics(), clock=lambda: now[0])
    feed.step_began(0.010)
    assert feed.step_left() == pytest.approx(0.010)
    now[0] = 0.012  # the step took its 10 ms, and lead 2 ms more to plan the next
    feed.step_began(0.010)
    assert feed.step_left() == pytest.approx(0.012)
    now[0] = 5.0  # a pause (no step priced that long) teaches nothing
    feed.step_began(0.010)
    assert feed.step_left() == pytest.approx(0.012)


class PingedSocket:
    """A WebSocket that sends nothing and answers its pings the given seconds later on `now`
    (None, or past the list: never)."""

    def __init__(self, now: list[float], trips: list[float | None]) -> None:
        self.now, self.trips, self.pings = now, trips, 0

    async def ping(self) -> asyncio.Event:
        trip = self.trips[self.pings] if self.pings < len(self.trips) else None
        self.pings += 1
        pong = asyncio.Event()
        if trip is not None:
            self.now[0] += trip
            pong.set()
        return pong

    async def receive_text(self, timeout: float) -> str:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def measured(trips: list[float | None], monkeypatch: pytest.MonkeyPatch) -> tuple[float, int]:
    """A Link's news_s over a PingedSocket once its pings went unanswered, and the
    pings it sent."""
    monkeypatch.setattr(leadlink, "PING_S", 0.0)
    monkeypatch.setattr(leadlink, "PONG_S", 0.01)
    now = [0.0]
    socket = PingedSocket(now, trips)
    link = Link(socket, lambda: now[0])

    async def body() -> None:
        reading = asyncio.create_task(anext(link.updates()))
        await async_wait_until(lambda: socket.pings >= len(trips), what="the pings")
        await asyncio.sleep(leadlink.PONG_S * 3)  # the last one's wait runs out
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
    asyncio.run(asyncio.wait_for(body(), 10))
    return link.news_s, socket.pings


def test_the_link_measures_how_long_news_takes_by_its_round_trip(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert measured([0.004, 0.004], monkeypatch) == (pytest.approx(0.004), 3)
    # one slow answer among them moves nothing
    assert measured([0.002, 0.003, 0.5, 0.002, 0.003], monkeypatch)[0] == pytest.approx(0.003)
    # unanswered: the default stays, and no more pings go
    assert measured([None], monkeypatch) == (NEWS_S, 1)


def test_news_is_dated_when_it_left_lead() -> None:
    drafter = ModelDrafter(FakeModel(salt="draft").slot(0))
    worker = Worker(LeadClient("http://lead"), [drafter], None, None)
    worker._link = Link(None, lambda: 0.0)
    worker._link.news_s = 0.004
    news = SessionState(session_id="a", token_ids=[1, 2, 3], n_tokens=3, n_prompt=3,
                        draft_len=2, sampling=SamplingParams())
    before = time.monotonic()
    worker._take(Update(version=1, lead_id="", sessions=[news], step_left_s=0.05))
    after = time.monotonic()
    ends = worker.followers["a"].lead_step.ends_at()
    assert ends is not None and before - 0.004 + 0.05 <= ends <= after - 0.004 + 0.05
