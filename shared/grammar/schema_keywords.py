"""Which JSON Schema keywords a reply is held to: a schema using any other is refused."""

from __future__ import annotations

from typing import Any

# What llama-cpp-python's JSON schema converter (shared/llama/model.py) enforces, and what changes
# no reply; a schema with any other keyword (minimum, uniqueItems, not, ...) could be met
# by a reply that fails it.
ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "definitions", "pattern", "minLength", "maxLength", "format"})
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id",
                          "$comment", "deprecated", "readOnly", "writeOnly"})
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")


def unenforced(schema: Any, where: str = "schema") -> str | None:
    """The first keyword of `schema` (or of a schema inside it) the converter would
    ignore, as a path; None if it enforces them all."""
    if not isinstance(schema, dict):
        return None
    for key in schema:
        if key not in ENFORCED and key not in ANNOTATIONS:
            return f"{where}.{key}"
    if _required_not_listed(schema):  # the converter writes only listed properties
        return f"{where}.required (naming a property not in properties)"
    if "allOf" in schema and (beside := _allof_passed_over(schema)):
        return f"{where}.allOf (beside {beside})"
    maps = [(k, m) for k in _SUBSCHEMA_MAPS if isinstance(m := schema.get(k), dict)]
    lists = [(k, v) for k in _SUBSCHEMA_LISTS if isinstance(v := schema.get(k), list)]
    subschemas = [(f"{where}.{k}.{name}", sub) for k, m in maps for name, sub in m.items()]
    subschemas += [(f"{where}.{k}[{i}]", sub) for k, v in lists for i, sub in enumerate(v)]
    subschemas += [(f"{where}.{k}", schema[k]) for k in ("items", "additionalProperties")
                   if k in schema]
    return next((found for path, sub in subschemas if (found := unenforced(sub, path))), None)


# What the converter takes before an allOf, which it then leaves unmerged
_BEFORE_ALLOF = ("$ref", "oneOf", "anyOf", "const", "enum", "properties")


def _allof_passed_over(schema: dict[str, Any]) -> str | None:
    """The keyword the converter takes instead of `schema`'s allOf, which it ignores then."""
    taken = next((k for k in _BEFORE_ALLOF if k in schema), None)
    if taken is None and schema.get("additionalProperties", True) is not True:
        taken = "additionalProperties"
    if taken is None and schema.get("type", "object") != "object":
        taken = "type"
    return taken


def _required_not_listed(schema: dict[str, Any]) -> bool:
    """Whether `required` names a property its `properties` do not list (where no allOf
    could list it)."""
    required, properties = schema.get("required"), schema.get("properties")
    return isinstance(required, list) and isinstance(properties, dict) and \
        "allOf" not in schema and any(name not in properties for name in required)
