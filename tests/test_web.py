"""The client-side HTTP helpers every reader of lead shares."""

import httpx
import pytest

from shared.web import error_message, lead_url, retry_after, sse_events


@pytest.mark.parametrize(("given", "want"), [
    ("host:5555", "http://host:5555"), (" http://h:1/ ", "http://h:1"),
    ("https://h", "https://h")])
def test_lead_url_adds_a_scheme_and_drops_the_slash(given: str, want: str) -> None:
    assert lead_url(given) == want


def test_error_message_reads_leads_body_or_falls_back_to_text() -> None:
    body = {"error": {"message": "max_tokens must be >= 1"}}
    assert error_message(httpx.Response(400, json=body)) == "max_tokens must be >= 1"
    assert error_message(httpx.Response(502, text="Bad Gateway")) == "Bad Gateway"


def test_retry_after_reads_whole_seconds_only() -> None:
    assert retry_after(httpx.Response(429, headers={"retry-after": "3"})) == 3.0
    assert retry_after(httpx.Response(429, headers={"retry-after": "soon"}), 0.5) == 0.5


def test_sse_events_stop_at_done_and_skip_other_lines() -> None:
    lines = ["", ": keep-alive", 'data: {"a": 1}', "", 'data: {"a": 2}', "data: [DONE]",
             'data: {"a": 3}']
    assert list(sse_events(lines)) == [{"a": 1}, {"a": 2}]
