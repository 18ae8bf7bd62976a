"""A schema's pattern as the grammar converter takes it: escapes it could not pass on, and
characters a JSON string cannot hold raw (pure; the real tier: tests/test_grammar_real.py)."""

from __future__ import annotations

import pytest

from shared.grammar.schema_pattern import for_grammar


@pytest.mark.parametrize(("pattern", "written"), [
    (r"^\d{3}-\d{2}$", "^[0-9]{3}-[0-9]{2}$"),
    (r"^\w+\.com$", r"^[0-9A-Za-z_]+[\x2E]com$"),
    (r"^[\w.-]+$", "^[0-9A-Za-z_.-]+$"),  # in a class, the class's members
    (r"^a\/b$", r"^a[\x2F]b$"),
    (r"^\s$", "^[ ]$"),  # a tab or newline would need JSON's escapes
    (r"^\S$", r'^[^ "\\\x00-\x1F]$'),
    (r"^a.c$", r'^a[^"\\\x00-\x1F]c$'),  # any character a JSON string holds raw
    (r"^[^ab]$", r'^[^ab"\\\x00-\x1F]$'),
    (r'^"q"\\$', r"^[\x5C][\x22]q[\x5C][\x22][\x5C][\x5C]$"),  # as JSON writes them
    (r"^a\nb$", r"^a[\x5C]nb$"),
    (r"^[a-z]{2,3}\u00e9$", r"^[a-z]{2,3}\u00e9$"),
])
def test_escapes_become_what_the_grammar_reads_and_json_holds(pattern: str,
                                                               written: str) -> None:
    assert for_grammar(pattern) == written


@pytest.mark.parametrize(("pattern", "says"), [
    ("^(a$", "not a valid regular expression"),
    ("^a{2,1}$", "not a valid regular expression"),
    ("^[z-a]$", "bad character range"),
    (r"^\bx$", "word boundary"),
    (r"^[\D]$", "inside a [class]"),
    (r"^[\n]$", "in a [class]"),
])
def test_a_pattern_no_grammar_can_hold_is_refused_saying_why(pattern: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("[", r"\[")):
        for_grammar(pattern)
