"""Lead's floors point one way: `__main__` → server → apis → decode → drafts → policy, each
importing only the floors below it (and itself); lead/backs stands beside server, which
(with `__main__`) alone imports it. shared/ is the ground both services stand on: it imports
nothing of theirs. Read from the source, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Lead's floors, top first; a floor may import those after it. backs stands beside server.
FLOORS = ("lead.__main__", "lead.server", "lead.apis", "lead.decode", "lead.drafts",
          "lead.policy")
BESIDE = {"lead.backs": "lead.server"}  # a floor: the one it stands beside
IMPORTS_BACKS = ("lead.__main__", "lead.server", "lead.backs")
CORE = ("lead/decode", "lead/drafts", "lead/policy")
PROJECT = ("lead", "back", "bench", "chat", "device", "scripts", "tests")  # above shared/


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules(folders: tuple[str, ...], root: Path = ROOT) -> dict[str, Path]:
    """Every module under `folders` (their subfolders too), by dotted name."""
    found = {}
    for folder in folders:
        for p in sorted((root / folder).rglob("*.py")):
            found[".".join(p.relative_to(root).with_suffix("").parts)] = p
    return found


def floor_of(module: str) -> str | None:
    """The floor `module` is on (lead.decode.engine: lead.decode); None outside lead's."""
    for floor in (*FLOORS, *BESIDE):
        if module == floor or module.startswith(floor + "."):
            return floor
    return None


def height(floor: str) -> int:
    return FLOORS.index(BESIDE.get(floor, floor))


def wrong_way(module: str, name: str) -> bool:
    """Whether `module` importing `name` goes up a floor, or into backs from elsewhere."""
    here, there = floor_of(module), floor_of(name)
    if here is None or there is None or here == there:
        return False
    if there in BESIDE:
        return here not in IMPORTS_BACKS
    return height(there) <= height(here)


def upward(root: Path = ROOT) -> set[str]:
    return {f"{m}: {name}" for m, p in modules(("lead",), root).items()
            for name in imported(p) if wrong_way(m, name)}


def test_no_floor_of_lead_imports_one_above_it() -> None:
    assert not upward(), sorted(upward())


def test_lead_s_drafting_and_decoding_import_nothing_of_the_backs() -> None:
    wrong = {f"{m}: {name}" for m, p in modules(CORE).items()
             for name in imported(p) if floor_of(name) == "lead.backs"}
    assert not wrong, sorted(wrong)


def test_shared_imports_nothing_of_the_project_above_it() -> None:
    wrong = {f"{m}: {name}" for m, p in modules(("shared",)).items()
             for name in imported(p) if name.split(".")[0] in PROJECT}
    assert not wrong, sorted(wrong)


def test_the_back_imports_nothing_of_lead() -> None:
    """The back speaks to lead over the wire alone (shared/wire/protocol.py)."""
    wrong = {f"{m}: {name}" for m, p in modules(("back",)).items()
             for name in imported(p) if name.split(".")[0] == "lead"}
    assert not wrong, sorted(wrong)


def test_the_floor_scan_sees_each_wrong_way(tmp_path: Path) -> None:
    def lead(files: dict[str, str]) -> set[str]:
        for name, text in files.items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
        return upward(tmp_path)

    assert lead({"lead/server/app.py": "from lead.apis.shapes import x\n",
                 "lead/apis/shapes.py": "from lead.decode.engine import Engine\n",
                 "lead/backs/feed.py": "from lead.drafts.board import Board\n",
                 "lead/server/routes.py": "from lead.backs.feed import BackFeed\n"}) == set()
    assert lead({"lead/apis/routes.py": "def f():\n    import lead.server.gate\n",
                 "lead/decode/engine.py": "from lead.backs.feed import BackFeed\n",
                 "lead/backs/routes.py": "from lead.server.errors import x\n",
                 "lead/policy/cost.py": "from lead.drafts import board\n"}) == {
        "lead.apis.routes: lead.server.gate", "lead.decode.engine: lead.backs.feed",
        "lead.backs.routes: lead.server.errors", "lead.policy.cost: lead.drafts"}


def test_the_scan_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from lead.server.app import create_app\n")
    assert imported(source) == {"lead.server.app"}


def cycles(folders: tuple[str, ...], root: Path = ROOT) -> list[list[str]]:
    """Import cycles among the modules of `folders` (TYPE_CHECKING imports too)."""
    found_modules = modules(folders, root)
    graph = {m: {n for n in imported(p) if n in found_modules and n != m}
             for m, p in found_modules.items()}
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
