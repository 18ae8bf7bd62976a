"""Lead's HTTP API over a fake target: OpenAI shapes, streaming, stops, errors."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from bench.fake import ALPHABET, FakeModel
from lead.server.app import create_app
from shared.wire.httpclient import sse_events as read_events
from shared.wire.scrape import read_samples
from tests.conftest import (
    ScriptedModel,
    async_wait_until,
    chat_body,
    event_stream,
    make_settings,
)
from tests.test_link import link_post


def sse_events(text: str) -> list[dict]:
    """A whole OpenAI stream's events; it must end with data: [DONE]."""
    assert text.rstrip().endswith("data: [DONE]"), text[-200:]
    return list(read_events(event_stream(text)))


def scripted_client(text: str, **settings: object) -> tuple[TestClient, ScriptedModel]:
    model = ScriptedModel([])
    model.script = model.tokenize(text) + [0]
    return TestClient(create_app(make_settings(**settings), model)), model


def ask(client: TestClient, model: ScriptedModel, **body: object) -> httpx.Response:
    prompt = model.tokenize(model.format_chat([{"role": "user", "content": "q"}]))
    model.prompt_len = len(prompt)
    return client.post("/v1/chat/completions", json=chat_body("q", **body))


def reply_of(r: httpx.Response, stream: bool) -> tuple[str, str]:
    """(text, finish_reason) of a chat reply, streamed or not."""
    if stream:
        events = sse_events(r.text)
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
        return text, events[-1]["choices"][0]["finish_reason"]
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


def is_error_body(r: httpx.Response) -> bool:
    body = r.json()
    return set(body) == {"error"} and \
        set(body["error"]) == {"message", "type", "param", "code"} \
        and bool(body["error"]["message"]) and bool(body["error"]["type"])


def test_chat_completion_shape_and_usage(client: TestClient, fake_target: FakeModel) -> None:
    r = client.post("/v1/chat/completions", json=chat_body(max_tokens=10))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 10
    assert body["usage"]["drafted_tokens"] == 0 and body["usage"]["accepted_tokens"] == 0
    prompt = fake_target.tokenize(fake_target.format_chat([{"role": "user", "content": "hello"}]))
    expected = fake_target.greedy_continuation(prompt, 10)
    text = b"".join(fake_target.token_bytes(t) for t in expected).decode()
    assert body["choices"][0]["message"]["content"] == text


def test_stream_matches_non_stream_and_ends_with_done(client: TestClient) -> None:
    whole = client.post("/v1/chat/completions", json=chat_body(max_tokens=20)).json()
    r = client.post("/v1/chat/completions", json=chat_body(max_tokens=20, stream=True))
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text == whole["choices"][0]["message"]["content"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 20
    assert all("duo" in e and e["duo"]["accepted"] <= e["duo"]["tokens"] for e in events)


def test_each_streamed_token_is_written_before_the_next_step_is_handed_over(
        fake_target: FakeModel) -> None:
    """A write overlapping a step would hold the GIL as the model thread begins it and
    take a core from llama.cpp's threads: the readers write first."""
    app = create_app(make_settings(max_tokens=64), fake_target)
    engine = app.state.engine
    unsent: list[int] = []  # per step handed to the model thread: tokens decided, not sent
    sent = 0

    async def counting(scope, receive, send):  # type: ignore[no-untyped-def]
        async def counted(message: dict) -> None:
            nonlocal sent
            sent += b'"tokens": 1' in message.get("body", b"")
            await send(message)
        await app(scope, receive, counted)

    step = engine.decoder.step

    async def handed_over(jobs):  # type: ignore[no-untyped-def]
        session = engine.session
        if session is not None and session.n_generated:
            unsent.append(session.n_generated - sent)
        return await step(jobs)
    engine.decoder.step = handed_over

    async def ask() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(counting),
                                     base_url="http://lead") as client:
            return await client.post("/v1/chat/completions",
                                     json=chat_body(max_tokens=12, stream=True))
    r = asyncio.run(ask())
    engine.shutdown()
    assert sse_events(r.text)[-1]["usage"]["completion_tokens"] == 12
    assert unsent[1:] == [0] * 10  # (the first token goes out with the response's start)


