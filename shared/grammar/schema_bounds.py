"""Bounds on JSON schemas, checked before llama-cpp-python's converter sees them (pure:
lead and the fakes share it). Its output is then checked as any grammar is
(shared/grammar/bounds.py); these name the schema's keyword instead, and keep the
converter itself (recursive Python, on lead's event loop) to a bounded input.

A string's min/maxLength and an array's min/maxItems are written x{m,n} (shared/
llama/grammar.py), which llama.cpp unrolls up to MAX_REPEAT; a pattern's {m,n} the converter
writes as n - m nested groups, held well under MAX_NESTING. OpenAI's structured outputs
allow 10 levels of nesting, 5,000 properties and 1,000 enum values; a 128 KiB schema of
1,000 properties converts to a grammar of 155 KiB, in 0.09 s.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from shared.grammar.bounds import MAX_REPEAT

MAX_SCHEMA_BYTES = 128 * 1024  # its grammar is about twice as large: MAX_GBNF_BYTES
MAX_SCHEMA_DEPTH = 64  # objects and arrays in objects and arrays
MAX_PATTERN_REPEAT = 128  # a pattern's {m,n} becomes n - m nested groups in the GBNF
MAX_OPTIONAL = 500  # properties not required, per object: the converter recurses once per
# such property, and the grammar has about twice as many alternatives open after one

_SCHEMA_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")
_SCHEMA_PAIRS = (("minLength", "maxLength"), ("minItems", "maxItems"))
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_PATTERN_COUNT = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")
_PATTERN_LITERALS = re.compile(r"\\.|\[(?:[^\]\\]|\\.)*\]", re.DOTALL)  # escapes, classes


def check_schema(schema: Any, where: str = "schema") -> None:
    """ValueError naming the keyword (as a path from `where`) and the limit where a JSON
    schema is over a bound; run before llama-cpp-python's converter sees it."""
    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"{where}: objects and arrays nest {depth} deep, over the limit "
                         f"of {MAX_SCHEMA_DEPTH}")
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if size > MAX_SCHEMA_BYTES:
        raise ValueError(f"{where}: {size} bytes of JSON, over the limit of "
                         f"{MAX_SCHEMA_BYTES}")
    for path, node in subschemas(schema, where):
        _check_keywords(node, path)


def _depth(value: Any) -> int:
    """How deep objects and arrays nest (without recursion: nothing bounds it yet)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else \
            value if isinstance(value, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack += [(child, depth + 1) for child in children]
    return deepest


def subschemas(root: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """Every schema the converter visits, with its path: `root`, the schemas inside it,
    and those a local $ref points to (wherever they sit)."""
    found: list[tuple[str, dict[str, Any]]] = []
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(where, root)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        found.append((path, node))
        stack += _inside(path, node) + referred(root, where, node.get("$ref"))
    return found


def _inside(path: str, node: dict[str, Any]) -> list[tuple[str, Any]]:
    maps = [(k, m) for k in _SCHEMA_MAPS if isinstance(m := node.get(k), dict)]
    lists = [(k, v) for k in _SCHEMA_LISTS if isinstance(v := node.get(k), list)]
    inside = [(f"{path}.{k}.{name}", sub) for k, m in maps for name, sub in m.items()]
    inside += [(f"{path}.{k}[{i}]", sub) for k, v in lists for i, sub in enumerate(v)]
    return inside + [(f"{path}.{k}", node[k]) for k in ("items", "additionalProperties")
                     if isinstance(node.get(k), dict)]


def referred(root: Any, where: str, ref: Any) -> list[tuple[str, Any]]:
    """The schema a local "#/a/b" $ref points to, found as the converter finds it."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return []
    target, steps = root, ref.split("#")[-1].split("/")[1:]
    for step in steps:
        if not isinstance(target, dict) or step not in target:
            return []
        target = target[step]
    return [(".".join([where, *steps]), target)]


def _check_keywords(node: dict[str, Any], path: str) -> None:
    """The numbers the converter writes out as repetitions."""
    for key in (key for key in _SCHEMA_COUNTS if key in node):
        value = node[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{path}.{key}: must be a whole number, 0 or more")
        if value > MAX_REPEAT:
            raise ValueError(f"{path}.{key}: {value} is over the limit of {MAX_REPEAT}")
    for low, high in _SCHEMA_PAIRS:
        if low in node and high in node and node[low] > node[high]:
            raise ValueError(f"{path}.{low}: {node[low]} is over {high} {node[high]}")
    if isinstance(pattern := node.get("pattern"), str):
        _check_pattern(pattern, f"{path}.pattern")
    if isinstance(properties := node.get("properties"), dict):
        _check_optional(properties, node.get("required"), f"{path}.properties")


def _check_optional(properties: dict[str, Any], required: Any, path: str) -> None:
    named = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    optional = len(set(properties) - named)
    if optional > MAX_OPTIONAL:
        raise ValueError(f"{path}: {optional} are optional (not in required), over the limit "
                         f"of {MAX_OPTIONAL}")


def _check_pattern(pattern: str, path: str) -> None:
    """A pattern's {m,n} becomes m copies and n - m nested groups."""
    for match in _PATTERN_COUNT.finditer(_PATTERN_LITERALS.sub("", pattern)):
        for bound in (int(b) for b in match.groups() if b):
            if bound > MAX_PATTERN_REPEAT:
                raise ValueError(f"{path}: the repetition {match.group()}: {bound} is over "
                                 f"the limit of {MAX_PATTERN_REPEAT}")


def within_bounds(schema: Any) -> Any:
    """A schema that is only a hint (a tool's parameters) as a grammar may hold it: each
    count, pair and pattern over a bound left out, so the reply may be looser than asked
    but the request is never refused for it; any object where the whole is still over one
    (too deep, too large)."""
    relaxed = copy.deepcopy(schema)
    for _, node in subschemas(relaxed, "schema"):
        _relax(node)
    try:
        check_schema(relaxed)
    except ValueError:
        return {"type": "object"}
    return relaxed


def _relax(node: dict[str, Any]) -> None:
    for key in [k for k in _SCHEMA_COUNTS if k in node]:
        value = node[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_REPEAT:
            del node[key]
    for low, high in _SCHEMA_PAIRS:
        if low in node and high in node and node[low] > node[high]:
            del node[low], node[high]
    if isinstance(pattern := node.get("pattern"), str):
        try:
            _check_pattern(pattern, "pattern")
        except ValueError:
            del node["pattern"]
