"""Schemas the converter would turn into a grammar for the wrong values are refused with
the keyword's path (shared/grammar/schema_shapes.py): empty lists, allOf that is not objects'
properties merged; an allOf the converter passes over is unenforced (strict refuses it)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.server.app import create_app
from shared.grammar.schema_keywords import unenforced
from shared.grammar.schema_shapes import check_shapes, wrapped
from tests.conftest import make_settings

OBJ_A = {"type": "object", "properties": {"a": {"type": "integer"}}}
OBJ_B = {"properties": {"b": {"type": "string"}}, "required": ["b"], "title": "B"}


@pytest.mark.parametrize(("schema", "says"), [
    ({"enum": []}, "schema.enum: an empty list admits no value"),
    ({"properties": {"x": {"anyOf": []}}}, "schema.properties.x.anyOf: an empty list"),
    ({"oneOf": []}, "schema.oneOf: an empty list"),
    ({"type": []}, "schema.type: an empty list"),
    ({"enum": "abc"}, "schema.enum: must be a list"),
    ({"allOf": {"type": "string"}}, "schema.allOf: must be a list"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "schema.allOf[0]: allOf merges"),
    ({"allOf": [OBJ_A, {"$ref": "#/$defs/E"}], "$defs": {"E": {"enum": [1]}}},
     "schema.allOf[1]: allOf merges"),
    ({"allOf": [OBJ_A, {"anyOf": [OBJ_B, {"type": "string"}]}]}, "schema.allOf[1]"),
    ({"allOf": [OBJ_A, {"$ref": "#/$defs/B", "type": "object"}], "$defs": {"B": OBJ_B}},
     "schema.allOf[1]"),  # a $ref beside more than annotations
    ({"allOf": [{"$ref": "#/$defs/E"}], "type": "object", "$defs": {"E": {"enum": [1]}}},
     "schema.allOf[0]"),  # one member, but beside more than annotations
    ({"$defs": {"D": {"enum": []}}, "$ref": "#/$defs/D"}, "schema.$defs.D.enum"),
])
def test_a_schema_converted_to_the_wrong_values_is_refused_naming_its_keyword(
        schema: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=f"^{said(says)}"):
        check_shapes(schema)


def said(text: str) -> str:
    return text.replace("[", r"\[").replace("]", r"\]").replace("$", r"\$").replace(".", r"\.")


@pytest.mark.parametrize("schema", [
    {"enum": [1, "a"]}, {"type": ["string", "null"]},
    {"allOf": [OBJ_A, OBJ_B]},
    {"allOf": [OBJ_A, {"$ref": "#/$defs/B"}], "$defs": {"B": OBJ_B}},
    {"allOf": [{"$ref": "#/$defs/E"}], "description": "d", "$defs": {"E": {"enum": [1]}}},
    {"allOf": [{"type": "string"}], "title": "a wrapper of anything"},
    {"allOf": [OBJ_A, {**OBJ_B, "additionalProperties": False}]},  # merged as before
    {"allOf": [OBJ_A, {"anyOf": [OBJ_B, {"$ref": "#/$defs/C"}]}],  # optional properties
     "$defs": {"C": {"properties": {"c": {"type": "integer"}}}}},
    {"allOf": [OBJ_A, {"$ref": "#/$defs/B", "description": "b"}], "$defs": {"B": OBJ_B}},
    {"allOf": [OBJ_A, {"required": ["a"]}]},
    {"type": "object", "properties": {}, "$defs": {"Unused": {"enum": []}}},  # never converted
])
def test_a_schema_converted_to_its_own_values_passes(schema: dict[str, Any]) -> None:
    check_shapes(schema)


def test_one_member_beside_annotations_is_that_member() -> None:
    assert wrapped({"allOf": [OBJ_A], "description": "d", "default": {}}) == OBJ_A
    assert wrapped({"allOf": [OBJ_A], "type": "object"}) is None
    assert wrapped({"allOf": [OBJ_A, OBJ_B]}) is None


@pytest.mark.parametrize(("schema", "found"), [
    ({"properties": {"a": {}}, "allOf": [OBJ_B]}, "schema.allOf (beside properties)"),
    ({"enum": [1], "allOf": [OBJ_B]}, "schema.allOf (beside enum)"),
    ({"type": "string", "allOf": [OBJ_B]}, "schema.allOf (beside type)"),
    ({"additionalProperties": False, "allOf": [OBJ_B]},
     "schema.allOf (beside additionalProperties)"),
    ({"allOf": [OBJ_A, OBJ_B]}, None),
])
def test_an_allof_the_converter_passes_over_is_unenforced(schema: dict[str, Any],
                                                          found: str | None) -> None:
    assert unenforced(schema) == found


def test_a_request_with_an_empty_enum_is_a_400_saying_so() -> None:
    app = create_app(make_settings(calibrate=False, max_tokens=8), FakeModel())
    body = {"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"enum": []}}}}}}
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert "schema.properties.a.enum: an empty list admits no value" in \
        r.json()["error"]["message"], r.text
