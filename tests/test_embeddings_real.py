"""Real-model tier for --embeddings (shared/llama/embed.py through lead/apis/embeddings.py):
SmolLM2-135M's vectors, mean-pooled (its GGUF names no pooling) and per token with
--pooling none, served in process beside a generation on the same weights."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from lead.server.app import create_app
from shared.llama.model import LlamaModel, load_model
from tests.conftest import make_settings

pytestmark = pytest.mark.real

N_EMBD = 576  # SmolLM2-135M's hidden size
TEXTS = ["I believe the meaning of life is", "This is a test", "def add(a, b):"]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return load_model("smollm2-135m", threads=1, n_ctx=512)


def lead(model: LlamaModel, **settings: Any) -> TestClient:
    return TestClient(create_app(make_settings(embeddings=True, threads=1, calibrate=False,
                                               draft_len=0, **settings), model))


@pytest.fixture(scope="module")
def mean(model: LlamaModel) -> Iterator[TestClient]:
    with lead(model) as c:
        yield c


def vectors(c: TestClient, value: Any) -> list[list[float]]:
    r = c.post("/v1/embeddings", json={"input": value})
    assert r.status_code == 200, r.text
    return [d["embedding"] for d in r.json()["data"]]


def test_openai_vectors_are_unit_length_in_order_and_repeatable(mean: TestClient) -> None:
    batch = vectors(mean, TEXTS)
    assert [len(v) for v in batch] == [N_EMBD] * len(TEXTS)
    assert all(abs(float(np.linalg.norm(v)) - 1) < 1e-3 for v in batch)
    for text, v in zip(TEXTS, batch, strict=True):  # each alone: the same vector
        np.testing.assert_allclose(vectors(mean, text)[0], v, atol=1e-4)
    assert np.max(np.abs(np.subtract(batch[0], batch[1]))) > 1e-2


def test_a_generation_goes_on_beside_embeddings(mean: TestClient) -> None:
    r = mean.post("/v1/completions", json={"prompt": "1, 2, 3,", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
    assert len(vectors(mean, "still here")[0]) == N_EMBD


def test_too_long_for_the_batch_is_a_400(mean: TestClient) -> None:
    r = mean.post("/v1/embeddings", json={"input": "This is a test " * 512})
    assert r.status_code == 400 and "too large" in r.json()["error"]["message"]


def test_pooling_none_gives_a_vector_a_token(model: LlamaModel) -> None:
    with lead(model, pooling="none") as c:
        ids = model.tokenize("hello hello hello", special=True)
        rows = c.post("/embedding", json={"content": "hello hello hello"}).json()[0]
        assert np.shape(rows["embedding"]) == (len(ids), N_EMBD)
        assert any(abs(float(np.linalg.norm(r)) - 1) > 1e-3 for r in rows["embedding"])
        assert c.post("/v1/embeddings", json={"input": "hello"}).status_code == 400
