"""python -m lead's start: where it cannot listen, it says so in one line before any
model loads (the port bound first), not after a "listening" line."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from lead.__main__ import main


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
