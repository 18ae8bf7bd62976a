"""llama-server's DRY, XTC, mirostat, typical_p and min_keep through lead's APIs: taken on
every endpoint that takes sampling, their bad values a 400 naming the field, and a back's
drafts change no reply."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.apis import fields, llamasampling
from lead.server.app import create_app
from tests.conftest import InProcessLead, async_wait_until, chat_body, make_settings
from tests.test_inprocess import model_worker, new_lead, with_workers

SET = {"dry_multiplier": 0.9, "dry_base": 1.5, "dry_allowed_length": 3,
       "dry_penalty_last_n": 128, "dry_sequence_breakers": ["\n", "."], "typical_p": 0.9,
       "min_keep": 2, "xtc_probability": 0.3, "xtc_threshold": 0.2, "mirostat": 2,
       "mirostat_tau": 4.0, "mirostat_eta": 0.2}


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(make_settings(max_tokens=4), FakeModel()))


def test_the_fields_are_one_list_everywhere() -> None:
    assert set(SET) == set(llamasampling.FIELDS) == set(fields.LLAMA_SAMPLING)
    assert set(llamasampling.LlamaSamplersAsGiven.model_fields) == set(SET)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/completion",
                                  "/infill"])
def test_every_endpoint_takes_them(client: TestClient, path: str) -> None:
    body = chat_body(max_tokens=2) if path == "/v1/chat/completions" else \
        {"prompt": "ab", "max_tokens": 2, "n_predict": 2, "input_prefix": "a"}
    r = client.post(path, json={**body, **SET, "temperature": 0.7, "seed": 3})
    assert r.status_code == 200, r.text


def test_llama_server_s_reply_echoes_them(client: TestClient) -> None:
    r = client.post("/completion", json={"prompt": "ab", "n_predict": 2, **SET})
    settings = r.json()["generation_settings"]
    assert {k: settings[k] for k in SET} == SET


def test_a_dry_base_below_one_is_llama_server_s_default(client: TestClient) -> None:
    r = client.post("/completion", json={"prompt": "ab", "n_predict": 1, "dry_base": 0.5})
    assert r.json()["generation_settings"]["dry_base"] == 1.75


@pytest.mark.parametrize("path", ["/completion", "/infill", "/v1/completions"])
@pytest.mark.parametrize(("field", "value"), [("mirostat", 3), ("xtc_probability", 2),
                                              ("dry_sequence_breakers", []), ("min_keep", -1),
                                              ("dry_penalty_last_n", -2), ("mirostat_tau", -1)])
def test_a_bad_value_is_a_400_naming_the_field(client: TestClient, path: str, field: str,
                                              value: object) -> None:
    r = client.post(path, json={"prompt": "ab", "max_tokens": 1, field: value})
    assert r.status_code == 400, r.text
    error = r.json().get("error", r.json())
    assert field in str(error), error


async def ask(transport: httpx.AsyncBaseTransport, **body: object) -> dict:
    async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
        r = await http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "a b c d. a b c d. a b c d. a b c"}],
            "max_tokens": 80, **body})
        assert r.status_code == 200, r.text
        return r.json()


def text(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


GREEDY = {"dry_multiplier": 1.0, "xtc_probability": 0.5, "xtc_threshold": 0.05, "seed": 7}


def test_a_back_s_greedy_drafts_change_no_reply() -> None:
    """Greedy with XTC (stochastic: seeded) and DRY: the back drafts the row's best, lead
    verifies what the samplers leave. (Lead's own drafts: tests/test_samplers_drafts.py.)"""
    body = GREEDY

    async def run() -> None:
        alone = await ask(httpx.ASGITransport(app=new_lead(ngram=False)[0]), **body)
        app, _ = new_lead(ngram=False)
        async with InProcessLead(app) as transport:
            worker = model_worker(transport, agree=1.0)

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                reply = await ask(transport, **body)
                assert text(reply) == text(alone)
                assert reply["usage"]["accepted_tokens"] > 10

            await with_workers([worker], check)
    asyncio.run(asyncio.wait_for(run(), 60))
