"""chat.py's errors where part of a reply was shown, and where the input itself is at fault:
each on a line of its own, naming what is wrong."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chat.client import ChatClient, ChatError, ReplyStats
from chat.repl import Conversation, Repl, piped, read_piped

ROOT = Path(__file__).resolve().parent.parent
PIECE = b'data: {"choices": [{"delta": {"content": "as they"}, "finish_reason": null}]}\n\n'


class DyingStream(httpx.SyncByteStream):
    """A reply's first piece, then the connection drops (lead died)."""

    def __iter__(self) -> Iterator[bytes]:
        yield PIECE
        raise httpx.RemoteProtocolError("peer closed connection")


def repl_of_dying_lead(shown: list[str]) -> Repl:
    client = ChatClient("lead:5555", transport=httpx.MockTransport(lambda _: httpx.Response(
        200, headers={"content-type": "text/event-stream"}, stream=DyingStream())))
    return Repl(client, Conversation(), False, {}, write=shown.append)


def test_an_error_mid_reply_starts_its_own_line_in_the_repl() -> None:
    shown: list[str] = []
    with pytest.raises(ChatError, match="connection to lead lost"):
        repl_of_dying_lead(shown).reply("hi")
    assert "".join(shown) == "as they\n"  # (the REPL then writes "error: ...")


def test_an_error_mid_reply_starts_its_own_line_when_piped(
        capsys: pytest.CaptureFixture[str]) -> None:
    shown: list[str] = []
    assert piped(repl_of_dying_lead(shown), "hi") == 1
    assert "".join(shown) == "as they\n"
    assert capsys.readouterr().err.startswith("error: connection to lead lost")


def test_an_error_before_any_reply_adds_no_empty_line() -> None:
    shown: list[str] = []
    client = ChatClient("lead:5555", transport=httpx.MockTransport(
        lambda _: httpx.Response(401, json={"error": {"message": "no"}})))
    with pytest.raises(ChatError, match="API key"):
        Repl(client, Conversation(), False, {}, write=shown.append).reply("hi")
    assert shown == []


def test_input_that_is_not_utf8_is_said_to_be_so() -> None:
    assert read_piped(io.BytesIO("héllo".encode())) == "héllo"
    with pytest.raises(ChatError, match=r"standard input is not UTF-8 text \(byte 0xff"):
        read_piped(io.BytesIO(b"\xff\xfe\x00hi"))


def test_text_no_encoding_names_is_refused_before_it_is_sent() -> None:
    asked: list[httpx.Request] = []
    client = ChatClient("lead:5555", transport=httpx.MockTransport(
        lambda r: asked.append(r) or httpx.Response(500)))
    with pytest.raises(ChatError, match="not UTF-8"):
        list(client.stream([{"role": "user", "content": "\udcff"}], ReplyStats()))
    assert asked == []


@pytest.mark.process
def test_chat_py_says_its_input_is_not_utf8_not_that_lead_sent_garbage() -> None:
    done = subprocess.run([sys.executable, "chat.py", "--lead", "127.0.0.1:9"], cwd=ROOT,
                          input=b"\xff\xfe\x00hi", capture_output=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [
        "error: standard input is not UTF-8 text (byte 0xff at offset 0)"]
