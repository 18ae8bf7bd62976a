"""A request's structured output: `response_format` (json_object, json_schema) or
`grammar` (GBNF) as the grammar its reply follows, or a 400 naming the field; a call
that tool_choice forces is given as a grammar too.

json_object is a JSON object (OpenAI's meaning; the schema {"type": "object"}); a
json_schema is converted as llama.cpp's server converts it (shared/llama/model.py), and a schema
with a keyword the grammar cannot enforce (minimum, ...) is refused unless `strict` is
false, so that a reply always validates. A grammar or schema over a bound that keeps
llama.cpp from crashing or stalling (shared/grammar/bounds.py, shared/grammar/schema_bounds.py)
is refused before any parser sees it. The grammar text goes to backs with the sampling
settings; the state made here is lead's own.
"""

from __future__ import annotations

from lead.apis.shapes import CommonRequest, FieldRefused, ResponseFormat
from shared.grammar.bounds import check_gbnf
from shared.grammar.constraint import Constraint
from shared.model import Model

JSON_OBJECT = {"type": "object"}


def grammar_of(body: CommonRequest, model: Model,
               forced: str | None = None) -> tuple[str, str] | None:
    """(GBNF text, the field it came from), or None for a free reply. `forced`: the
    grammar of a call that tool_choice forces (lead/apis/toolreply.py)."""
    fmt = body.response_format
    if body.json_schema is not None:  # llama-server's field: json_object with its schema
        if fmt is not None and fmt.structured:
            raise FieldRefused("json_schema", "json_schema: give either json_schema or a "
                                              "structured response_format, not both")
        fmt = ResponseFormat(type="json_object", schema=body.json_schema)
    structured = fmt is not None and fmt.structured
    if forced is not None:
        if body.grammar or structured:
            raise FieldRefused("tool_choice", "tool_choice: a forced call cannot be combined "
                                              "with grammar or a structured response_format")
        return forced, "tool_choice"
    if body.grammar and structured:
        raise FieldRefused("grammar", "grammar: give either grammar or a response_format "
                                      "of json_object or json_schema, not both")
    if body.grammar:
        try:
            check_gbnf(body.grammar, "grammar")
        except ValueError as exc:
            raise FieldRefused("grammar", str(exc)) from None
        return body.grammar, "grammar"
    if fmt is None or not structured:
        return None
    if fmt.type == "json_schema" and fmt.json_schema is None:
        raise FieldRefused("response_format", "response_format: type json_schema needs "
                                              "json_schema: {name, schema}")
    spec = fmt.json_schema
    schema = spec.schema_ if spec is not None else fmt.schema_ or JSON_OBJECT
    # strict unless the request says false (then keywords it cannot enforce are ignored),
    # or gives llama-server's json_object with a schema, which that server enforces so
    strict = spec.strict is not False if spec is not None else fmt.schema_ is None
    param = "response_format" if body.json_schema is None else "json_schema"
    try:
        return model.schema_grammar(schema, strict), param
    except ValueError as exc:
        raise FieldRefused(param, f"{param}: {exc}") from None


def constraint_of(body: CommonRequest, model: Model,
                  forced: str | None = None) -> tuple[str, Constraint] | None:
    """The grammar's text and its start state, or None for a free reply."""
    found = grammar_of(body, model, forced)
    if found is None:
        return None
    text, param = found
    try:
        return text, model.constraint(text)
    except ValueError as exc:
        raise FieldRefused(param, f"{param}: the grammar does not parse: {exc}") from None
