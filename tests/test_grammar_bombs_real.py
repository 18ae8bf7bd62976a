"""Grammar and schema bombs against a real lead on SmolLM2 with a real back attached: each
is a 4xx within a second, lead and the back live on and serve; grammars at the bounds
(shared/grammar/bounds.py) go through llama.cpp's own parser, in lead and in the back,
and work. Before the bounds, the first two here ended lead with a SIGSEGV."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.procs import Back, Lead, metric, wait_until
from shared.grammar import bounds as gb
from shared.llama.model import LlamaModel, load_model
from tests.test_grammar_bounds import alternatives, json_schema, nested

pytestmark = pytest.mark.real

BOMBS = [
    (json_schema({"type": "object", "properties": {"s": {"type": "string", "maxLength": 60000}},
                  "required": ["s"]}), "response_format", "maxLength: 60000 is over"),
    ({"grammar": nested(60000)}, "grammar", "nest 60000 deep"),
    ({"grammar": 'root ::= "a"{5,3}'}, "grammar", "minimum over its maximum"),
    ({"grammar": 'root ::= ("a"*){0,100}'}, "grammar", "can be empty"),
    ({"grammar": alternatives(5000)}, "grammar", "alternatives"),
    ({"grammar": 'root ::= "a"\n#' + "x" * gb.MAX_GBNF_BYTES}, "grammar", "bytes"),
    (json_schema({"type": "array", "items": {"type": "integer"}, "minItems": 10**6}),
     "response_format", "minItems: 1000000 is over"),
]


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Lead, Back]]:
    lead = Lead()
    back = Back(lead)
    try:
        back.wait_attached()
        wait_until(lambda: metric(lead, "duo_backs_active") >= 1, 30, "back active")
        yield lead, back
    finally:
        back.stop()
        lead.stop()


def post(lead: Lead, **fields: Any) -> httpx.Response:
    return httpx.post(f"{lead.url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 4,
        **fields})


@pytest.mark.parametrize(("fields", "param", "says"), BOMBS)
def test_a_bomb_is_a_4xx_within_a_second_and_lead_and_back_live_on(
        pair: tuple[Lead, Back], fields: dict[str, Any], param: str, says: str) -> None:
    lead, back = pair
    started = time.perf_counter()
    r = post(lead, **fields)
    took = time.perf_counter() - started
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert took < 1.0, f"{took:.2f} s"
    assert lead.alive() and back.alive()
    assert post(lead).status_code == 200


def test_grammars_at_the_bounds_parse_in_lead_and_the_back_and_work(
        pair: tuple[Lead, Back]) -> None:
    lead, back = pair
    deepest = "root ::= " + "(" * gb.MAX_NESTING + '" yes" | " no"' + ")" * gb.MAX_NESTING
    wide = "root ::= " + " | ".join(f'" {i}"' for i in range(gb.MAX_CHOICES))
    for grammar, replies in ((deepest, {" yes", " no"}),
                             (wide, {f" {i}" for i in range(gb.MAX_CHOICES)})):
        r = httpx.post(f"{lead.url}/v1/completions", timeout=120, json={
            "prompt": "Is the sky blue? Answer:", "max_tokens": 8, "grammar": grammar})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] in replies
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 2000}},
              "required": ["s"]}
    assert post(lead, max_tokens=16, **json_schema(schema)).status_code == 200
    assert lead.alive() and back.alive()
    assert "cannot be used here" not in back.log()  # the back parsed them as lead did


# --- the schema lengths written as x{m,n}, through llama.cpp's parser and sampler ---

@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return load_model("smollm2-135m", threads=1, n_ctx=512)


def test_a_string_of_max_length_ends_there_and_one_of_min_length_not_before(
        model: LlamaModel) -> None:
    quote, letter = model.tokenize('"', add_bos=False)[0], model.tokenize("a", add_bos=False)[0]
    bounded = model.constraint(model.schema_grammar({"type": "string", "maxLength": 2000}))
    full = bounded.advanced([quote] + [letter] * 2000)
    assert full.allows(quote) and not full.allows(letter)
    assert bounded.advanced([quote] + [letter] * 1999).allows(letter)
    exact = model.constraint(model.schema_grammar(
        {"type": "string", "minLength": 2000, "maxLength": 2000}))
    short = exact.advanced([quote] + [letter] * 1999)
    assert short.allows(letter) and not short.allows(quote)


def test_an_array_of_max_items_ends_there(model: LlamaModel) -> None:
    one, comma, close = (model.tokenize(t, add_bos=False)[0] for t in ("1", ",", "]"))
    state = model.constraint(model.schema_grammar(
        {"type": "array", "items": {"type": "integer", "enum": [1]}, "maxItems": 2000}))
    full = state.advanced(model.tokenize("[", add_bos=False) + [one, comma] * 1999 + [one])
    assert full.allows(close) and not full.allows(comma)
