"""What the benchmark checks before it runs anything: where its results go, and that its
models are GGUF files (a wrong path found after every configuration started cost minutes)."""

from __future__ import annotations

import os
from pathlib import Path

GGUF_MAGIC = b"GGUF"  # a GGUF file's first bytes


class OutError(Exception):
    """--out cannot take the results."""


def writable(out: Path) -> None:
    """--out made where missing; OutError naming it where it cannot be made or written."""
    if out.exists() and not out.is_dir():
        raise OutError(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutError(f"--out {out}: cannot make that folder ({exc.strerror or exc})") \
            from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise OutError(f"--out {out}: this user cannot write there")


def check_models(*specs: str) -> None:
    """ModelError for a model that is no GGUF file, before any configuration starts
    (a preset is fetched here, where it is not yet)."""
    from shared.presets import ModelError, resolve_model

    for spec in dict.fromkeys(specs):
        path = resolve_model(spec)
        try:
            with path.open("rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise ModelError(f"model {spec!r}: cannot read {path} ({exc.strerror or exc})") \
                from None
        if magic != GGUF_MAGIC:
            raise ModelError(f"model {spec!r} is not a GGUF file")
