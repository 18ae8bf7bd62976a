"""A real lead process on SmolLM2 for the real tier's flag tests: started with llama.cpp's
whole log in a file (never a full pipe), served, then stopped."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from bench.procs import ROOT, free_port, wait_until
from shared.presets import PRESETS, cache_dir


@contextmanager
def smollm2_lead(argv: list[str], log: Path) -> Iterator[str]:
    """lead -m smollm2-135m ARGV, serving; its URL. llama.cpp's log goes to `log`."""
    if not (cache_dir() / PRESETS["smollm2-135m"].filename).is_file():
        pytest.skip("SmolLM2 not installed: make models")
    port = free_port()
    with log.open("w") as err:
        lead = subprocess.Popen([sys.executable, "-m", "lead", "-m", "smollm2-135m", *argv,
                                 "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=err, env={**os.environ, "DUO_LLAMA_LOG": "1"})
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert lead.poll() is None, log.read_text()[-2000:]
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 300, "lead to serve")
        yield url
    finally:
        lead.terminate()
        lead.wait(30)
