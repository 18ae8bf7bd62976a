"""Delivery over a real socket: a client that reads nothing is cut off after the write
timeout and frees lead for the next; a slow but steady reader gets all of its reply and
never slows decoding. A real uvicorn server (as `python -m lead` runs it) over a fake
target whose every step costs a fixed time."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from bench.fake import FakeModel
from bench.procs import wait_until
from lead.decode.session import Session
from lead.server.app import create_app
from shared.wire.scrape import read_samples
from tests.conftest import LiveServer, chat_body, make_settings

pytestmark = pytest.mark.process

WRITE_TIMEOUT = 0.5
CLIENT_RCVBUF = 4096


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[tuple[LiveServer, FastAPI]]:
    step_s = getattr(request, "param", 0.005)
    target = FakeModel(n_ctx=8192, cost_s=(step_s, 0.0))  # one token a step, each step_s
    app = create_app(make_settings(write_timeout=WRITE_TIMEOUT, calibrate=False), target)
    server = LiveServer(app)
    try:
        yield server, app
    finally:
        server.stop()


def open_stream(port: int, max_tokens: int) -> socket.socket:
    """A streamed chat request for a reply of exactly `max_tokens` (EOS banned) on a raw
    socket, read up to the end of the response's headers."""
    sock = socket.socket()
    # A small receive buffer only shortens the test: the client's buffer is the one part of
    # the path lead cannot bound (its own are bounded, lead/server/sendwatch.py), and a
    # silent client is noticed once every buffer on the way is full.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)
    sock.connect(("127.0.0.1", port))
    body = json.dumps(chat_body("go", stream=True, max_tokens=max_tokens,
                                logit_bias={"0": -100})).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                 + body)
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)  # byte by byte: nothing of the body is read
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def lead_is_watching(server: LiveServer) -> bool:
    """Whether lead holds bytes a client has not taken, and is timing it
    (lead/server/sendwatch.py)."""
    return any(getattr(p, "wire", None) is not None and p.wire.watching
               for p in server.server.server_state.connections)


def running_session(app: FastAPI) -> Session:
    wait_until(lambda: app.state.engine.session is not None, 10, "the generation to start")
    session = app.state.engine.session
    assert session is not None
    return session


def test_a_client_that_reads_nothing_is_cut_off_and_the_next_is_served(
        served: tuple[LiveServer, FastAPI], caplog: pytest.LogCaptureFixture) -> None:
    server, app = served
    caplog.set_level(logging.WARNING, "lead")
    silent = open_stream(server.port, max_tokens=4000)  # 20 s of decoding at 5 ms a token
    try:
        session = running_session(app)
        wait_until(lambda: lead_is_watching(server), 30, "lead to find its buffers full")
        started = time.monotonic()
        r = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body("b", max_tokens=4),
                       timeout=30)
        waited = time.monotonic() - started
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        # it waited out the write timeout, not the rest of a 20 s reply
        assert waited < WRITE_TIMEOUT + 3.0, waited
        assert session.done and session.finish_reason == "cancelled"
        assert session.n_generated < 2000, session.n_generated  # buffers' worth, not 4000
        lines = [r.getMessage() for r in caplog.records if "read nothing" in r.getMessage()]
        assert len(lines) == 1 and session.id in lines[0] and "unsent" in lines[0] and \
            "generation cancelled" in lines[0], lines
        cut = read_samples(httpx.get(f"{server.url}/metrics").text)["duo_clients_cut_off_total"]
        assert cut == 1
        assert read_to_close(silent)  # what the kernels held, then the end: closed
    finally:
        silent.close()


def read_to_close(sock: socket.socket) -> bytes:
    """What is read until the server closes the connection (EOF or reset)."""
    sock.settimeout(10)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


@pytest.mark.parametrize("served", [0.001], indirect=True)
def test_a_slow_steady_reader_gets_all_of_its_reply_and_never_slows_decoding(
        served: tuple[LiveServer, FastAPI], caplog: pytest.LogCaptureFixture) -> None:
    server, app = served
    reader = open_stream(server.port, max_tokens=800)  # ~210 KB of events: over lead's buffers
    reader.settimeout(WRITE_TIMEOUT)
    received, watched, read_when_decoded = b"", False, None
    try:
        session = running_session(app)
        # 4 KiB every 0.25 s: a whole receive window each time, two per write timeout. TCP
        # shows lead a reader's progress only as the window reopens, so one reading far
        # less than a window per write timeout looks silent. Decoding 800 tokens has 6 s
        # to end before half is read: ~1 s here when quiet, 3 s beside two busy loops.
        while not received.endswith(b"0\r\n\r\n"):  # the chunked body's end
            chunk = reader.recv(4096)
            assert chunk, "lead closed the connection"
            received += chunk
            watched = watched or lead_is_watching(server)
            if read_when_decoded is None and session.done:
                read_when_decoded = len(received)
            time.sleep(0.25)  # the client's pace, not synchronisation
    finally:
        reader.close()
    # raw bytes off a socket, chunked: the data lines are picked out of them
    events = [json.loads(line[6:]) for line in received.decode().splitlines()
              if line.startswith("data: {")]
    assert events[-1]["usage"]["completion_tokens"] == 800
    assert session.finish_reason == "length"
    assert watched  # lead's buffers were full: the reader was slower than decoding
    # decoding ended while most of the reply was still to be read
    assert read_when_decoded is not None and read_when_decoded < len(received) / 2
    assert not [r for r in caplog.records if "read nothing" in r.getMessage()]


@pytest.mark.parametrize("served", [0.001], indirect=True)
def test_a_non_streamed_reply_frees_lead_when_decoded_and_its_silent_client_is_cut_off(
        served: tuple[LiveServer, FastAPI], caplog: pytest.LogCaptureFixture) -> None:
    server, app = served
    caplog.set_level(logging.WARNING, "lead")
    # 600 tokens with their 20 likeliest each: a reply of ~800 KB, far over every buffer
    body = json.dumps(chat_body("go", max_tokens=600, logit_bias={"0": -100}, logprobs=True,
                                top_logprobs=20)).encode()
    silent = socket.socket()
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)  # as above
    silent.connect(("127.0.0.1", server.port))
    try:
        silent.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                       % len(body) + body)
        session = running_session(app)
        wait_until(lambda: lead_is_watching(server), 30, "lead to find its buffers full")
        assert session.done and session.finish_reason == "length"  # the slot is free...
        r = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body("b", max_tokens=4),
                       timeout=30)
        assert r.status_code == 200, r.text  # ...and the next is served, the body unread
        wait_until(lambda: any("read nothing" in r.getMessage() for r in caplog.records),
                   10, "the silent client to be cut off")
        line = next(r.getMessage() for r in caplog.records if "read nothing" in r.getMessage())
        assert "POST /v1/chat/completions" in line and "connection closed" in line, line
        head, _, rest = read_to_close(silent).partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        assert len(rest) < length  # closed with the reply unsent, not flushed at leisure
    finally:
        silent.close()
