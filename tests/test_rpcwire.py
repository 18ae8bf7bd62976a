"""--rpc endpoints and the HELLO check, against scripted servers on real sockets."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from back.settings import BackSettings
from lead.server.settings import LeadSettings
from shared.cli import parse_settings
from shared.wire.rpc_endpoints import (
    CAPS_SIZE,
    HELLO,
    Endpoint,
    RpcError,
    hello,
    parse_endpoints,
    parse_weights,
)


def test_endpoints_parse_in_order() -> None:
    assert parse_endpoints("10.0.0.2:50052, gpu-box:50053") == [
        Endpoint("10.0.0.2", 50052), Endpoint("gpu-box", 50053)]
    assert parse_endpoints("[::1]:50052") == [Endpoint("::1", 50052)]


@pytest.mark.parametrize("spec", ["", ",", "host", "host:", ":50052", "h:0", "h:70000",
                                  "h:port", "a:1,a:1"])
def test_bad_endpoints_are_refused(spec: str) -> None:
    with pytest.raises(RpcError, match="--rpc"):
        parse_endpoints(spec)


def test_weights() -> None:
    assert parse_weights("3,1") == [3.0, 1.0]
    for bad in ("3;1", "0,0", "-1,2", ""):
        with pytest.raises(RpcError, match="--tensor-split"):
            parse_weights(bad)


@pytest.mark.parametrize("settings_cls", [LeadSettings, BackSettings])
def test_a_bad_rpc_flag_is_a_one_line_error(settings_cls: type,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(settings_cls, "prog", "", ["--rpc", "gpu-box"])
    assert exited.value.code == 2
    assert "'gpu-box' is not host:port" in capsys.readouterr().err
    ok = parse_settings(settings_cls, "prog", "", ["--rpc", "a:1,b:2", "--tensor-split", "1,1"])
    assert ok.rpc == "a:1,b:2" and ok.tensor_split == "1,1"


@contextmanager
def scripted_server(answer: Callable[[socket.socket], None]) -> Iterator[Endpoint]:
    """A one-connection server on a free port that reads the request, then `answer`s."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    received: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            received.append(conn.recv(1 + 8 + CAPS_SIZE, socket.MSG_WAITALL))
            answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield Endpoint("127.0.0.1", port)
    finally:
        listener.close()
        thread.join(timeout=5)
    assert received == [struct.pack("<BQ", HELLO, CAPS_SIZE) + bytes(CAPS_SIZE)]


def reply(major: int, minor: int = 0, patch: int = 0) -> Callable[[socket.socket], None]:
    body = bytes([major, minor, patch, 0]) + bytes(CAPS_SIZE)
    return lambda conn: conn.sendall(struct.pack("<Q", len(body)) + body)


def test_hello_reads_the_protocol_version() -> None:
    with scripted_server(reply(7, 0, 1)) as endpoint:
        assert hello(endpoint) == (7, 0, 1)


def test_another_protocol_version_is_named() -> None:
    with scripted_server(reply(6, 2, 0)) as endpoint, \
            pytest.raises(RpcError, match=r"speaks protocol 6\.2\.0"):
        hello(endpoint)


def test_a_server_that_hangs_up_is_named() -> None:
    with scripted_server(lambda conn: None) as endpoint, \
            pytest.raises(RpcError, match=f"cannot reach RPC server {endpoint}"):
        hello(endpoint)


def test_a_silent_server_times_out_with_the_likely_reason() -> None:
    done = threading.Event()
    with scripted_server(lambda conn: done.wait(5)) as endpoint, \
            pytest.raises(RpcError, match="one client at a time"):
        try:
            hello(endpoint, timeout=0.3)
        finally:
            done.set()


def test_a_server_that_is_not_there_is_named() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    with pytest.raises(RpcError, match=f"cannot reach RPC server 127.0.0.1:{port}"):
        hello(Endpoint("127.0.0.1", port))


def test_a_server_of_another_protocol_is_refused() -> None:
    def http_like(conn: socket.socket) -> None:
        conn.sendall(struct.pack("<Q", 10**9) + b"HTTP/1.1 400")

    with scripted_server(http_like) as endpoint, \
            pytest.raises(RpcError, match="not a llama.cpp RPC server"):
        hello(endpoint)
