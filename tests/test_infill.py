"""Fill in the middle: /v1/completions with a suffix, as editors' autocomplete sends it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from lead.server.app import create_app
from shared.fake import FakeModel
from tests.conftest import make_settings


def completion(model: FakeModel, **fields: object) -> tuple[int, dict]:
    client = TestClient(create_app(make_settings(max_tokens=4), model))
    r = client.post("/v1/completions", json={"max_tokens": 3, "temperature": 0, **fields})
    return r.status_code, r.json()


def test_a_suffix_asks_for_the_middle_in_the_models_own_format() -> None:
    model = FakeModel(fim=True)
    status, body = completion(model, prompt="def f(", suffix="):\n")
    assert status == 200, body
    pre, suf, mid = model.fim_tokens  # type: ignore[misc]
    prompt = [pre, *model.tokenize("def f(", add_bos=False), suf,
              *model.tokenize("):\n", add_bos=False), mid]
    assert model.cached[:len(prompt)] == prompt  # what the reply was decoded after
    assert body["usage"]["prompt_tokens"] == len(prompt) == 3 + 6 + 3
    assert body["usage"]["completion_tokens"] == 3 and body["choices"][0]["text"]


def test_the_middle_is_what_the_model_says_after_its_middle_marker() -> None:
    model = FakeModel(fim=True)
    _, body = completion(model, prompt="ab", suffix="cd")
    pre, suf, mid = model.fim_tokens  # type: ignore[misc]
    expected = model.greedy_continuation([pre, *model.tokenize("ab"), suf,
                                          *model.tokenize("cd"), mid], 3)
    assert body["choices"][0]["text"] == "".join(model.token_bytes(t).decode()
                                                 for t in expected)


@pytest.mark.parametrize("suffix", ["", None])
def test_an_empty_suffix_is_a_plain_completion(suffix: str | None) -> None:
    model = FakeModel(fim=True)
    status, body = completion(model, prompt="ab", suffix=suffix)
    assert status == 200 and body["usage"]["prompt_tokens"] == 2
    assert model.cached[:2] == model.tokenize("ab")


def test_a_model_without_fill_in_the_middle_tokens_refuses_a_suffix() -> None:
    status, body = completion(FakeModel(), prompt="def f(", suffix="):\n")
    assert status == 400
    assert body["error"]["param"] == "suffix"
    assert "no fill-in-the-middle tokens" in body["error"]["message"]
