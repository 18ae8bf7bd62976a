"""Embeddings as llama-server serves them (lead/apis/embeddings.py), in process over the
fake model and a scripted embedder: OpenAI's /v1/embeddings (normalized, float or base64,
usage), llama-server's /embedding and /embeddings (nested vectors; per token with pooling
none), its 501 without --embeddings, and bad input a 400 with lead serving on. The inputs'
shapes (lead/apis/embedinput.py) and normalization (shared/embedding.py) alone."""

from __future__ import annotations

import base64
import struct
import threading
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np
import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.apis.embedinput import prompt_ids, prompts
from lead.apis.shapes import FieldRefused
from lead.server.app import create_app
from shared.embedding import base64_floats, normalize
from shared.llama.embed import pooling_type
from tests.conftest import make_settings


class ScriptedEmbedder:
    """A token's vector is [id, id % 3 + 1, 1, -id]; pooled: their mean. Records the
    threads it is called on."""

    n_embd = 4

    def __init__(self, pooled: bool = True, n_ctx: int = 16) -> None:
        self.pooled, self.n_ctx = pooled, n_ctx
        self.threads: list[str] = []

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        self.threads.append(threading.current_thread().name)
        rows = np.array([[t, t % 3 + 1, 1.0, -t] for t in ids], dtype=np.float32)
        return rows.mean(axis=0, keepdims=True) if self.pooled else rows


def client(embedder: ScriptedEmbedder | None = None, **settings: Any
           ) -> tuple[TestClient, FakeModel]:
    model = FakeModel()
    on = embedder is not None
    app = create_app(make_settings(embeddings=on, **settings), model, embedder=embedder)
    return TestClient(app), model


def pooled_vector(model: FakeModel, text: str) -> list[float]:
    ids = model.tokenize(text, special=True)
    return normalize(ScriptedEmbedder().embed(ids)[0]).tolist()


# --- normalization (common_embd_normalize) ---
def test_normalize_as_llama_cpp_does() -> None:
    v = np.array([3.0, -4.0])
    np.testing.assert_allclose(normalize(v), [0.6, -0.8], rtol=1e-6)  # euclidean, the default
    np.testing.assert_allclose(normalize(v, -1), v)
    np.testing.assert_allclose(normalize(v, 0), [24570.0, -32760.0], rtol=1e-6)  # int16 range
    np.testing.assert_allclose(normalize(v, 1), [3 / 7, -4 / 7], rtol=1e-6)  # taxicab
    np.testing.assert_allclose(normalize(v, 3), v / (27 + 64) ** (1 / 3), rtol=1e-6)
    assert normalize(np.zeros(3)).tolist() == [0.0, 0.0, 0.0]


def test_base64_is_little_endian_float32() -> None:
    raw = base64.b64decode(base64_floats(np.array([1.5, -2.0])))
    assert struct.unpack("<2f", raw) == (1.5, -2.0)


