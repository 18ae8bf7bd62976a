"""One word per idea in the code: a probability is named as one (`p_accept`), never `odds`;
the tokens a draft is expected to get accepted are `expected_accepted`, never a `yield`
(Python's keyword keeps its own meaning). And every package folder is one pip installs."""

from __future__ import annotations

import io
import tokenize
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def names(source: str) -> set[str]:
    """The identifiers of `source` (strings and comments are prose)."""
    return {t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.NAME}


def misnamed(source: str) -> set[str]:
    return {n for n in names(source) if "odds" in n or ("yield" in n and n != "yield")}


def test_no_odds_or_yield_names_in_lead_or_back() -> None:
    found = {f"{p.relative_to(ROOT)}: {sorted(bad)}"
             for folder in ("lead", "back") for p in (ROOT / folder).rglob("*.py")
             if (bad := misnamed(p.read_text()))}
    assert not found, sorted(found)


def test_the_check_sees_a_name_not_the_keyword_or_prose() -> None:
    source = ('def f(odds):\n    """the odds"""\n    yield expected_yield(odds)  # yield\n')
    assert misnamed(source) == {"odds", "expected_yield"}


def test_every_package_folder_is_installed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    folders = {str(p.parent.relative_to(ROOT)).replace("/", ".")
               for top in ("lead", "back", "chat", "shared", "bench")
               for p in (ROOT / top).rglob("__init__.py")}
    assert folders <= listed, sorted(folders - listed)
