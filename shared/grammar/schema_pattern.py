"""A JSON schema's `pattern` in the terms llama-cpp-python's converter takes (pure).

The converter copies a regex escape into the grammar as it stands, and GBNF knows only a
few (\\n, \\t, \\xHH, ...): `^\\d{4}-\\d{2}$` or `^\\w+\\.com$`, as schemas commonly write
them, were refused as "unknown escape". It also writes the pattern's characters raw
between the string's quotes, where a quote, a backslash or a control character breaks
the JSON. Here the class escapes become the classes they name, an escaped punctuation
mark a one-character class, a quote, backslash or \\n its JSON escape, and `.` and negated
classes leave out what a JSON string cannot hold raw; `\\s` is a space (a tab or newline
would need JSON's escapes). A pattern that is no regular expression, or uses an escape no
grammar can hold (a word boundary), is a ValueError.
"""

from __future__ import annotations

import re

RAW_UNSAFE = '"\\\\\\x00-\\x1F'  # (GBNF) what a JSON string cannot hold unescaped
CLASSES = {"d": "0-9", "w": "0-9A-Za-z_", "s": " "}
JSON_ESCAPED = {'"': "[\\x5C][\\x22]", "\\": "[\\x5C][\\x5C]"}  # \" and \\ in the JSON
CONTROLS = {c: f"[\\x5C]{c}" for c in "nrtf"}  # \n in a pattern: \n in the JSON
KEPT = set("[]xu")  # escapes GBNF reads as the regex does
UNSERVED = {"b": "a word boundary", "B": "a non-boundary"}


def for_grammar(pattern: str) -> str:
    """`pattern` with its escapes rewritten as the converter can pass them to GBNF."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    out: list[str] = []
    i, opened = 0, ""  # the class being read: "[" or "[^" ("": none)
    while i < len(pattern):
        c, step = pattern[i], 1
        if c == "\\" and i + 1 < len(pattern):
            c, step = _escape(pattern[i + 1], bool(opened)), 2
        elif c == "[" and not opened:
            c = opened = "[^" if pattern[i + 1:i + 2] == "^" else "["
            step = len(c)
        elif c == "]" and opened:
            c = f"{RAW_UNSAFE}]" if opened == "[^" else c
            opened = ""
        elif not opened:
            c = f"[^{RAW_UNSAFE}]" if c == "." else JSON_ESCAPED.get(c, c)
        out.append(c)
        i += step
    return "".join(out)


def _escape(c: str, in_class: bool) -> str:
    """What `\\c` becomes inside a [class] or out of one."""
    if c in UNSERVED:
        raise ValueError(f"\\{c} ({UNSERVED[c]}) cannot be enforced by a grammar")
    if c.lower() in CLASSES:
        chars = CLASSES[c.lower()]
        if c.islower():
            return chars if in_class else f"[{chars}]"
        if in_class:
            raise ValueError(f"\\{c} inside a [class] is not served")
        return f"[^{chars}{RAW_UNSAFE}]"
    if (c in CONTROLS or c in JSON_ESCAPED) and not in_class:
        return CONTROLS.get(c) or JSON_ESCAPED[c]
    if c in CONTROLS or c in JSON_ESCAPED or c == "v":
        where = " in a [class]" if in_class else ""
        raise ValueError(f"\\{c}{where} is not served (a JSON string holds it escaped)")
    if c in KEPT or c.isalnum():
        return f"\\{c}"  # GBNF's own, or one it refuses with its own message
    return f"\\x{ord(c):02X}" if in_class else f"[\\x{ord(c):02X}]"
