"""Real-model tier for structured output: SmolLM2-135M in real lead and back processes.
Every json_schema reply parses and validates against its schema, with a back drafting
under the grammar and without one; llama.cpp's grammar machinery seen through
shared/llama/model.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import jsonschema
import numpy as np
import pytest

from bench.procs import Back, Lead, metric, wait_until
from shared.grammar.constraint import best
from shared.grammar.schema_keywords import unenforced
from shared.llama.model import LlamaModel, load_model
from shared.wire.httpclient import sse_events
from tests.drafting import FORCED, roles

pytestmark = pytest.mark.real

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                      "age": {"type": "integer"}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                      "temperature": {"type": "number"},
                                      "sunny": {"type": "boolean"}},
     "required": ["city", "temperature", "sunny"]},
    {"type": "object", "properties": {"status": {"enum": ["ok", "error", "pending"]},
                                      "code": {"type": "integer"}},
     "required": ["status", "code"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {
        "type": "array", "items": {"type": "string", "maxLength": 12},
        "minItems": 1, "maxItems": 3}}, "required": ["items"]},
    {"type": "object", "properties": {
        "point": {"type": "object", "properties": {"x": {"type": "integer"},
                                                   "y": {"type": "integer"}},
                  "required": ["x", "y"]},
        "label": {"type": "string", "pattern": "^[a-z]{1,10}$"}},
     "required": ["point", "label"]},
]
PROMPTS = [
    "Describe a person as JSON.",
    "What is the weather like in Paris today? Answer in JSON.",
    "Report the status of the last build.",
    "List a few things to pack for a trip.",
    "Give a point on a map with a short label.",
]
CASES = [(SCHEMAS[i % 5], PROMPTS[(i + i // 5) % 5]) for i in range(20)]  # 20 pairings


@pytest.fixture(scope="module")
def lead() -> Iterator[Lead]:
    """Drafts verified at a fixed length, lead on a CPU of its own (tests/drafting.py)."""
    proc = Lead("smollm2-135m", *FORCED, cpus=roles()[0])
    yield proc
    proc.stop()


def ask(url: str, schema: dict, prompt: str, stream: bool = False) -> tuple[str, dict]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 160,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "reply", "schema": schema, "strict": True}}}
    if not stream:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        reply = r.json()
        return reply["choices"][0]["message"]["content"], reply
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True},
                      timeout=120) as r:
        events = list(sse_events(r))
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    return text, events[-1]


def check_all(url: str, asks: int = 1) -> tuple[int, int]:
    """Every case's reply, asked `asks` times in a row, validates against its schema and
    ended with an EOS; the draft tokens verified and accepted over all of them."""
    drafted = accepted = 0
    for schema, prompt in CASES:
        for _ in range(asks):
            text, reply = ask(url, schema, prompt)
            jsonschema.validate(json.loads(text), schema)
            assert reply["choices"][0]["finish_reason"] == "stop", text
            drafted += reply["usage"]["drafted_tokens"]
            accepted += reply["usage"]["accepted_tokens"]
    return drafted, accepted


def test_json_schema_replies_validate_without_a_back(lead: Lead) -> None:
    check_all(lead.url)  # (lead's own drafts may be verified: no back's are)


def test_json_schema_replies_validate_with_a_back_drafting_under_the_grammar(
        lead: Lead) -> None:
    back = Back(lead, cpus=roles()[1])
    try:
        back.wait_attached()
        wait_until(lambda: metric(lead, "duo_backs_active") >= 1, 30, "back active")
        # SmolLM2 drafting for itself only keeps pace with lead on a fresh reply, so lead
        # seldom verifies its drafts; asked again, the back holds the reply in its KV
        # cache and posts it far ahead, and lead verifies it under the grammar
        drafted, accepted = check_all(lead.url, asks=2)
        text, last = ask(lead.url, SCHEMAS[0], PROMPTS[0], stream=True)
        jsonschema.validate(json.loads(text), SCHEMAS[0])
        assert last["choices"][0]["finish_reason"] == "stop"
    finally:
        back.stop()
    # SmolLM2 drafting for itself under the same grammar agrees almost always
    assert drafted >= 20 and accepted > drafted / 2, (drafted, accepted)


def test_json_object_and_a_gbnf_grammar_are_served(lead: Lead) -> None:
    chat = f"{lead.url}/v1/chat/completions"
    r = httpx.post(chat, timeout=120, json={
        "messages": [{"role": "user", "content": "Describe a cat."}], "max_tokens": 120,
        "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), dict)
    r = httpx.post(f"{lead.url}/v1/completions", timeout=120, json={
        "prompt": "Is the sky blue? Answer:", "max_tokens": 8,
        "grammar": 'root ::= " yes" | " no"'})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in (" yes", " no"), r.text


@pytest.mark.parametrize("value", ['a"b', "back\\slash", "\U0001F4A5", "\u0000", "a\u0001b",
                                   "line\nbreak"])
def test_a_value_json_escapes_is_served_as_json_in_enums_consts_and_names(
        lead: Lead, value: str) -> None:
    # a quote, a backslash, a character past the BMP or a control character is written
    # with a JSON escape, which the grammar must match as text, not read as its own
    schema = {"type": "object", "properties": {value: {"enum": [value, "other"]},
                                               "k": {"const": value}},
              "required": [value, "k"], "additionalProperties": False}
    text, reply = ask(lead.url, schema, "Give the JSON.")
    assert json.loads(text) == {value: json.loads(text)[value], "k": value}, text
    jsonschema.validate(json.loads(text), schema)
    assert reply["choices"][0]["finish_reason"] == "stop", text


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"c": {"allOf": [{"$ref": "#/$defs/Color"}],
                                            "description": "a colour"}},
     "required": ["c"], "$defs": {"Color": {"enum": ["red", "green"]}}},  # pydantic's wrapper
    {"allOf": [{"properties": {"a": {"type": "integer"}}},
               {"$ref": "#/$defs/B"}], "$defs": {"B": {"type": "object", "properties": {
                   "b": {"type": "string", "maxLength": 8}}, "required": ["b"]}}},
])
def test_an_allof_reply_validates_against_every_member(lead: Lead, schema: dict) -> None:
    # the converter merged allOf as objects only: the wrapped enum came out as { }
    text, reply = ask(lead.url, schema, "Give the JSON.")
    jsonschema.validate(json.loads(text), schema)
    assert reply["choices"][0]["finish_reason"] == "stop", text


@pytest.mark.parametrize("pattern", [r"^\d{3}-\d{2}$", r"^\w{1,8}\.com$", r"^[a-z]{1,6}\s\S{1,6}$",
                                     r'^"[a-z]{1,5}"\\$', r"^a\nb\.?$", r"^[^a-z]{2}$"])
def test_a_patterns_reply_is_json_whose_string_matches_it(lead: Lead, pattern: str) -> None:
    # escapes as schemas write them (\d, \w, \.), and characters JSON writes escaped
    text, reply = ask(lead.url, {"type": "string", "pattern": pattern}, "Give the value.")
    assert re.fullmatch(pattern, json.loads(text)), text
    assert reply["choices"][0]["finish_reason"] == "stop", text


@pytest.mark.parametrize(("fields", "param", "says"), [
    ({"grammar": "root ::= ("}, "grammar", "expecting ')'"),
    ({"grammar": 'start ::= "a"'}, "grammar", "root"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "no such type"}}}}, "response_format", "schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integer", "minimum": 3}}}}, "response_format",
     "schema.minimum"),
])
def test_a_bad_grammar_or_schema_is_a_400_saying_why(lead: Lead, fields: dict, param: str,
                                                     says: str) -> None:
    r = httpx.post(f"{lead.url}/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert lead.alive()


def test_a_schema_the_converter_refuses_is_named_as_each_api_wrote_it(lead: Lead) -> None:
    bad = {"type": "object", "properties": {"a": {"type": "no such type"}}}
    r = httpx.post(f"{lead.url}/v1/messages", timeout=30, json={
        "model": "duo", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}},
                  {"name": "g", "input_schema": bad}], "tool_choice": {"type": "any"}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("tools[1].input_schema: "), r.text
    r = httpx.post(f"{lead.url}/v1/responses", timeout=30, json={
        "input": "x", "max_output_tokens": 4,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": bad}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text.format", r.text
    assert lead.alive()


# --- shared/llama/model.py's grammar states on the model itself ---

@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return load_model("smollm2-135m", threads=1, n_ctx=512)


def test_llama_grammar_states_mask_advance_and_never_abort(model: LlamaModel) -> None:
    state = model.constraint(model.schema_grammar({"type": "boolean"}))
    row = np.zeros(model.n_vocab, dtype=np.float32)
    allowed = np.isfinite(state.mask(row))
    texts = {model.token_bytes(int(t)) for t in np.nonzero(allowed)[0]}
    assert texts and all(b"true".startswith(t) or b"false".startswith(t) for t in texts)
    (t,) = model.tokenize("true", add_bos=False)[:1]
    after = state.advanced(model.tokenize("true", add_bos=False))
    assert state.allows(t) and not after.allows(t)  # the original untouched
    eos = min(model.eos_token_ids)
    assert after.allows(eos) and not state.allows(eos)
    assert best(row, after) in model.eos_token_ids  # complete: only the end is left
    with pytest.raises(ValueError):
        state.advanced(model.tokenize("nope", add_bos=False))  # refused, not an abort
    assert state.advanced([eos]).allows(t)  # an end is taken as is


def test_unenforced_keywords_are_found_where_they_hide() -> None:
    assert unenforced(SCHEMAS[4]) is None
    assert unenforced({"properties": {"o": {"properties": {"x": {}}, "required": ["y"]}}}) \
        == "schema.properties.o.required (naming a property not in properties)"
    assert unenforced({"properties": {"x": {}}, "required": ["x"]}) is None
    assert unenforced({"properties": {}, "required": ["x"], "allOf": [
        {"properties": {"x": {}}}]}) == "schema.allOf (beside properties)"  # not merged
    assert unenforced({"properties": {"minimum": {"type": "integer"}}}) is None
    assert unenforced({"items": {"anyOf": [{"type": "string"}, {"uniqueItems": True}]}}) == \
        "schema.items.anyOf[1].uniqueItems"
