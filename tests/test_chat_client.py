"""The chat client against a scripted lead (no processes): what it makes of odd streams."""

from __future__ import annotations

import httpx
import pytest

from chat.client import ChatClient, ChatError, ReplyStats

GOOD = ('data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": null}], '
        '"duo": {"tokens": 1, "accepted": 1}}')


def client_streaming(*lines: str) -> ChatClient:
    body = "\n\n".join(lines) + "\n\n"
    return ChatClient("lead:5555", transport=httpx.MockTransport(
        lambda _: httpx.Response(200, text=body,
                                 headers={"content-type": "text/event-stream"})))


def test_a_stream_reads_into_pieces_and_marks_accepted_ones() -> None:
    pieces = list(client_streaming(GOOD, "data: [DONE]").stream([], ReplyStats()))
    assert [(p.text, p.from_draft) for p in pieces] == [("hi", True)]


@pytest.mark.parametrize("garbled", ["data: {not json", 'data: {"choices": []}',
                                     'data: {"nothing": 1}', "data: [1, 2]"])
def test_a_garbled_stream_is_a_one_line_error(garbled: str) -> None:
    chat = client_streaming(GOOD, garbled, "data: [DONE]")
    with pytest.raises(ChatError, match="cannot read"):
        list(chat.stream([], ReplyStats()))


def test_a_reply_that_is_no_event_stream_is_a_one_line_error() -> None:
    chat = ChatClient("lead:5555", transport=httpx.MockTransport(
        lambda _: httpx.Response(200, text=GOOD + "\n\n")))  # no text/event-stream
    with pytest.raises(ChatError, match="no event stream"):
        list(chat.stream([], ReplyStats()))
