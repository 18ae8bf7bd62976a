"""The client-side HTTP helpers every reader of lead shares."""

import httpx
import pytest
from httpx_sse import SSEError

from shared.wire.httpclient import error_message, lead_url, retry_after, sse_events
from tests.conftest import event_stream


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


def test_sse_events_stop_at_done_and_skip_comments() -> None:
    text = ': keep-alive\n\ndata: {"a": 1}\n\ndata: {"a": 2}\n\ndata: [DONE]\n\ndata: {"a": 3}\n\n'
    assert list(sse_events(event_stream(text))) == [{"a": 1}, {"a": 2}]


def test_sse_events_refuse_a_response_that_is_no_event_stream() -> None:
    with pytest.raises(SSEError):
        list(sse_events(httpx.Response(200, text='data: {"a": 1}\n\n')))
