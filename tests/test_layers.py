"""Lead's layers point one way: the decoding core (decode, drafts, policy) imports neither
the HTTP server nor the APIs; they import it. Read from the source, so a lazy import inside
a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ("lead/decode", "lead/drafts", "lead/policy")
ABOVE = ("lead.server", "lead.apis")


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_core_imports_nothing_above_it() -> None:
    wrong = {f"{path.relative_to(ROOT)}: {name}"
             for folder in CORE for path in (ROOT / folder).glob("*.py")
             for name in imported(path) if name.startswith(ABOVE)}
    assert not wrong, sorted(wrong)


def test_the_scan_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from lead.server.app import create_app\n")
    assert imported(source) == {"lead.server.app"}
