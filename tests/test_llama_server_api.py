"""llama-server's own endpoints on lead (lead/apis/llamaserver.py), in process over the
fake model: /tokenize (with pieces), /detokenize, /apply-template, GET /props, and the
OpenAI paths without /v1; bad input a 400 naming the field, lead serving on."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from bench.fake import ALPHABET, SPLIT_UTF8, FakeModel
from lead.apis.llamaserver import piece
from lead.server.app import create_app
from tests.conftest import chat_body, make_settings


def client(**settings: object) -> tuple[TestClient, FakeModel]:
    model = FakeModel(slots=2)
    return TestClient(create_app(make_settings(**settings), model)), model


def test_tokenize_and_detokenize_round_trip() -> None:
    c, model = client()
    ids = c.post("/tokenize", json={"content": "hello world"}).json()["tokens"]
    assert ids == model.tokenize("hello world", special=True, add_bos=False)
    assert c.post("/detokenize", json={"tokens": ids}).json() == {"content": "hello world"}


def test_tokenize_with_pieces_gives_each_ids_text_or_its_bytes() -> None:
    c, model = client()
    pieces = c.post("/tokenize", json={"content": "hi", "with_pieces": True}).json()["tokens"]
    assert pieces == [{"id": t, "piece": model.token_bytes(t).decode()}
                      for t in model.tokenize("hi")]
    # a token that is part of a character: its bytes (the fake's two halves of "é")
    assert piece(b"\xc3") == [0xC3] and piece("é".encode()) == "é"
    halves = [len(ALPHABET) + 1, len(ALPHABET) + 2]
    assert [model.token_bytes(t) for t in halves] == SPLIT_UTF8
    assert c.post("/detokenize", json={"tokens": halves}).json() == {"content": "é"}


def test_detokenizing_an_id_the_model_lacks_is_a_400_naming_it() -> None:
    c, model = client()
    r = c.post("/detokenize", json={"tokens": [1, model.n_vocab]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    assert str(model.n_vocab) in r.json()["error"]["message"]
    assert c.post("/detokenize", json={"tokens": "x"}).status_code == 400
    assert c.post("/tokenize", json={}).status_code == 400
    assert c.post("/tokenize", json={"content": "ok"}).status_code == 200  # serving on


def test_apply_template_gives_the_prompt_a_chat_request_is_given() -> None:
    c, model = client()
    body = chat_body("hello")
    prompt = c.post("/apply-template", json=body).json()["prompt"]
    assert prompt == model.format_chat([{"role": "user", "content": "hello"}])
    assert c.post("/apply-template", json={"messages": []}).status_code == 400


def test_props_in_llama_servers_shape() -> None:
    c, model = client(parallel=2, alias="coder")
    props = c.get("/props").json()
    assert props["total_slots"] == 2 and props["model_alias"] == "coder"
    assert props["default_generation_settings"]["n_ctx"] == model.n_ctx
    assert props["default_generation_settings"]["params"]["seed"] == -1  # a new one each
    seeded = client(seed=42, temp=0.7, max_tokens=64)[0].get("/props").json()
    assert seeded["default_generation_settings"]["params"] == \
        {"seed": 42, "temperature": 0.7, "n_predict": 64}


def test_the_openai_paths_without_v1_answer_as_with_it() -> None:
    c, _ = client()
    assert c.get("/models").json() == c.get("/v1/models").json()
    a = c.post("/chat/completions", json=chat_body(max_tokens=5)).json()
    b = c.post("/v1/chat/completions", json=chat_body(max_tokens=5)).json()
    assert a["choices"] == b["choices"]
    # /completions is llama-server's native API, as /completion; OpenAI's is /v1/completions
    native = c.post("/completions", json={"prompt": "ab", "n_predict": 3}).json()
    assert native == {**c.post("/completion", json={"prompt": "ab", "n_predict": 3}).json(),
                      "timings": native["timings"]} and "content" in native
    paths = c.get("/openapi.json").json()["paths"]
    assert "/chat/completions" not in paths and "/v1/chat/completions" in paths


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize", "/apply-template"])
@pytest.mark.parametrize("raw", ['{"content":', "", "[1]", '{"content": 5, "tokens": {}}',
                                 '{"content": "\\ud800", "tokens": [-1]}'])
def test_junk_on_llama_servers_endpoints_is_a_400_and_lead_serves_on(path: str,
                                                                     raw: str) -> None:
    c, _ = client()
    r = c.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"], r.text
    assert c.post("/tokenize", json={"content": "ok"}).status_code == 200
    assert c.post("/v1/chat/completions", json=chat_body(max_tokens=2)).status_code == 200


def test_openai_replies_say_what_served_them() -> None:
    c, _ = client()
    whole = c.post("/v1/chat/completions", json=chat_body(max_tokens=3)).json()
    assert whole["system_fingerprint"].startswith("b")
    with c.stream("POST", "/v1/completions", json={"prompt": "ab", "max_tokens": 3,
                                                   "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert chunks and {ch["system_fingerprint"] for ch in chunks} == {whole["system_fingerprint"]}
