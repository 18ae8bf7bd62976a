"""Lead verifies chains only: its plan, verifier and pricing hold no tree code (a back's
branches are still used, as its next draft after a rejection: tests/test_branches.py).
Read from the source: any identifier, attribute or argument naming a tree fails it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("lead/decode/plan.py", "lead/decode/verify.py", "lead/decode/decoder.py",
           *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "lead/policy").glob("*.py")))


def tree_names(path: Path) -> set[str]:
    """The identifiers in `path` (names, attributes, arguments, definitions) that say tree."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return {n for n in names if "tree" in n.lower() or n in {"forks", "roots", "root_at"}}


def test_lead_s_plan_verifier_and_pricing_have_no_tree_code() -> None:
    found = {f"{name}: {sorted(hits)}" for name in SOURCES
             if (hits := tree_names(ROOT / name))}
    assert not found, sorted(found)
    assert not (ROOT / "lead/policy/branchcost.py").exists()


def test_the_scan_sees_a_tree_in_an_argument_and_an_attribute(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f(tree_width):\n    return cost.verify_tree(x)\n")
    assert tree_names(source) == {"tree_width", "verify_tree"}
