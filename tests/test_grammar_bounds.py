"""Bounds on grammars and JSON schemas (shared/grammar/bounds.py, shared/grammar/schema_bounds.py,
and the converter's lengths written x{m,n}, shared/llama/grammar.py): each refuses just over
its limit and lets its limit through, with a message naming the construct and the limit;
what sits in literals, classes and comments is not structure; lead answers a 400 naming
the field before any parser runs, and a back refuses a bomb and drafts blind. Real
processes and llama.cpp's own parser: tests/test_grammar_real.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from back.drafter import ModelDrafter
from bench.fake import FakeModel
from lead.apis.toolparse import HERMES
from lead.apis.tools import ToolChoice, call_grammar, check_tools
from lead.server.app import create_app
from shared.grammar import bounds as gb
from shared.grammar import schema_bounds as sb
from shared.wire.protocol import SamplingParams
from tests.conftest import chat_body, grow, make_settings


def refused(text: str) -> str:
    with pytest.raises(ValueError) as caught:
        gb.check_gbnf(text)
    return str(caught.value)


def nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def alternatives(n: int) -> str:
    return "root ::= " + " | ".join(f'"w{i}"' for i in range(n))


def chain(n: int) -> str:
    """n named rules, each beginning with the next."""
    return "root ::= r1\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(1, n - 1)) + \
        f'r{n - 1} ::= "a"\n'


# --- GBNF: each bound at its limit and just over ---

def test_size_is_bounded_in_bytes() -> None:
    root = 'root ::= "a"\n# '
    gb.check_gbnf(root + "x" * (gb.MAX_GBNF_BYTES - len(root)))
    assert f"over the limit of {gb.MAX_GBNF_BYTES}" in \
        refused(root + "x" * (gb.MAX_GBNF_BYTES - len(root) + 1))
    gb.check_gbnf(root + "é" * ((gb.MAX_GBNF_BYTES - len(root)) // 2))  # 2 bytes each
    assert "bytes" in refused(root + "é" * ((gb.MAX_GBNF_BYTES - len(root)) // 2 + 1))


def test_nesting_is_bounded() -> None:
    gb.check_gbnf(nested(gb.MAX_NESTING))
    assert refused(nested(gb.MAX_NESTING + 1)) == \
        f"the grammar: parentheses nest {gb.MAX_NESTING + 1} deep, over the limit of " \
        f"{gb.MAX_NESTING}"
    assert "nest 100000 deep" in refused(nested(100_000))


def test_parentheses_in_literals_classes_tokens_and_comments_are_not_nesting() -> None:
    many = "(" * 1000
    gb.check_gbnf(f'root ::= "{many}" [(] [\\](] "\\"{many}" <[40]> x # {many}\n'
                  f'x ::= [^)] "a{{5,3}}" # {{5,3}} ))))\n')
    assert "nest 257 deep" in refused(f'root ::= "{many}"  {nested(257)[9:]}')
    # an escaped quote does not end a literal; an escaped bracket does not end a class
    assert "nest" in refused('root ::= "\\"" ' + nested(300)[9:])
    assert "nest" in refused('root ::= [\\]] ' + nested(300)[9:])


def test_rules_groups_and_repetitions_are_bounded() -> None:
    gb.check_gbnf(chain(gb.MAX_RULES))
    assert refused(chain(gb.MAX_RULES + 1)) == \
        f"the grammar has {gb.MAX_RULES + 1} rules, groups and repetitions, over the limit " \
        f"of {gb.MAX_RULES}"
    groups = "root ::= " + ' '.join(['("a")'] * (gb.MAX_RULES - 1))
    gb.check_gbnf(groups)
    assert "rules, groups and repetitions" in refused(groups + ' "b"?')


@pytest.mark.parametrize(("ok", "bad"), [
    ("{0,2000}", "{0,2001}"), ("{2000}", "{2001}"), ("{2000,}", "{2001,}"),
    ("{1999,2000}", "{2001,2002}"),
])
def test_repetition_counts_are_bounded(ok: str, bad: str) -> None:
    gb.check_gbnf(f'root ::= "a"{ok}')
    assert refused(f'root ::= "a"{bad}') == \
        f"the grammar: the repetition {bad}: 2001 is over the limit of {gb.MAX_REPEAT}"


def test_a_minimum_over_the_maximum_is_refused_however_it_is_spaced() -> None:
    gb.check_gbnf('root ::= "a"{3,3} "b"{ 2 , 3 }')
    for text in ('root ::= "a"{5,3}', 'root ::= ("a"{ 5 # note\n , 3 })'):
        assert refused(text).endswith("the repetition {5,3} has its minimum over its maximum")


def test_symbols_written_out_by_repetitions_are_bounded() -> None:
    side = 1 << 10  # 1024 characters, 1024 times: exactly MAX_ELEMENTS
    assert side * side == gb.MAX_ELEMENTS
    gb.check_gbnf(f'root ::= "{"a" * side}"{{{side}}}')
    assert f"over the limit of {gb.MAX_ELEMENTS}" in \
        refused(f'root ::= "{"a" * (side + 1)}"{{{side}}}')


def test_alternatives_open_at_once_are_bounded_through_the_rules_that_begin_them() -> None:
    gb.check_gbnf(alternatives(gb.MAX_CHOICES))
    assert refused(alternatives(gb.MAX_CHOICES + 1)) == \
        f"the grammar opens more than {gb.MAX_CHOICES} alternatives at one point, over " \
        f"the limit of {gb.MAX_CHOICES} (llama.cpp checks every token against each)"
    # 64 alternatives each beginning with a rule of 64: 4096 open at the start
    word = alternatives(64).replace("root", "w", 1)
    product = word + "\nroot ::= " + " | ".join(f'w "{i}"' for i in range(64))
    assert "alternatives" in refused(product)
    after = word + "\nroot ::= " + " | ".join(f'"{i}" w' for i in range(64))
    gb.check_gbnf(after)  # w opens after a literal: 64 at a time
    # what can be empty opens what follows it too: 1025 optional items, all open at once
    assert "alternatives" in refused("root ::= " + '"a"? ' * gb.MAX_CHOICES + '"b"')


@pytest.mark.parametrize("text", [
    'root ::= ("a"?){0,2}', 'root ::= ("a"*){2}', 'root ::= (""){0,5}',
    'root ::= x{3}\nx ::= "a" | ""', 'root ::= x{0,9}\nx ::= y "b"?\ny ::= "c"?',
    'root ::= ("a"{0,10}){0,10}',
])
def test_repeating_something_that_can_be_empty_is_refused(text: str) -> None:
    assert "repeats something that can be empty" in refused(text)


@pytest.mark.parametrize("text", [
    'root ::= ("a"?)?', 'root ::= ("a"){0,100}', 'root ::= x{0,9}\nx ::= y "b"\ny ::= "c"?',
    'root ::= ("a" | "b"?){0,1}', 'root ::= ("a"{1,10}){2,5}',
])
def test_repeating_something_never_empty_is_let_through(text: str) -> None:
    gb.check_gbnf(text)


# --- JSON schemas ---

def schema_refused(schema: Any) -> str:
    with pytest.raises(ValueError) as caught:
        sb.check_schema(schema)
    return str(caught.value)


@pytest.mark.parametrize("keyword", ["maxLength", "minLength", "maxItems", "minItems"])
def test_schema_lengths_are_bounded(keyword: str) -> None:
    sb.check_schema({"properties": {"s": {keyword: gb.MAX_REPEAT}}})
    assert schema_refused({"properties": {"s": {keyword: gb.MAX_REPEAT + 1}}}) == \
        f"schema.properties.s.{keyword}: {gb.MAX_REPEAT + 1} is over the limit of " \
        f"{gb.MAX_REPEAT}"
    for bad in (-1, 2.5, "9", True):
        assert "must be a whole number" in schema_refused({keyword: bad})


def test_schema_minimums_over_maximums_are_refused() -> None:
    sb.check_schema({"minLength": 3, "maxLength": 3, "minItems": 0, "maxItems": 0})
    assert schema_refused({"items": {"minLength": 4, "maxLength": 3}}) == \
        "schema.items.minLength: 4 is over maxLength 3"


def test_schema_pattern_repetitions_are_bounded_outside_escapes_and_classes() -> None:
    limit = sb.MAX_PATTERN_REPEAT
    sb.check_schema({"pattern": f"^a{{0,{limit}}}b{{{limit}}}$"})
    assert schema_refused({"pattern": f"^a{{2,{limit + 1}}}$"}) == \
        f"schema.pattern: the repetition {{2,{limit + 1}}}: {limit + 1} is over the limit " \
        f"of {limit}"
    sb.check_schema({"pattern": "^\\{5000}[{5000}\\]]$"})


def test_optional_properties_are_bounded() -> None:
    names = [f"p{i}" for i in range(sb.MAX_OPTIONAL + 1)]
    properties = {name: {} for name in names}
    sb.check_schema({"properties": properties, "required": names[:1]})
    assert schema_refused({"items": {"properties": properties}}) == \
        f"schema.items.properties: {sb.MAX_OPTIONAL + 1} are optional (not in required), " \
        f"over the limit of {sb.MAX_OPTIONAL}"


def test_schema_depth_and_size_are_bounded() -> None:
    def deep(levels: int) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        for _ in range(levels - 1):
            schema = {"items": schema}
        return schema

    sb.check_schema(deep(sb.MAX_SCHEMA_DEPTH))
    assert schema_refused(deep(sb.MAX_SCHEMA_DEPTH + 1)) == \
        f"schema: objects and arrays nest {sb.MAX_SCHEMA_DEPTH + 1} deep, over the limit " \
        f"of {sb.MAX_SCHEMA_DEPTH}"
    assert "nest 100000 deep" in schema_refused(deep(100_000))
    wide = {"enum": ["x" * 1000] * 200}
    assert len(json.dumps(wide)) > sb.MAX_SCHEMA_BYTES
    assert f"over the limit of {sb.MAX_SCHEMA_BYTES}" in schema_refused(wide)


def test_schema_keywords_are_found_where_the_converter_looks_and_nowhere_else() -> None:
    sb.check_schema({"properties": {"maxLength": {"type": "string"}},  # a property's name
                     "enum": [{"maxLength": 99999}]})  # data, not a schema
    assert schema_refused({"anyOf": [{}, {"items": {"maxItems": 9999}}]}).startswith(
        "schema.anyOf[1].items.maxItems: 9999")
    assert schema_refused({"$ref": "#/somewhere/s", "somewhere": {"s": {"minLength": 9999}}}) \
        .startswith("schema.somewhere.s.minLength: 9999")
    sb.check_schema({"$ref": "#", "items": {"$ref": "#/items"}})  # loops are walked once


# --- the converter writes lengths as x{m,n} (shared/llama/grammar.py) ---

def test_lengths_are_written_as_repetitions_not_nested_groups() -> None:
    pytest.importorskip("llama_cpp")
    from shared.llama.grammar import schema_grammar

    rules = schema_grammar({"type": "object", "required": ["s", "a", "b"], "properties": {
        "s": {"type": "string", "minLength": 1, "maxLength": gb.MAX_REPEAT},
        "a": {"type": "array", "items": {"type": "integer"}, "maxItems": gb.MAX_REPEAT},
        "b": {"type": "array", "items": {"type": "boolean"}, "minItems": 2}}}).splitlines()
    assert 's ::= "\\"" char{1,2000} "\\"" space' in rules
    assert 'a ::= "[" space (integer integer-next{0,1999})? "]" space' in rules
    assert 'integer-next ::= "," space integer' in rules
    assert 'b ::= "[" space boolean boolean-next+ "]" space' in rules
    with pytest.raises(ValueError, match=r"^schema.properties.s.maxLength: 60000 is over"):
        schema_grammar({"properties": {"s": {"type": "string", "maxLength": 60000}}})


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^a{0,3}$", "maxLength": 9},
    {"type": "string", "enum": ["x", "y"], "maxLength": 1},
    {"type": "string", "format": "date", "minLength": 10},
    {"type": "string", "format": "uuid", "maxLength": 36},
    {"anyOf": [{"type": "string"}], "maxLength": 3},
    {"type": "array", "prefixItems": [{"type": "integer"}], "maxItems": 1},
    {"items": {"type": "integer"}, "properties": {"n": {"type": "integer"}}, "maxItems": 2},
])
def test_where_another_keyword_comes_first_the_converter_writes_what_it_wrote(
        schema: dict[str, Any]) -> None:
    pytest.importorskip("llama_cpp")
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from shared.llama.grammar import _JSON_CHAR, _LOOSE_CHAR, schema_grammar

    parent = json_schema_to_gbnf(json.dumps(schema)).replace(_LOOSE_CHAR, _JSON_CHAR)
    assert schema_grammar(schema, strict=False) == parent


def test_a_schema_whose_grammar_is_over_a_bound_is_refused_as_such() -> None:
    pytest.importorskip("llama_cpp")
    from shared.llama.grammar import schema_grammar

    values = [f"v{i}" for i in range(gb.MAX_CHOICES)]
    schema_grammar({"enum": values})
    with pytest.raises(ValueError, match="^the grammar this schema converts to opens more"):
        schema_grammar({"enum": [*values, "one more"]})
    optional = {f"p{i}": {"type": "integer"} for i in range(sb.MAX_OPTIONAL)}
    schema_grammar({"type": "object", "properties": optional})  # converted and within bounds


# --- lead over the fake target ---

@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(make_settings(max_tokens=16), FakeModel(eos_bias=-100.0)))


def json_schema(schema: Any) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema}}}


def error_of(client: TestClient, fields: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    r = client.post("/v1/chat/completions", json=chat_body(max_tokens=4, **fields))
    assert 400 <= r.status_code < 500, r.text
    return r.status_code, r.json()["error"]


OVER_SIZE = 'root ::= "a"\n#' + "x" * gb.MAX_GBNF_BYTES


@pytest.mark.parametrize(("fields", "param", "says"), [
    ({"grammar": nested(100_000)}, "grammar",
     "grammar: parentheses nest 100000 deep, over the limit of 256"),
    (json_schema({"type": "object", "properties": {"s": {
        "type": "string", "maxLength": 10**6}}}), "response_format",
     "response_format: schema.properties.s.maxLength: 1000000 is over the limit of 2000"),
    (json_schema({"type": "array", "items": {"type": "string"}, "minItems": 10**6}),
     "response_format", "response_format: schema.minItems: 1000000 is over the limit of 2000"),
    ({"grammar": OVER_SIZE}, "grammar",
     f"grammar is {len(OVER_SIZE)} bytes, over the limit of {gb.MAX_GBNF_BYTES}"),
    ({"grammar": 'root ::= "a"{5,3}'}, "grammar",
     "grammar: the repetition {5,3} has its minimum over its maximum"),
    ({"grammar": alternatives(5000)}, "grammar",
     f"grammar opens more than {gb.MAX_CHOICES} alternatives"),
])
def test_lead_answers_a_400_naming_the_field_and_the_limit(client: TestClient,
                                                           fields: dict[str, Any], param: str,
                                                           says: str) -> None:
    status, error = error_of(client, fields)
    assert status == 400 and error["param"] == param and error["message"].startswith(says), \
        error


def test_a_mebibyte_grammar_and_a_deep_schema_are_refused_with_a_4xx(
        client: TestClient) -> None:
    error_of(client, {"grammar": 'root ::= "a"\n#' + "x" * (1 << 20)})  # 413 here
    levels = 100_000  # written by hand: json.dumps recurses (and Python's parser refuses it)
    schema = '{"items":' * levels + '{"type":"string"}' + "}" * levels
    body = json.dumps(chat_body(**json_schema("SCHEMA"))).replace('"SCHEMA"', schema)
    r = client.post("/v1/chat/completions", content=body,
                    headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert client.post("/v1/chat/completions", json=chat_body(max_tokens=4)).status_code == 200


def test_a_forced_calls_parameters_keep_what_is_within_bounds() -> None:
    """A tool's parameters are a hint: Claude Code's Workflow tool asks for a 512 KiB
    string, which no grammar may hold; the call is served, that bound left out
    (tests/test_client_fixtures.py posts Claude Code's own request)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "maxLength": 60000,
                                               "minLength": 2}}}}}
    tools = check_tools([{"type": "function", "function": {"name": "g"}}, tool])
    grammar = call_grammar(HERMES, tools, ToolChoice("required", "f"))
    assert grammar is not None
    assert grammar.schema["properties"]["arguments"]["properties"]["s"] == \
        {"type": "string", "minLength": 2}


