"""The live panel's data (lead/server/live.py), its stream GET /duo/live, the page's routes, and
what the chat stream tells the page about drafts (the back of each accepted token)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.apis import shapes
from lead.apis.openaireply import sse as _sse
from lead.apis.streaming import chain
from lead.backs.registry import BackRecord, BackRegistry
from lead.decode.metrics import Metrics
from lead.decode.session import Emission, Session
from lead.policy.cost import CostModel
from lead.server.app import create_app
from lead.server.live import LiveNews, reply_view, snapshot
from lead.server.webroutes import live_events
from shared.wire.httpclient import sse_events
from shared.wire.protocol import SamplingParams
from tests.conftest import InProcessLead, async_wait_until, event_stream, make_settings
from tests.test_inprocess import model_worker, new_lead, run, with_workers

KEY = {"Authorization": "Bearer s3cret"}


def a_session(generated: int, drafted: int, accepted: int) -> Session:
    s = Session(id="s", tokens=[1] * (4 + generated), n_prompt=4, params=SamplingParams(),
                rng=np.random.default_rng(0), t_start=0.0, finish_reason="length")
    s.t_decode, s.drafted, s.accepted = 1.0, drafted, accepted
    return s


# --- the pure parts ---


def test_snapshot_shows_backs_prices_draft_length_and_replies() -> None:
    cost = CostModel(max_draft=4, fixed=3)
    cost.prices.calibrate({1: 0.010, 2: 0.012, 4: 0.015})
    metrics = Metrics(requests=2, generated_tokens=200, drafted=120, accepted=90,
                      decode_seconds=4.0)
    backs = {"b": BackRecord(95.0, "10.0.0.2", "ngram", 20, 10, sits_out=True),
             "a": BackRecord(99.5, "10.0.0.1", "model", 100, 80)}
    replies = [reply_view(1, a_session(100, 0, 0), now=3.0),
               reply_view(2, a_session(100, 120, 90), now=2.0)]
    snap = snapshot(model="m", busy=False, cost=cost, metrics=metrics, backs=backs,
                    replies=replies, now=100.0, version=7)
    assert snap["version"] == 7 and snap["tok_s"] == 50.0
    assert snap["draft"]["length"] == 3 and snap["draft"]["fixed"]
    assert snap["verify_cost"] == {"one_token_ms": 10.0, "sizes": [
        {"b": 1, "x": 1.0}, {"b": 2, "x": 1.2}, {"b": 4, "x": 1.5}]}
    assert [b["id"] for b in snap["backs"]] == ["a", "b"]
    a = snap["backs"][0]
    assert (a["address"], a["kind"], a["seen_ago_s"]) == ("10.0.0.1", "model", 0.5)
    assert (a["acceptance"], a["share"]) == (0.8, 0.4)  # 80 of 100 drafted; 80 of 200 emitted
    assert [b["sits_out"] for b in snap["backs"]] == [False, True]
    assert [(r["tok_s"], r["acceptance"]) for r in snap["replies"]] == [(50.0, None), (100.0, 0.75)]
    json.dumps(snap)  # all of it goes on the wire


def test_reply_view_times_decoding_only() -> None:
    view = reply_view(3, a_session(generated=60, drafted=40, accepted=30), now=3.0)
    assert view == {"n": 3, "tokens": 60, "tok_s": 30.0, "drafted": 40, "accepted": 30,
                    "acceptance": 0.75, "from_drafts": 0.5, "finish": "length"}


def test_registry_says_when_a_back_arrives_and_credits_its_drafts() -> None:
    reg = BackRegistry()
    assert reg.seen("a", now=0.0, address="1.2.3.4")
    assert not reg.seen("a", now=30.0, kind="model")  # still connected; kind added
    assert reg.seen("a", now=100.0)  # silent past the window: arrived again
    reg.credit({"a": 8, "gone": 3}, {"a": 5})
    assert reg.records["a"] == BackRecord(100.0, "1.2.3.4", "model", 8, 5)
    assert "gone" not in reg.records
    assert list(reg.connected(now=150.0)) == ["a"] and reg.connected(now=161.0) == {}


def test_live_news_keeps_the_last_replies_and_wakes_waiters() -> None:
    async def body() -> None:
        news = LiveNews(kept=3)
        for n in range(5):
            news.add_reply(a_session(10 + n, 0, 0), now=2.0)
        assert [r["n"] for r in news.replies] == [3, 4, 5] and news.version == 5
        waiter = asyncio.create_task(news.wait(5, timeout=30))
        await asyncio.sleep(0)  # let it start waiting
        assert not waiter.done()
        news.bump()
        await asyncio.wait_for(waiter, 5)
        await asyncio.wait_for(news.wait(6, timeout=0.01), 5)  # nothing new: times out
        news.close()
        await asyncio.wait_for(news.wait(news.version, timeout=30), 5)  # closed: at once
    asyncio.run(body())


# --- the stream ---


def data(event: str) -> dict[str, Any]:
    assert event.startswith("data: "), event
    return json.loads(event.removeprefix("data: "))


def test_live_events_wake_on_news_and_end_on_close() -> None:
    async def body() -> None:
        app = create_app(make_settings(calibrate=False), FakeModel())
        engine, feed = app.state.engine, app.state.feed
        events = live_events(engine, app.state.live, feed.backs, heartbeat_s=30)  # no heartbeat
        assert data(await anext(events))["backs"] == []
        feed.back_seen("b1", "10.1.1.1", "ngram")  # a back arrives: news
        snap = data(await asyncio.wait_for(anext(events), 5))
        assert [(b["id"], b["kind"]) for b in snap["backs"]] == [("b1", "ngram")]
        app.state.on_exit()  # lead shutting down
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(events), 5)
    asyncio.run(body())


def test_live_events_heartbeat_and_a_back_falling_silent() -> None:
    async def body() -> None:
        app = create_app(make_settings(calibrate=False), FakeModel())
        engine, feed = app.state.engine, app.state.feed
        feed.back_seen("b1")
        events = live_events(engine, app.state.live, feed.backs, heartbeat_s=0.01)
        assert [b["id"] for b in data(await anext(events))["backs"]] == ["b1"]
        assert await anext(events) == ": nothing new\n\n"  # nothing changed
        feed.backs.records["b1"].last_seen -= 61  # silent past the window
        assert data(await anext(events))["backs"] == []
        engine.shutdown()
    asyncio.run(body())


async def asgi_get(app: Any, path: str, headers: dict[str, str], sent: list[dict[str, Any]],
                   leave: asyncio.Event) -> None:
    """GET `path` by hand, keeping every message the app sends; the client leaves when
    `leave` is set (httpx's ASGITransport would read the whole body first)."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "GET", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
             "client": ("127.0.0.1", 1), "server": ("lead", 80)}
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)