def test_completions_endpoint_streams_too(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5})
    assert r.json()["object"] == "text_completion" and r.json()["usage"]["completion_tokens"] == 5
    s = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in sse_events(s.text)) == \
        r.json()["choices"][0]["text"]


def test_eos_finishes_with_stop() -> None:
    client, model = scripted_client("done")
    body = ask(client, model, max_tokens=50).json()
    assert body["choices"][0]["message"]["content"] == "done"
    assert body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_never_leaks(stream: bool) -> None:
    client, model = scripted_client("one two END three")
    r = ask(client, model, stop=["END", "zzz"], stream=stream)
    assert reply_of(r, stream) == ("one two ", "stop")


def test_utf8_split_across_tokens_streams_intact() -> None:
    model = ScriptedModel([])
    e1, e2 = len(ALPHABET) + 1, len(ALPHABET) + 2  # the two halves of "é"
    model.script = model.tokenize("caf") + [e1, e2] + model.tokenize("!") + [0]
    client = TestClient(create_app(make_settings(), model))
    events = sse_events(ask(client, model, stream=True).text)
    pieces = [e["choices"][0]["delta"].get("content") or "" for e in events]
    assert "".join(pieces) == "café!" and "é" in pieces and "\ufffd" not in "".join(pieces)


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_cut_inside_a_character_leaves_its_bytes_out(stream: bool) -> None:
    model = ScriptedModel([])
    e1, e2 = len(ALPHABET) + 1, len(ALPHABET) + 2  # the two halves of "é"
    model.script = model.tokenize("caf") + [e1, e2] + [0]
    client = TestClient(create_app(make_settings(), model))
    assert reply_of(ask(client, model, max_tokens=4, stream=stream), stream) == ("caf", "length")
    assert reply_of(ask(client, model, max_tokens=5, stream=stream), stream) == ("café", "length")


def test_prefix_reuse_second_turn_evaluates_only_new_tokens(client: TestClient,
                                                            fake_target: FakeModel) -> None:
    turn1 = [{"role": "user", "content": "hello"}]
    reply = client.post("/v1/chat/completions", json={"messages": turn1, "max_tokens": 8}).json()
    turn2 = turn1 + [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "more"}]
    before = fake_target.evaluated
    r2 = client.post("/v1/chat/completions", json={"messages": turn2, "max_tokens": 1}).json()
    prompt2 = r2["usage"]["prompt_tokens"]
    new_tokens = len(fake_target.tokenize("more\nassistant: ")) + len("user: ")
    # only the tail past the shared prefix is evaluated (plus the one decode step)
    assert fake_target.evaluated - before <= new_tokens + 2 < prompt2


def test_context_full_finishes_with_length() -> None:
    model = FakeModel(n_ctx=64)
    client = TestClient(create_app(make_settings(), model))
    r = client.post("/v1/completions", json={"prompt": "x" * 40, "max_tokens": 60}).json()
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] <= 64 + 1


def test_models_health_metrics(client: TestClient) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == "fake"
    assert client.get("/health").json()["status"] == "ok"
    client.post("/v1/chat/completions", json=chat_body(max_tokens=3))
    metrics = read_samples(client.get("/metrics").text)
    assert metrics["duo_requests_total"] == 1 and metrics["duo_generated_tokens_total"] == 3
    assert "duo_draft_len" in metrics and metrics["duo_backs_active"] == 0


# --- bad input: 4xx with a message, and the server keeps serving ---

