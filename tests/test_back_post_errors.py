"""What lead answers a back's odd post (on the link): a post's own checks in its words; a
body sent as a form; the long-polls' paths, gone."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.server.app import create_app
from tests.conftest import make_settings
from tests.test_link import link_post


def post(draft: dict[str, Any]) -> dict[str, Any]:
    app = create_app(make_settings(calibrate=False), FakeModel())
    with TestClient(app) as client, client.websocket_connect("/duo/link") as ws:
        refused = link_post(ws, {"session_id": "s", "start": 0, **draft})
    assert refused is not None and refused["status"] == 400, refused
    return refused


@pytest.mark.parametrize(("draft", "param", "says"), [
    ({"token_ids": [1, 2], "probs": [0.5]}, None, "probs must have one entry per draft"),
    ({"token_ids": [1, 2], "branches": [{"at": 5, "token_ids": [3]}]}, None,
     "branches[0].at: 5 is past the main chain"),
    ({"token_ids": [1], "dists": [{"token_ids": [4, 4], "probs": [0.5, 0.5]}]},
     "dists[0]", "token_ids must be distinct"),
    ({"token_ids": [1], "session_id": "s" * 65}, "session_id", "at most 64 characters"),
])
def test_a_posts_own_checks_answer_in_their_words(draft: dict[str, Any], param: str | None,
                                                  says: str) -> None:
    error = post(draft)
    assert error.get("param") == param and says in error["message"], error
    assert "not a JSON object" not in error["message"]


def test_json_sent_as_a_form_is_read_from_curl_and_refused_from_a_page() -> None:
    app = create_app(make_settings(calibrate=False), FakeModel())
    form = {"content-type": "application/x-www-form-urlencoded"}
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    with TestClient(app) as client:  # what curl -d sends without -H: read, as llama-server
        by_curl = client.post("/v1/chat/completions", content=body, headers=form)
        untyped = client.post("/v1/chat/completions", content=body)
        # a page's form (sent without a preflight): told to come as JSON
        by_page = client.post("/v1/chat/completions", content=body,
                              headers={**form, "origin": "http://localhost:3000"})
    assert by_curl.status_code == 200 and untyped.status_code == 200, by_curl.text
    assert by_page.status_code == 400
    assert "Content-Type: application/json" in by_page.json()["error"]["message"], by_page.text


def test_the_long_polls_are_gone_saying_what_took_their_place() -> None:
    app = create_app(make_settings(calibrate=False), FakeModel())
    with TestClient(app) as client:
        polled = client.get("/duo/state?wait=1")
        posted = client.post("/duo/draft", json={"session_id": "s", "start": 0,
                                                 "token_ids": [1]})
    for r in (polled, posted):
        assert r.status_code == 410 and "/duo/link" in r.json()["error"]["message"], r.text


def test_a_body_of_another_json_type_is_not_told_to_come_as_json() -> None:
    app = create_app(make_settings(calibrate=False), FakeModel())
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", content=b"[1]",
                        headers={"content-type": "application/vnd.api+json"})
    assert r.status_code == 400 and "not a JSON object" in r.json()["error"]["message"]
