"""The benchmark's prompts (bench/prompts.json, shipped with the package)."""

from __future__ import annotations

import json
from importlib import resources


def load() -> list[dict]:
    """Every prompt: {"kind": "code" | "explain" | "edit", "text": ...}, in file order."""
    return json.loads(resources.files("bench").joinpath("prompts.json").read_text("utf-8"))


def spread(prompts: list[dict], n: int) -> list[dict]:
    """`n` prompts taken from each kind in turn (code, explain, edit, code, ...), so that a
    small sample still holds every kind."""
    kinds: dict[str, list[dict]] = {}
    for p in prompts:
        kinds.setdefault(p.get("kind", ""), []).append(p)
    rounds = max(map(len, kinds.values()), default=0)
    order = [group[i] for i in range(rounds) for group in kinds.values() if i < len(group)]
    return order[:n]
