"""llama-server's telemetry on OpenAI's APIs: `timings_per_token` (each streamed token's
chunk with the timings so far) and `return_progress` (how far the prompt's evaluation is),
on chat and on the Responses API, as its own clients read them."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.server.app import create_app
from tests.conftest import chat_body, make_settings

RATES = {"prompt_n", "prompt_per_second", "predicted_n", "predicted_per_second"}


def client() -> TestClient:
    return TestClient(create_app(make_settings(batch_size=8), FakeModel()))


def events(c: TestClient, path: str, body: dict) -> list[dict]:
    with c.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]


def test_chat_tokens_carry_the_timings_so_far_where_asked() -> None:
    c = client()
    chunks = events(c, "/v1/chat/completions", chat_body(max_tokens=6, timings_per_token=True))
    tokens = [ch for ch in chunks if ch["choices"] and ch["choices"][0]["delta"].get("content")]
    assert tokens and all(set(ch["timings"]) >= RATES for ch in tokens)
    predicted = [ch["timings"]["predicted_n"] for ch in tokens]
    assert predicted == sorted(predicted)  # so far: it grows
    plain = events(c, "/v1/chat/completions", chat_body(max_tokens=6))
    assert not any("timings" in ch for ch in plain if ch["choices"] and
                   ch["choices"][0]["delta"].get("content"))


def test_responses_stream_llama_servers_telemetry() -> None:
    c = client()
    body = {"input": "This is a test" * 10, "max_output_tokens": 6,
            "timings_per_token": True, "return_progress": True}
    got = events(c, "/v1/responses", body)
    progress = [e for e in got if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert all(p["prompt_progress"]["total"] > 0 and p["prompt_progress"]["processed"] >=
               p["prompt_progress"]["cache"] for p in progress)
    deltas = [e for e in got if e["type"] == "response.output_text.delta"]
    assert deltas and all(set(e["timings"]) >= RATES for e in deltas)
    completed = next(e for e in got if e["type"] in ("response.completed",
                                                       "response.incomplete"))
    assert "usage" in completed["response"] and set(completed["timings"]) >= RATES
    quiet = events(c, "/v1/responses", {"input": "hi", "max_output_tokens": 4})
    assert not any("prompt_progress" in e for e in quiet)
    assert not any("timings" in e for e in quiet if e["type"] == "response.output_text.delta")
