"""Schemas llama-cpp-python's converter would turn into a grammar for the wrong values
(pure: lead and the fakes share it): refused with the keyword's path before it sees them.

- An empty `enum`, `anyOf`, `oneOf` or `type` list admits no value; the converter wrote a
  grammar that does not parse, or failed on a missing key.
- `allOf` is merged as objects only: the converter takes each member's `properties` and
  nothing else, so `allOf: [{"type": "string"}, {"type": "integer"}]` came out as `{ }`,
  and a member that is a `$ref` to an enum as an empty object. One member beside
  annotations (pydantic's wrapper of a `$ref` with a description) is that member
  (shared/llama/grammar.py); several must each be an object schema (or a $ref to one, or an
  anyOf of such: its properties optional), as the converter merges them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.grammar.schema_bounds import referred, subschemas
from shared.grammar.schema_keywords import ANNOTATIONS

Resolve = Callable[[Any], Any]  # a local $ref's target (None where it has none)
_LISTS = ("enum", "anyOf", "oneOf", "type")
_WRAPPER = frozenset({"allOf", "$defs", "definitions"})  # definitions: found by their $refs
_OBJECT_MEMBER = frozenset({"type", "properties", "required", "additionalProperties"})


def check_shapes(schema: Any, where: str = "schema") -> None:
    """check_shape over `schema`, every schema inside it and the definitions it refers to
    (one nobody refers to is never converted)."""
    def resolve(ref: Any) -> Any:
        found = referred(schema, where, ref)
        return found[0][1] if found else None
    used = {path for ref in _refs(schema) for path, _ in referred(schema, where, ref)}
    for path, node in subschemas(schema, where):
        if _converted(path, used):
            check_shape(node, path, resolve)


def _refs(value: Any) -> list[str]:
    """Every $ref string anywhere in `value`."""
    found, stack = [], [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found += [node["$ref"]] if isinstance(node.get("$ref"), str) else []
            stack += node.values()
        elif isinstance(node, list):
            stack += node
    return found


def _converted(path: str, used: set[str]) -> bool:
    if ".$defs." not in path and ".definitions." not in path:
        return True
    return any(path == u or path.startswith((u + ".", u + "[")) for u in used)


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
                raise ValueError(f"{path}.allOf[{i}]: allOf merges object schemas here (or "
                                 "holds one schema beside annotations)")


def wrapped(node: dict[str, Any]) -> Any:
    """The one member of an allOf beside nothing but annotations and definitions (None
    where not so)."""
    members = node.get("allOf")
    if not isinstance(members, list) or len(members) != 1:
        return None
    return members[0] if set(node) - _WRAPPER <= ANNOTATIONS else None


def _object_member(member: Any, resolve: Resolve, in_any_of: bool = False) -> bool:
    """Whether the converter merges `member` whole: an object schema (or a $ref to one)
    whose properties it takes, or an anyOf of such, each optional."""
    if not isinstance(member, dict):
        return False
    extra = set(member) - ANNOTATIONS
    if "anyOf" in member and not in_any_of:
        branches = member["anyOf"]
        return extra == {"anyOf"} and isinstance(branches, list) and \
            all(_object_member(b, resolve, True) for b in branches)
    if "$ref" in member:  # the converter takes the target, whatever sits beside the $ref
        if extra != {"$ref"}:
            return False
        member = resolve(member["$ref"])
        if not isinstance(member, dict):
            return False
        extra = set(member) - ANNOTATIONS
    return extra <= _OBJECT_MEMBER and member.get("type", "object") == "object" and \
        isinstance(member.get("properties", {}), dict)