def bodies(sent: list[dict[str, Any]]) -> str:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()


@pytest.mark.parametrize("ending", ["shutdown", "client leaves"])
def test_live_endpoint_streams_behind_the_key_and_ends(ending: str) -> None:
    async def body() -> None:
        app = create_app(make_settings(calibrate=False, api_key="s3cret"), FakeModel())
        sent: list[dict[str, Any]] = []
        leave = asyncio.Event()
        call = asyncio.create_task(asgi_get(app, "/duo/live", KEY, sent, leave))
        await async_wait_until(lambda: "data: " in bodies(sent), what="the first snapshot")
        assert sent[0]["status"] == 200
        assert dict(sent[0]["headers"])[b"content-type"].startswith(b"text/event-stream")
        if ending == "shutdown":
            app.state.on_exit()
        else:
            leave.set()
        await asyncio.wait_for(call, 5)
        snap = json.loads(bodies(sent).split("\n\n")[0].removeprefix("data: "))
        assert snap["model"] == "fake" and not snap["busy"]
    asyncio.run(body())


def test_page_and_its_files_are_open_and_the_data_is_not() -> None:
    async def body() -> None:
        app = create_app(make_settings(calibrate=False, api_key="s3cret"), FakeModel())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://lead") as http:
            page = await http.get("/")
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            assert "default-src 'self'" in page.headers["content-security-policy"]
            for name in ("app.js", "chat.js", "live.js", "charts.js", "net.js", "style.css"):
                assert (await http.get(f"/web/{name}")).status_code == 200, name
            assert (await http.get("/health")).json()["api_key"] is True
            assert (await http.get("/duo/live")).status_code == 401
        sent: list[dict[str, Any]] = []
        leave = asyncio.Event()
        leave.set()
        await asgi_get(app, "/web/../duo/live", {}, sent, leave)  # raw: httpx would normalise
        assert sent[0]["status"] == 404  # the open prefix reaches no data
    asyncio.run(body())


