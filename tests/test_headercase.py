"""Response header names on the wire as llama-server writes them (`Content-Type`), through
lead's own uvicorn protocol (lead/server/headercase.py, serve.py)."""

from __future__ import annotations

import re
import socket

import pytest

from bench.fake import FakeModel
from lead.server.app import create_app
from lead.server.headercase import canonical
from tests.conftest import LiveServer, make_settings


@pytest.mark.parametrize(("name", "written"), [
    (b"content-type", b"Content-Type"), (b"access-control-allow-origin",
                                         b"Access-Control-Allow-Origin"),
    (b"X-REQUEST-ID", b"X-Request-Id"), (b"www-authenticate", b"WWW-Authenticate"),
    (b"date", b"Date")])
def test_names_are_written_capitalised(name: bytes, written: bytes) -> None:
    assert canonical(name) == written


def raw(port: int, head: str) -> bytes:
    """The response's status line and headers, as the socket carried them."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer.split(b"\r\n\r\n", 1)[0]


def names(head: bytes) -> list[bytes]:
    return [line.split(b":", 1)[0] for line in head.split(b"\r\n")[1:]]


@pytest.mark.process
def test_a_real_lead_writes_capitalised_header_names() -> None:
    server = LiveServer(create_app(make_settings(calibrate=False, cors_origins="localhost"),
                                   FakeModel()))
    try:
        host = f"Host: 127.0.0.1:{server.port}\r\n"
        preflight = raw(server.port, f"OPTIONS /completions HTTP/1.1\r\n{host}"
                        "Origin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\n")
        health = raw(server.port, f"GET /health HTTP/1.1\r\n{host}")
    finally:
        server.stop()
    assert b"\r\nAccess-Control-Allow-Origin: http://localhost:3000" in preflight
    assert b"\r\nContent-Type: application/json" in health and b"\r\nDate: " in health
    for name in names(preflight) + names(health):
        assert re.fullmatch(rb"[A-Z][a-z]*(-[A-Z][a-z]*)*", name), name
