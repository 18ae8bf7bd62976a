"""What lead answers a back's odd post (HTTP): a post's own checks in its words, ids it
cannot hold, another session's state from its start; a body sent as a form; a long-poll
whose back left, or open as lead shuts down."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lead.decode.metrics import Metrics
from lead.drafts.feed import BackFeed
from lead.policy.cost import CostModel
from lead.server.app import create_app
from shared.fake import FakeModel
from tests.conftest import async_wait_until, make_settings
from tests.test_link import session


def post(draft: dict[str, Any]) -> dict[str, Any]:
    app = create_app(make_settings(calibrate=False), FakeModel())
    with TestClient(app) as client:
        r = client.post("/duo/draft", json={"session_id": "s", "start": 0, **draft})
    assert r.status_code == 400, r.text
    return r.json()["error"]


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
    assert error["param"] == param and says in error["message"], error
    assert "not a JSON object" not in error["message"]


def test_a_post_for_a_session_lead_does_not_show_the_back_gets_the_shown_one_whole() -> None:
    feed = BackFeed(CostModel(max_draft=8, fixed=4), Metrics())
    feed.start(session("a", [1, 2, 3, 4, 5]))
    assert feed.state(3, "q", "a").token_ids == [4, 5]  # its own: from the post's start
    assert feed.state(3, "q", "elsewhere").token_ids == [1, 2, 3, 4, 5]  # another: whole
    assert feed.state(3, "q", "elsewhere").offset == 0


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


# --- long-polls: a place freed when its back leaves, and at shutdown ---


async def long_poll(app: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GET /duo/state?since=BIG&wait=30 over raw ASGI: `messages` are what the client
    sends (then it waits forever); what lead sent back."""
    sent: list[dict[str, Any]] = []
    inbox = iter(messages)

    async def receive() -> dict[str, Any]:
        nxt = next(inbox, None)
        if nxt is None:
            await asyncio.get_running_loop().create_future()  # nothing more, ever
        return nxt  # type: ignore[return-value]

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
    scope = {"type": "http", "method": "GET", "path": "/duo/state", "headers": [],
             "query_string": b"since=999999&wait=30", "client": ("10.0.0.9", 1),
             "server": ("lead", 80), "scheme": "http", "root_path": "", "http_version": "1.1"}
    await asyncio.wait_for(app(scope, receive, send), 10)  # a hang fails, not a timing
    return sent


def test_a_long_poll_whose_back_left_frees_its_place_at_once() -> None:
    app = create_app(make_settings(calibrate=False), FakeModel())
    feed = app.state.engine.feed
    sent = asyncio.run(long_poll(app, [{"type": "http.request", "body": b""},
                                       {"type": "http.disconnect"}]))
    assert sent[0]["status"] == 499 and feed.polls.open == {}


def test_shutting_down_answers_an_open_long_poll_at_once() -> None:
    app = create_app(make_settings(calibrate=False), FakeModel())

    async def closed_while_polled() -> list[dict[str, Any]]:
        polled = asyncio.create_task(long_poll(app, [{"type": "http.request", "body": b""}]))
        await async_wait_until(lambda: app.state.engine.feed.polls.open != {})
        app.state.on_exit()
        return await polled
    sent = asyncio.run(closed_while_polled())
    assert sent[0]["status"] == 200 and app.state.engine.feed.polls.open == {}


def test_a_long_polls_wait_is_a_finite_number_named_as_sent() -> None:
    app = create_app(make_settings(calibrate=False), FakeModel())
    with TestClient(app) as client:
        error = client.get("/duo/state?wait=nan").json()["error"]
    assert error["param"] == "wait" and "finite" in error["message"], error


def test_a_body_of_another_json_type_is_not_told_to_come_as_json() -> None:
    app = create_app(make_settings(calibrate=False), FakeModel())
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", content=b"[1]",
                        headers={"content-type": "application/vnd.api+json"})
    assert r.status_code == 400 and "not a JSON object" in r.json()["error"]["message"]