# --- what the chat stream carries for the page ---


def test_stream_names_the_back_of_accepted_tokens_and_counts_add_up() -> None:
    async def body() -> None:
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            worker = model_worker(transport, back_id="drafter-1")

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
                    r = await http.post("/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": "hi"}], "stream": True})
                events = list(sse_events(r))
                usage = events[-1]["usage"]
                drafted = [e["duo"] for e in events if e["duo"]["accepted"]]
                assert usage["accepted_tokens"] > 0
                assert sum(d["accepted"] for d in drafted) == usage["accepted_tokens"]
                assert {d["back"] for d in drafted} == {"drafter-1"}
                assert all("back" not in e["duo"] for e in events if not e["duo"]["accepted"])
                record = app.state.feed.backs.records["drafter-1"]
                assert (record.drafted, record.accepted) == (usage["drafted_tokens"],
                                                             usage["accepted_tokens"])
                assert record.address == "127.0.0.1"
                replies = app.state.live.replies  # type: ignore[attr-defined]
                assert [r["accepted"] for r in replies] == [usage["accepted_tokens"]]

            await with_workers([worker], check)
    run(body())


def test_a_hello_records_the_backs_drafter_kind() -> None:
    app = create_app(make_settings(calibrate=False), FakeModel())
    with TestClient(app) as client, client.websocket_connect("/duo/link") as ws:
        ws.send_text(json.dumps({"type": "hello", "back_id": "n1", "kind": "ngram"}))
        assert json.loads(ws.receive_text())["type"] == "update"
    assert app.state.feed.backs.records["n1"].kind == "ngram"


def test_every_token_is_an_event_even_before_its_text_is() -> None:
    """A token whose text is held (a possible stop string, half a character) or has none
    (EOS) still counts, so that the events' accepted tokens add up to usage's."""
    async def body() -> list[dict[str, Any]]:
        app = create_app(make_settings(calibrate=False), FakeModel())
        done = a_session(generated=3, drafted=2, accepted=2)
        rest = [Emission("", 1, 1, back="x"), Emission("bc", 1, 0),
                Emission("", 0, 0, session=done)]

        async def gen() -> Any:
            for e in rest:
                yield e
        shape = shapes.ReplyShape(chat=True, token_bytes=app.state.engine.model.token_bytes)
        first = Emission("a", 1, 1, back="x")
        chunks = [c async for c in _sse(app.state.engine.model.name, chain(first, gen()), "id",
                                        shape)]
        return list(sse_events(event_stream("".join(chunks))))

    events = asyncio.run(body())
    duo = [e["duo"] for e in events]
    assert duo[1:4] == [{"tokens": 1, "accepted": 1, "back": "x"},
                        {"tokens": 1, "accepted": 1, "back": "x"}, {"tokens": 1, "accepted": 0}]
    assert sum(d["accepted"] for d in duo) == events[-1]["usage"]["accepted_tokens"] == 2
