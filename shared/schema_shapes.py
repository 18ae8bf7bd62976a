"""Schemas llama-cpp-python's converter would turn into a grammar for the wrong values
(pure: lead and the fakes share it): refused with the keyword's path before it sees them.

- An empty `enum`, `anyOf`, `oneOf` or `type` list admits no value; the converter wrote a
  grammar that does not parse, or failed on a missing key.
- `allOf` is merged as objects only: the converter takes each member's `properties` and
  nothing else, so `allOf: [{"type": "string"}, {"type": "integer"}]` came out as `{ }`,
  and a member that is a `$ref` to an enum as an empty object. One member beside
  annotations (pydantic's wrapper of a `$ref` with a description) is that member
  (shared/llm_grammar.py); several must each be an object schema with properties.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.schema_bounds import referred, subschemas
from shared.schema_keywords import ANNOTATIONS

Resolve = Callable[[Any], Any]  # a local $ref's target (None where it has none)
_LISTS = ("enum", "anyOf", "oneOf", "type")
_WRAPPER = frozenset({"allOf", "$defs", "definitions"})  # definitions: found by their $refs
_OBJECT_MEMBER = frozenset({"type", "properties", "required", "$ref"}) | ANNOTATIONS


def check_shapes(schema: Any, where: str = "schema") -> None:
    """check_shape over `schema` and every schema inside it or referred to from it."""
    def resolve(ref: Any) -> Any:
        found = referred(schema, where, ref)
        return found[0][1] if found else None
    for path, node in subschemas(schema, where):
        check_shape(node, path, resolve)


def check_shape(node: dict[str, Any], path: str, resolve: Resolve) -> None:
    """ValueError naming the keyword where `node` would convert to the wrong values."""
    for key in _LISTS:
        if key in node and node[key] == []:
            raise ValueError(f"{path}.{key}: an empty list admits no value")
    for key in ("enum", "anyOf", "oneOf", "allOf"):
        if key in node and not isinstance(node[key], list):
            raise ValueError(f"{path}.{key}: must be a list")
    members = node.get("allOf")
    if isinstance(members, list) and wrapped(node) is None:
        for i, member in enumerate(members):
            if not _object_member(member, resolve):
                raise ValueError(f"{path}.allOf[{i}]: allOf merges object schemas with "
                                 "properties here (or holds one schema beside annotations)")


def wrapped(node: dict[str, Any]) -> Any:
    """The one member of an allOf beside nothing but annotations and definitions (None
    where not so)."""
    members = node.get("allOf")
    if not isinstance(members, list) or len(members) != 1:
        return None
    return members[0] if set(node) - _WRAPPER <= ANNOTATIONS else None


def _object_member(member: Any, resolve: Resolve) -> bool:
    if isinstance(member, dict) and set(member) == {"$ref"}:
        member = resolve(member["$ref"])
    return isinstance(member, dict) and set(member) <= _OBJECT_MEMBER and \
        "$ref" not in member and member.get("type", "object") == "object" and \
        isinstance(member.get("properties"), dict)