BAD_BODIES = [
    ("not json", "{oops"),
    ("no messages", {"messages": []}),
    ("wrong type", {"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}),
    ("negative max_tokens", chat_body(max_tokens=-1)),
    ("bad role", {"messages": [{"role": "robot", "content": "x"}]}),
    ("negative temperature", chat_body(temperature=-0.5)),
    ("top_p zero", chat_body(top_p=0)),
    ("top_p over one", chat_body(top_p=1.5)),
    ("negative top_k", chat_body(top_k=-3)),
    ("stop wrong type", chat_body(stop=5)),
    # valid JSON (a "\ud800" escape: a lone surrogate) that no text encoding admits
    ("lone surrogate", r'{"messages": [{"role": "user", "content": "caf\ud800"}]}'),
    ("lone surrogate in a part",
     r'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}'),
    ("lone surrogate in stop",
     r'{"messages": [{"role": "user", "content": "x"}], "stop": ["\ud800"]}'),
]


@pytest.mark.parametrize(("name", "body"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_chat_input_is_400_with_message(client: TestClient, name: str, body: object) -> None:
    if isinstance(body, str):
        r = client.post("/v1/chat/completions", content=body,
                        headers={"content-type": "application/json"})
    else:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, (name, r.text)
    assert r.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json=chat_body(max_tokens=2)).status_code == 200


def test_any_integer_seed_is_accepted(client: TestClient) -> None:
    for seed in (-1, 2**70):  # found by the schema fuzzer: a negative seed crashed numpy
        r = client.post("/v1/chat/completions", json=chat_body(max_tokens=2, seed=seed,
                                                                temperature=0.5))
        assert r.status_code == 200, r.text


def test_completion_prompt_with_a_lone_surrogate_is_400(client: TestClient) -> None:
    r = client.post("/v1/completions", content=r'{"prompt": "x\ud83d", "max_tokens": 2}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and "Unicode" in r.json()["error"]["message"], r.text


def test_a_vanishing_temperature_samples_greedily(client: TestClient) -> None:
    # 1e-310 is subnormal: logits / T overflowed to inf and the probabilities to NaN
    def reply(**extra: object) -> str:
        r = client.post("/v1/chat/completions", json=chat_body(max_tokens=8, **extra))
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    assert reply(temperature=1e-310, seed=1) == reply(temperature=1e-12) == reply()


def test_prompt_longer_than_context_is_400() -> None:
    client = TestClient(create_app(make_settings(), FakeModel(n_ctx=64)))
    r = client.post("/v1/completions", json={"prompt": "y" * 200})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]


def test_oversized_body_is_413(client: TestClient) -> None:
    small = TestClient(create_app(make_settings(max_body_kb=1), FakeModel()))
    r = small.post("/v1/completions", json={"prompt": "z" * 5000})
    assert r.status_code == 413 and "body" in r.json()["error"]["message"]
    # a chunked upload has no content-length to check: it is counted as it arrives
    chunked = small.post("/v1/completions", content=iter([b'{"prompt": "', b"z" * 5000, b'"}']),
                         headers={"content-type": "application/json"})
    assert chunked.status_code == 413 and "body" in chunked.json()["error"]["message"]
    fits = small.post("/v1/completions", content=iter([b'{"prompt": "z", ', b'"max_tokens": 2}']),
                      headers={"content-type": "application/json"})
    assert fits.status_code == 200, fits.text


def test_api_key_required_everywhere_but_health() -> None:
    client = TestClient(create_app(make_settings(api_key="s3cret"), FakeModel()))
    assert client.get("/health").status_code == 200
    for method, path in [("get", "/v1/models"), ("get", "/duo/info"),
                         ("get", "/duo/grammar?session=s"),
                         ("get", "/metrics")]:
        assert getattr(client, method)(path).status_code == 401
    r = client.post("/v1/chat/completions", json=chat_body(max_tokens=1),
                    headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and "key" in r.json()["error"]["message"]
    ok = client.post("/v1/chat/completions", json=chat_body(max_tokens=1),
                     headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200


class GatedModel(FakeModel):
    """A fake target whose evaluations wait until `gate` opens."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def evaluate(self, tokens: Sequence[int], n_logits: int,
                 abort: Callable[[], bool] | None = None) -> np.ndarray:
        if not self.gate.wait(30):
            raise RuntimeError("the test never opened the gate")
        return super().evaluate(tokens, n_logits, abort)


def test_32_concurrent_requests_each_complete_or_get_429() -> None:
    model = GatedModel()  # the first request runs, and holds, until all 32 have been answered
    app = create_app(make_settings(max_queue=8, calibrate=False), model)
    engine = app.state.engine

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            tasks = [asyncio.create_task(http.post("/v1/chat/completions",
                                                   json=chat_body(f"q{i}", max_tokens=15)))
                     for i in range(32)]
            try:
                await async_wait_until(lambda: sum(t.done() for t in tasks) == 23
                                       and engine.admission.waiting == 8,
                                       what="23 refused and 8 queued")
                assert engine.admission.running
            finally:
                model.gate.set()
            return await asyncio.gather(*tasks)

    responses = asyncio.run(run())
    codes = sorted(r.status_code for r in responses)
    # one runs, eight wait, the rest are told to come back: none lost, none mixed
    assert codes.count(200) == 9 and codes.count(429) == 23, codes
    refused = [r for r in responses if r.status_code == 429]
    assert all(r.headers.get("retry-after") and is_error_body(r) for r in refused)
    assert engine.metrics.rejected == 23 and engine.metrics.requests == 9
    for i, r in enumerate(responses):
        if r.status_code == 200:  # each completed request got its own reply
            prompt = model.tokenize(model.format_chat([{"role": "user", "content": f"q{i}"}]))
            want = model.greedy_continuation(prompt, 15)
            text = b"".join(model.token_bytes(t) for t in want).decode()
            assert r.json()["choices"][0]["message"]["content"] == text


def test_draft_posts_over_the_rate_get_429(fake_target: FakeModel) -> None:
    client = TestClient(create_app(make_settings(max_draft_posts=3), fake_target))
    body = {"session_id": "none", "start": 0, "token_ids": [1], "back_id": "b"}
    with client.websocket_connect("/duo/link") as ws:
        refused = [link_post(ws, body) for _ in range(6)]
    assert refused[:3] == [None] * 3 and 429 in [r and r["status"] for r in refused[3:]]
    assert client.get("/health").status_code == 200


def test_a_client_cycling_back_ids_still_gets_429(fake_target: FakeModel) -> None:
    client = TestClient(create_app(make_settings(max_draft_posts=3), fake_target))
    with client.websocket_connect("/duo/link") as ws:
        refused = [link_post(ws, {"session_id": "none", "start": 0, "token_ids": [1],
                                  "back_id": f"b{i}"}) for i in range(60)]
    assert refused[:12] == [None] * 12  # four backs' worth from one address...
    assert 429 in [r and r["status"] for r in refused]  # ...and no more, whatever its ids


def test_every_refusal_has_the_error_shape() -> None:
    client = TestClient(create_app(make_settings(api_key="k", max_body_kb=1), FakeModel()))
    key = {"Authorization": "Bearer k"}
    refusals = {
        "invalid body": client.post("/v1/chat/completions", json={"messages": []}, headers=key),
        "empty prompt": client.post("/v1/completions", json={"prompt": ""}, headers=key),
        "no key": client.get("/v1/models"),
        "no such path": client.get("/v2/nothing", headers=key),
        "wrong method": client.get("/v1/completions", headers=key),
        "body too large": client.post("/v1/completions", json={"prompt": "z" * 5000},
                                      headers=key),
        "a long-poll, gone": client.get("/duo/state", headers=key),
    }
    for name, r in refusals.items():
        assert 400 <= r.status_code < 500 and is_error_body(r), (name, r.status_code, r.text)


def test_the_model_hash_is_computed_once_before_serving() -> None:
    class Counted(FakeModel):
        hashed = 0

        def fingerprint(self) -> str:
            self.hashed += 1
            return super().fingerprint()

    model = Counted()
    client = TestClient(create_app(make_settings(), model))
    assert model.hashed == 1
    infos = [client.get("/duo/info").json()["fingerprint"] for _ in range(3)]
    assert infos == [FakeModel().fingerprint()] * 3 and model.hashed == 1


def test_draft_post_errors(client: TestClient) -> None:
    base = {"session_id": "x", "start": 0, "back_id": "b"}
    cases = [({**base, "token_ids": []}, "token_ids"),
             ({**base, "token_ids": [10**6]}, "vocabulary"),
             ({**base, "token_ids": list(range(17))}, "at most"),  # max_post = 2 x 8
             ({**base, "start": -1, "token_ids": [1]}, "start"),
             ({**base, "token_ids": [1], "dists": [{"token_ids": [1], "probs": [0.5]}]}, "sum"),
             ({**base, "token_ids": [1, 2], "dists": [{"token_ids": [1], "probs": [1.0]}]},
              "one entry")]
    with client.websocket_connect("/duo/link") as ws:
        for body, fragment in cases:
            refused = link_post(ws, body)
            assert refused and refused["status"] == 400 and fragment in refused["message"], \
                (body, refused)
        # Python's JSON parser, and so lead's, takes NaN; its sum passed the check once
        nan = link_post(ws, '{"type": "draft", "draft": {"session_id": "x", "start": 0, '
                            '"token_ids": [1], "dists": [{"token_ids": [1, 2], '
                            '"probs": [1.0, NaN]}]}}')
        assert nan and nan["status"] == 400 and "finite" in nan["message"], nan
        assert link_post(ws, {**base, "token_ids": [1]}) is None  # stale: taken, unused
    assert read_samples(client.get("/metrics").text)["duo_draft_posts_invalid_total"] == 2


def test_calibration_and_decoding_evaluate_on_one_thread() -> None:
    # llama.cpp keeps an OpenMP pool per calling thread: a second thread (calibration on
    # the main one, steps on the model thread) made lead decode at 0.7x on all cores.
    target = FakeModel()
    app = create_app(make_settings(max_tokens=8, calibrate=True), target)
    with TestClient(app) as c:
        assert c.post("/v1/chat/completions", json=chat_body("hi")).status_code == 200
    assert len(target.calls) > 8  # calibration's batches and the reply's steps
    assert len(target.threads) == 1
    assert threading.get_ident() not in target.threads


class HeldModel(FakeModel):
    """A fake target whose evaluations after the first `free` wait until `gate` opens."""

    def __init__(self, free: int) -> None:
        super().__init__()
        self.free = free
        self.gate, self.held = threading.Event(), threading.Event()

    def evaluate(self, tokens: Sequence[int], n_logits: int,
                 abort: Callable[[], bool] | None = None) -> np.ndarray:
        if len(self.calls) >= self.free:
            self.held.set()
            if not self.gate.wait(30):
                raise RuntimeError("the test never opened the gate")
        return super().evaluate(tokens, n_logits, abort)


def test_a_non_streamed_reply_stops_when_its_client_leaves() -> None:
    model = HeldModel(free=4)  # the prompt and three steps; the fourth waits
    app = create_app(make_settings(calibrate=False), model)
    engine = app.state.engine
    body = json.dumps(chat_body(max_tokens=500)).encode()

    async def run() -> None:
        # Called as a server calls it: the app runs on while its client is gone, and
        # learns of it only from an http.disconnect message.
        gone = asyncio.Event()
        request_messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            if request_messages:
                return request_messages.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(_: dict) -> None:
            pass

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
                 "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        served = asyncio.create_task(app(scope, receive, send))
        await async_wait_until(model.held.is_set, what="the reply under way")
        session = engine.session
        gone.set()
        try:  # the model is still held: only the disconnect can end the generation
            await async_wait_until(lambda: session.done, what="the generation to stop")
        finally:
            model.gate.set()
        await served
        assert session.finish_reason == "cancelled" and session.n_generated <= 4
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            r = await http.post("/v1/chat/completions", json=chat_body(max_tokens=3))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3

    try:
        asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        engine.shutdown()