@pytest.mark.parametrize(("schema", "relaxed"), [
    ({"type": "string", "maxLength": 10**6}, {"type": "string"}),
    ({"type": "string", "minLength": 5, "maxLength": 3}, {"type": "string"}),
    ({"type": "array", "minItems": -1, "maxItems": 4}, {"type": "array", "maxItems": 4}),
    ({"type": "string", "pattern": "^a{1,500}$"}, {"type": "string"}),
    ({"type": "string", "pattern": "^a{1,5}$"}, {"type": "string", "pattern": "^a{1,5}$"}),
    ({"$defs": {"s": {"type": "string", "maxLength": 9999}}, "$ref": "#/$defs/s"},
     {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s"}),
    ({"type": "object", "description": "x" * (200 * 1024)}, {"type": "object"}),  # too large
])
def test_a_hint_s_schema_is_brought_within_bounds(schema: dict, relaxed: dict) -> None:
    given = json.dumps(schema)
    assert sb.within_bounds(schema) == relaxed
    assert json.dumps(schema) == given  # the request's own schema is left as it came


# --- a back ---

def test_a_back_refuses_a_bomb_in_one_line_and_drafts_blind(
        caplog: pytest.LogCaptureFixture) -> None:
    class Counting(FakeModel):
        parsed = 0

        def constraint(self, gbnf: str) -> Any:
            Counting.parsed += 1
            return super().constraint(gbnf)

    model = Counting()
    drafter = ModelDrafter(model)
    prompt = model.tokenize("hello")
    drafter.catch_up(prompt)
    rng = np.random.default_rng(0)
    bomb = SamplingParams(grammar=nested(100_000))
    with caplog.at_level(logging.WARNING, logger="back"):
        guesses = [grow(drafter, bomb, rng, n_prompt=len(prompt)) for _ in range(4)]
    blind = ModelDrafter(FakeModel())
    blind.catch_up(prompt)
    expected = [grow(blind, SamplingParams(), rng, n_prompt=len(prompt)) for _ in range(4)]
    assert [g.guess for g in guesses if g] == [e.guess for e in expected if e]
    assert Counting.parsed == 0  # refused before any parser saw it
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "parentheses nest 100000 deep" in warnings[0], warnings


def test_a_back_drops_a_grammar_that_takes_seconds_a_guess_and_drafts_blind(
        caplog: pytest.LogCaptureFixture) -> None:
    from bench.fake import VirtualClock
    from tests.test_grammar import SlowGrammarModel

    model = SlowGrammarModel(cost_s=0.6)  # two checks a guess at the least: 1.2 s
    clock = model.clock
    assert isinstance(clock, VirtualClock)
    drafter = ModelDrafter(model, clock=clock)
    prompt = model.tokenize("hello")
    drafter.catch_up(prompt)
    rng = np.random.default_rng(0)
    slow = SamplingParams(grammar='root ::= "yes" | "no"')
    with caplog.at_level(logging.WARNING, logger="back"):
        guesses = [grow(drafter, slow, rng, n_prompt=len(prompt)) for _ in range(4)]
    spent = clock()
    assert guesses[0] is not None and FakeModel().token_bytes(guesses[0].guess) in (b"y", b"n")
    blind = ModelDrafter(FakeModel(eos_bias=-100.0))
    blind.catch_up([*prompt, guesses[0].guess])  # the first guess was under the grammar...
    expected = [grow(blind, SamplingParams(), rng, n_prompt=len(prompt))
                for _ in range(3)]
    assert [g.guess for g in guesses[1:] if g] == [e.guess for e in expected if e]  # ...then blind
    assert grow(drafter, slow, rng, n_prompt=len(prompt)) and clock() == spent
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "drafting without it" in warnings[0], warnings
