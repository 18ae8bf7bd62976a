"""llama-server's native /completion on lead (lead/apis/completion.py), in process over the
fake model: the prompt as text, ids or both; whole and streamed replies in llama-server's
shape, equal to each other and to /v1/completions's text; its fields' 400s."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.server.app import create_app
from tests.conftest import make_settings


def client() -> tuple[TestClient, FakeModel]:
    model = FakeModel()
    return TestClient(create_app(make_settings(), model)), model


def stream(c: TestClient, **body: object) -> list[dict]:
    with c.stream("POST", "/completion", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_a_text_prompt_gives_llama_servers_reply() -> None:
    c, model = client()
    r = c.post("/completion", json={"prompt": "abc", "n_predict": 6, "return_tokens": True})
    body = r.json()
    assert r.status_code == 200 and body["stop"] is True and body["stop_type"] == "limit"
    assert body["timings"]["predicted_n"] == body["tokens_predicted"] == 6
    assert body["tokens_evaluated"] == len(model.tokenize("abc")) and body["truncated"] is False
    assert len(body["tokens"]) == 6 and all(isinstance(t, int) for t in body["tokens"])
    text = b"".join(model.token_bytes(t) for t in body["tokens"]).decode("utf-8", "replace")
    assert body["content"] == text
    openai = c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 6}).json()
    assert openai["choices"][0]["text"] == body["content"]  # the same generation
    assert c.post("/completion", json={"prompt": "abc", "n_predict": 2}).json()["tokens"] == []


def test_return_progress_streams_the_prompt_s_evaluation_before_its_reply() -> None:
    model = FakeModel()
    c = TestClient(create_app(make_settings(batch_size=4), model))
    objects = stream(c, prompt="abcdefghij", n_predict=2, return_progress=True)
    told = [o["prompt_progress"] for o in objects if "prompt_progress" in o]
    total = len(model.tokenize("abcdefghij"))
    # found cached (none), batches of 4, the last with the prompt's last token
    assert [(p["total"], p["cache"], p["processed"]) for p in told] == \
        [(total, 0, n) for n in (0, 4, 8, total)]
    assert all("prompt_progress" in o for o in objects[:len(told)])  # before any text
    assert not any("prompt_progress" in o for o in stream(c, prompt="abc", n_predict=2))


def test_ids_and_mixed_prompts_are_the_text_they_stand_for() -> None:
    c, model = client()
    ids = model.tokenize("abc")
    by_text = c.post("/completion", json={"prompt": "abc", "n_predict": 5}).json()
    by_ids = c.post("/completion", json={"prompt": ids, "n_predict": 5}).json()
    mixed = c.post("/completion", json={"prompt": ["a", *model.tokenize("bc")],
                                        "n_predict": 5}).json()
    assert by_text["content"] == by_ids["content"] == mixed["content"]


def test_streamed_objects_carry_text_and_ids_and_add_up_to_the_whole_reply() -> None:
    c, _ = client()
    events = stream(c, prompt="hello", n_predict=8)
    whole = c.post("/completion", json={"prompt": "hello", "n_predict": 8}).json()
    assert all(e["stop"] is False and e["tokens"] for e in events[:-1])
    assert events[-1]["stop"] is True and events[-1]["timings"]["predicted_n"] == 8
    assert "".join(e["content"] for e in events) == whole["content"]
    assert sum(len(e["tokens"]) for e in events[:-1]) == 8


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": ["one", "two"], "stream": True}, "prompt"),
    ({"prompt": {"prompt_string": "a", "multimodal_data": ["iVBO"]}},
     "prompt.multimodal_data"),
    ({"prompt": [5, 10**9]}, "prompt[1]"),
    ({"prompt": "a", "n_probs": -1}, "n_probs"),
    ({"prompt": "a", "n_predict": -2}, "n_predict"),
    ({"prompt": "a", "temperature": "hot"}, "temperature"),
    ({"prompt": ""}, "prompt"),
])
def test_what_would_change_the_reply_unseen_is_a_400_naming_it(body: dict, param: str) -> None:
    c, _ = client()
    r = c.post("/completion", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert c.post("/completion", json={"prompt": "a", "n_predict": 1}).status_code == 200


def test_several_prompts_are_answered_as_a_list_each_as_if_alone() -> None:
    c, model = client()
    ids = model.tokenize("two")
    alone = [c.post("/completion", json={"prompt": p, "n_predict": 4}).json()
             for p in ("one", ids)]
    both = c.post("/completion", json={"prompt": ["one", ids], "n_predict": 4}).json()
    assert [b["index"] for b in both] == [0, 1]
    assert [b["content"] for b in both] == [a["content"] for a in alone]


def test_a_prompt_object_s_text_is_the_prompt() -> None:
    c, _ = client()
    as_object = c.post("/completion", json={"prompt": {"prompt_string": "one"},
                                            "n_predict": 4}).json()
    assert as_object["content"] == c.post("/completion", json={"prompt": "one",
                                                               "n_predict": 4}).json()["content"]