# --- the inputs' shapes (tokenize_input_prompts) ---
@pytest.mark.parametrize("value,expected", [
    ("", [[""]]),
    ("string", [["string"]]),
    ([12, 34, 56], [[12, 34, 56]]),
    ([12, 34, "string", 56, 78], [[12, 34, "string", 56, 78]]),
    (["string1", "string2"], [["string1"], ["string2"]]),
    (["string1", [12, 34, 56]], [["string1"], [12, 34, 56]]),
    ([[12, 34, 56], [12, "string", 34]], [[12, 34, 56], [12, "string", 34]]),
    ({"prompt_string": "string"}, [["string"]]),
    ({"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
     [["hello world"]]),
    (["a", {"prompt_string": "b"}, {"content": [{"type": "text", "text": "c"}]}],
     [["a"], ["b"], ["c"]]),
])
def test_input_shapes_llama_server_reads(value: Any, expected: list[list[Any]]) -> None:
    assert prompts(value, "input") == expected


@pytest.mark.parametrize("value,param", [
    ([], "input"),
    (True, "input"),
    (None, "input"),
    ([True], "input[0]"),
    ([1.5, 2], "input"),
    ({"content": "string"}, "input.content"),
    ({"content": [{"type": "unknown"}]}, "input.content[0]"),
    ({"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
     "input.content[0]"),
    ({"prompt_string": "x", "multimodal_data": ["AAAA"]}, "input.multimodal_data"),
    (["ok", "\ud800"], "input[1]"),
    (["x"] * 2049, "input"),
])
def test_inputs_llama_server_refuses_are_400s_naming_them(value: Any, param: str) -> None:
    with pytest.raises(FieldRefused) as refused:
        prompts(value, "input")
    assert refused.value.status_code == 400 and refused.value.param == param


def test_prompt_ids_mix_text_and_ids_and_check_them() -> None:
    model = FakeModel()
    assert prompt_ids(model, ["ab", 5, "c"], "input", 16) == [
        *model.tokenize("ab", special=True), 5, *model.tokenize("c", special=True,
                                                                 add_bos=False)]
    for prompt, words in (([model.n_vocab], "no token id"), ([""], "cannot be empty"),
                          (["a" * 17], "too large to process")):
        with pytest.raises(FieldRefused, match=words):
            prompt_ids(model, prompt, "input[2]", 16)


def test_pooling_is_the_flag_else_the_ggufs_else_mean() -> None:
    gguf = {"general.architecture": "bert", "bert.pooling_type": "2"}
    assert pooling_type("none", gguf) == llama_cpp.LLAMA_POOLING_TYPE_NONE
    assert pooling_type(None, gguf) == llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED  # llama.cpp's
    assert pooling_type(None, {"general.architecture": "llama"}) == \
        llama_cpp.LLAMA_POOLING_TYPE_MEAN


# --- the endpoints ---
@pytest.mark.parametrize("path", ["/v1/embeddings", "/embeddings", "/embedding"])
def test_without_embeddings_every_path_is_llama_servers_501(path: str) -> None:
    c, _ = client()
    r = c.post(path, json={"input": "hello"})
    assert r.status_code == 501
    assert r.json()["error"]["type"] == "not_supported_error"
    assert "Start it with `--embeddings`" in r.json()["error"]["message"]
    assert c.get("/health").json()["status"] == "ok"  # serving on


def test_the_schema_lists_embeddings_where_served() -> None:
    def paths(c: TestClient) -> set[str]:
        return set(c.get("/openapi.json").json()["paths"])

    assert {"/v1/embeddings", "/embedding"} <= paths(client(ScriptedEmbedder())[0])
    assert not {"/v1/embeddings", "/embedding"} & paths(client()[0])


def test_openai_embeddings_normalized_in_order_with_usage() -> None:
    embedder = ScriptedEmbedder()
    c, model = client(embedder)
    r = c.post("/v1/embeddings", json={"input": ["abc", "hello", "abc"], "model": "m"})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["model"] == "m"
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in body["data"])
    vectors = [d["embedding"] for d in body["data"]]
    assert vectors[0] == vectors[2] == pooled_vector(model, "abc") != vectors[1]
    assert abs(float(np.linalg.norm(vectors[1])) - 1) < 1e-6
    assert body["usage"] == {"prompt_tokens": 11, "total_tokens": 11}
    assert set(embedder.threads) == {"model_0"}  # the engine's model thread, between its steps


def test_base64_gives_the_same_floats() -> None:
    c, _ = client(ScriptedEmbedder())
    plain = c.post("/v1/embeddings", json={"input": "hello"}).json()["data"][0]
    coded = c.post("/v1/embeddings", json={"input": "hello", "encoding_format": "base64"})
    data = coded.json()["data"][0]
    assert data["encoding_format"] == "base64"
    floats = np.frombuffer(base64.b64decode(data["embedding"]), "<f4")
    np.testing.assert_allclose(floats, plain["embedding"], rtol=1e-6)
    assert coded.json()["model"] == "fake"


@pytest.mark.parametrize("path", ["/embedding", "/embeddings"])
def test_llama_servers_own_shape_nests_each_vector(path: str) -> None:
    c, model = client(ScriptedEmbedder())
    r = c.post(path, json={"content": ["abc", [3, 4]]})
    assert r.status_code == 200
    assert r.json()[0] == {"index": 0, "embedding": [pooled_vector(model, "abc")]}
    assert r.json()[1]["index"] == 1 and len(r.json()[1]["embedding"]) == 1
    raw = c.post(path, json={"input": "abc", "embd_normalize": -1}).json()[0]["embedding"][0]
    assert raw == ScriptedEmbedder().embed(model.tokenize("abc"))[0].tolist()


def test_pooling_none_gives_a_vector_a_token_and_no_openai_shape() -> None:
    c, model = client(ScriptedEmbedder(pooled=False), pooling="none")
    ids = model.tokenize("hello", special=True)
    rows = c.post("/embedding", json={"content": "hello"}).json()[0]["embedding"]
    assert rows == ScriptedEmbedder(pooled=False).embed(ids).tolist()  # not normalized
    r = c.post("/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith("Pooling type 'none' is not OAI compatible")


def test_content_on_the_openai_path_answers_in_llama_servers_shape() -> None:
    c, _ = client(ScriptedEmbedder())
    r = c.post("/v1/embeddings", json={"content": "hello"})
    assert r.status_code == 200 and isinstance(r.json(), list)


@pytest.mark.parametrize("body,words", [
    ({"input": []}, "must not be empty"),
    ({"input": True}, "must be a string"),
    ({"input": "hello", "encoding_format": 1}, "float or base64"),
    ({"input": "hello", "encoding_format": "binary"}, "float or base64"),
    ({}, '"input" or "content" must be provided'),
    ({"input": ""}, "Input content cannot be empty"),
    ({"input": ["ok", [1, 96]]}, "96 is no token id"),
    ({"input": "x" * 17}, "too large to process"),
    ({"input": "x", "embd_normalize": "two"}, "embd_normalize"),
    ({"input": "x", "embd_normalize": -2}, "embd_normalize"),
])
def test_bad_input_is_a_400_and_lead_serves_on(body: dict[str, Any], words: str) -> None:
    c, _ = client(ScriptedEmbedder())
    r = c.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert words in r.json()["error"]["message"]
    assert c.post("/v1/embeddings", json={"input": "ok"}).status_code == 200
