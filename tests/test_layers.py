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


def cycles(folders: tuple[str, ...], root: Path = ROOT) -> list[list[str]]:
    """Import cycles among the modules of `folders` (TYPE_CHECKING imports too)."""
    modules = {str(p.relative_to(root).with_suffix("")).replace("/", "."): p
               for folder in folders for p in (root / folder).glob("*.py")}
    graph = {m: {n for n in imported(p) if n in modules and n != m} for m, p in modules.items()}
    found: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        for n in sorted(graph[module]):
            if n == path[0]:
                found.append(path)
            elif n not in path and n > path[0]:  # each cycle once, from its least module
                visit(n, [*path, n])
    for module in sorted(graph):
        visit(module, [module])
    return found


def test_no_import_cycle_in_shared_or_the_core() -> None:
    assert cycles(("shared",)) == []
    assert cycles(CORE) == []


def test_the_cycle_scan_finds_a_cycle(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import x\n")
    (tmp_path / "pkg" / "b.py").write_text("if True:\n    from pkg.a import y\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    assert cycles(("pkg",), tmp_path) == [["pkg.a", "pkg.b"]]
