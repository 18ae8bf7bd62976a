"""The gate: a keyless lead reached on loopback answers only requests whose Host names
loopback (DNS rebinding); with a key any Host is fine; the back key opens /duo/* only; a
keyless lead listening beyond loopback warns at startup."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator

import httpx
import pytest

from bench.fake import FakeModel
from lead.server import serve as lead_serve
from lead.server.app import create_app
from lead.server.gate import exposure_warning, names_loopback
from tests.conftest import LiveServer, make_settings
from tests.test_api import is_error_body


def get(path: str, host: str | None, base: str = "http://127.0.0.1:5555",
        key: str | None = None, **settings: object) -> httpx.Response:
    """GET `path` in process, as a connection arriving at `base`'s address would."""
    app = create_app(make_settings(calibrate=False, **settings), FakeModel())
    headers = {"Host": host} if host else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # scope["server"]: base's host and port
        async with httpx.AsyncClient(transport=transport, base_url=base) as http:
            return await http.get(path, headers=headers)
    try:
        return asyncio.run(call())
    finally:
        app.state.engine.shutdown()


@pytest.mark.parametrize("host", ["127.0.0.1:5555", "127.0.0.1", "localhost", "LOCALHOST:80",
                                  "[::1]:5555", "[::1]", "127.0.0.2:5555"])
def test_a_keyless_lead_on_loopback_answers_hosts_that_name_loopback(host: str) -> None:
    assert get("/v1/models", host).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:5555", "127.0.0.1.evil.example",
                                  "localhost.evil.example", "[::2]:5555"])
def test_a_keyless_lead_on_loopback_refuses_other_hosts_saying_why(host: str) -> None:
    for path in ("/v1/models", "/health", "/"):  # the open paths too: it is no key check
        r = get(path, host)
        assert r.status_code == 403 and is_error_body(r), (path, r.text)
        message = r.json()["error"]["message"]
        assert host in message and "DNS rebinding" in message and "--api-key" in message


def test_with_an_api_key_any_host_is_answered() -> None:
    assert get("/v1/models", "evil.example", key="k", api_key="k").status_code == 200
    assert get("/v1/models", "evil.example", api_key="k").status_code == 401  # the key still
    assert get("/health", "evil.example", api_key="k").status_code == 200


def test_the_check_is_for_connections_that_arrived_on_loopback() -> None:
    # a keyless lead on 0.0.0.0 (warned at startup) reached on its LAN address by name
    assert get("/v1/models", "machine-a:5555", base="http://10.0.0.5:5555").status_code == 200
    # its loopback side is checked all the same
    assert get("/v1/models", "evil.example", base="http://127.0.0.1:5555").status_code == 403
    # an in-process transport (tests) has no socket: nothing arrived on loopback
    assert get("/v1/models", None, base="http://testserver").status_code == 200


def test_the_back_key_opens_the_back_protocol_only() -> None:
    keys = {"api_key": "api", "back_key": "back"}
    assert get("/duo/info", None, key="back", **keys).status_code == 200
    assert get("/v1/models", None, key="back", **keys).status_code == 401
    assert get("/metrics", None, key="back", **keys).status_code == 401
    assert get("/duo/info", None, key="api", **keys).status_code == 200
    assert get("/v1/models", None, key="api", **keys).status_code == 200
    assert get("/duo/info", None, key="wrong", **keys).status_code == 401


def test_host_names() -> None:
    assert names_loopback(b"127.0.0.1:5555") and names_loopback(b"[::1]:80")
    assert names_loopback(b"localhost.") and names_loopback(b"[::ffff:127.0.0.1]:5555")
    assert not names_loopback(None) and not names_loopback(b"") and not names_loopback(b"[::1")
    assert not names_loopback(b"10.0.0.1") and not names_loopback(b"localhostevil:80")


def test_exposure_warning_for_a_keyless_bind_beyond_loopback() -> None:
    for host in ("0.0.0.0", "::", "10.0.0.5", "machine-a"):
        warning = exposure_warning(host, None)
        assert warning is not None and host in warning and "--api-key" in warning
    assert exposure_warning("0.0.0.0", "k") is None
    assert all(exposure_warning(h, None) is None for h in ("127.0.0.1", "localhost", "::1"))


@pytest.fixture
def no_uvicorn(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    ran: list[str] = []
    monkeypatch.setattr(lead_serve._Server, "run", lambda self, *a, **k: ran.append("run"))
    monkeypatch.setattr(lead_serve, "bound_socket", lambda host, port: socket.socket())
    yield ran


@pytest.mark.parametrize(("host", "key", "warns"), [("0.0.0.0", None, True),
                                                    ("0.0.0.0", "k", False),
                                                    ("127.0.0.1", None, False)])
def test_serve_logs_the_warning_at_startup(no_uvicorn: list[str], caplog: pytest.LogCaptureFixture,
                                           host: str, key: str | None, warns: bool) -> None:
    app = create_app(make_settings(calibrate=False, api_key=key), FakeModel())
    try:
        with caplog.at_level(logging.WARNING, "lead"):
            lead_serve.serve(app, host, 5555)
    finally:
        app.state.engine.shutdown()
    assert no_uvicorn == ["run"]
    warned = [r for r in caplog.records if "no API key" in r.getMessage()]
    assert len(warned) == int(warns), [r.getMessage() for r in caplog.records]


@pytest.mark.process
def test_a_real_keyless_lead_refuses_a_foreign_host() -> None:
    server = LiveServer(create_app(make_settings(calibrate=False), FakeModel()))
    try:
        assert raw_get(server.port, "evil.example").startswith(b"HTTP/1.1 403")
        assert raw_get(server.port, f"127.0.0.1:{server.port}").startswith(b"HTTP/1.1 200")
        assert httpx.get(f"http://localhost:{server.port}/health").status_code == 200
    finally:
        server.stop()


def raw_get(port: int, host: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                     .encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer
