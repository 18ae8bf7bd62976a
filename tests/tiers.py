"""The test tiers: `unit` (one process, fakes; the default), `process` (starts real
processes: servers, the chat REPL in a terminal, network namespaces; no real model) and
`real` (real GGUF models). A test file names its tier with `pytestmark`; an unmarked test
is `unit`. `make test-fast` runs the unit tier."""

from __future__ import annotations

import pytest

TIERS = {
    "unit": "one process, fake models (the default)",
    "process": "starts real processes (servers, the chat REPL, namespaces); no real model",
    "real": "uses a real GGUF model (SmolLM2-135M or the default pair) and real processes",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marked = [name for name in TIERS if item.get_closest_marker(name)]
        if len(marked) > 1:
            raise pytest.UsageError(f"{item.nodeid}: in more than one tier: {marked}")
        if not marked:
            item.add_marker(pytest.mark.unit)
