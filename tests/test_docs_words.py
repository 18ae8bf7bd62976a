"""The docs are results and designs about the project: no entry headed by the work sitting
that wrote it, no word of which machines the work borrowed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
ORDINAL = (r"(first|second|third|fourth|fifth|[a-z]+teenth|[a-z]+tieth|twenty[a-z-]*"
           r"|\d+(st|nd|rd|th))")
BUILT = re.compile(
    rf"\b{ORDINAL}\s+(session|sitting)\b|\bwork sitting|\blent\b|can_start_another"
    r"|no device was|\bthis session\b",
    re.IGNORECASE)


def offending(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if BUILT.search(line)]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_no_doc_speaks_of_how_the_project_was_built() -> None:
    found = {str(p.relative_to(ROOT)): offending(p.read_text()) for p in pages()}
    assert {k: v for k, v in found.items() if v} == {}


@pytest.mark.parametrize("line", [
    "## The nineteenth session: trees", "No device was lent this time.",
    "measured in the 3rd sitting", "`can_start_another` was false"])
def test_the_check_sees_words_of_the_work(line: str) -> None:
    assert offending(line) == [line]


@pytest.mark.parametrize("line", [
    "a back sitting out hears only of starts", "Sitting out works.", "the session's state"])
def test_the_check_leaves_the_products_words(line: str) -> None:
    assert offending(line) == []
