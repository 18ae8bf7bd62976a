"""python -m lead's start: where it cannot listen, it says so in one line before any
model loads (the port bound first), not after a "listening" line."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from lead.__main__ import main
from lead.server.serve import bound_socket, bound_sockets


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_port_in_use_is_a_one_line_error_before_the_model_loads(
        taken_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    # a model that does not exist: reaching it would be a different error
    with pytest.raises(SystemExit) as stop:
        main(["--port", str(taken_port), "-m", "/nonexistent/model.gguf", "--no-calibrate"])
    assert stop.value.code not in (0, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot listen on 127.0.0.1:{taken_port}" in err[0], err


def test_a_host_that_does_not_resolve_is_a_one_line_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--host", "nosuch.invalid", "-m", "/nonexistent/model.gguf", "--no-calibrate"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot listen on nosuch.invalid" in err[0], err


def test_localhost_is_bound_as_uvicorn_binds_it_ipv4(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def ipv6_first(*args: object, **kwargs: object) -> list:  # as where /etc/hosts lists ::1
        found = real(*args, **kwargs)  # type: ignore[arg-type]
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)), *found]
    monkeypatch.setattr(socket, "getaddrinfo", ipv6_first)
    with bound_socket("localhost", 0) as sock:  # a back at 127.0.0.1 must reach it
        assert sock.family == socket.AF_INET


def test_several_addresses_are_each_bound_or_none_is(taken_port: int) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    sockets = bound_sockets("127.0.0.1, localhost", free)  # llama-server's --host a,b
    try:
        assert [s.getsockname() for s in sockets] == [("127.0.0.1", free)] * 2
    finally:
        for sock in sockets:
            sock.close()
    with pytest.raises(OSError):  # the second taken: the first is closed again
        bound_sockets("127.0.0.2,127.0.0.1", taken_port)
