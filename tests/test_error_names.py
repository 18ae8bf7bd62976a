"""Requests translated into chat (Anthropic's Messages, OpenAI's Responses, /infill) are
refused in their own names: the chat request's checks name the field as the client wrote
it (tools[0].input_schema, not tools[0].function.parameters), in the right message. A
schema only llama.cpp's converter refuses: tests/test_grammar_real.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.apis.renames import renamed
from lead.server.app import create_app
from tests.conftest import make_settings

USER = {"role": "user", "content": "hi"}


def refusal(path: str, body: dict[str, Any]) -> tuple[str | None, str]:
    """(param, message) of a 400: Anthropic's shape has no param."""
    app = create_app(make_settings(calibrate=False, max_tokens=40), FakeModel())
    with TestClient(app) as client:
        r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    return error.get("param"), error["message"]


def anthropic(**fields: Any) -> dict[str, Any]:
    return {"model": "duo", "max_tokens": 5, "messages": [USER], **fields}


def tool_use(value: Any, **block: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": [
        {"type": "text", "text": "x"},
        {"type": "tool_use", "id": "a", "name": "f", "input": value, **block}]}


@pytest.mark.parametrize(("body", "field"), [
    (anthropic(tools=[{"name": "f", "input_schema": 5}]), "tools[0].input_schema"),
    (anthropic(tools=[{"name": "f g", "input_schema": {}}]), "tools[0].name"),
    (anthropic(tools=[{"name": "f", "input_schema": {}}],
               tool_choice={"type": "tool", "name": "g"}), "tool_choice.name"),
    (anthropic(messages=[USER, tool_use(5)]), "messages[1].content[1].input"),
    (anthropic(messages=[USER, {**tool_use({}), "content": [
        {"type": "tool_use", "id": "", "name": "f", "input": {}}]}]),
     "messages[1].content[0].id"),
    (anthropic(system="be brief", messages=[USER, USER, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": 5, "content": "x"}]}]),
     "messages[2].content[0].tool_use_id"),
    (anthropic(stop_sequences=[5]), "stop_sequences[0]"),
])
def test_anthropic_refusals_name_anthropic_s_fields(body: dict[str, Any], field: str) -> None:
    _, message = refusal("/v1/messages", body)
    assert message.startswith(f"{field}:"), message


def responses(**fields: Any) -> dict[str, Any]:
    return {"model": "duo", "input": "hi", **fields}


CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}


@pytest.mark.parametrize(("body", "field"), [
    (responses(tools=[{"type": "function"}]), "tools[0].name"),
    (responses(tools=[{"type": "function", "name": "f", "parameters": 5}]),
     "tools[0].parameters"),
    (responses(tools=[{"type": "function", "name": "f"}],
               tool_choice={"type": "function", "name": "g"}), "tool_choice.name"),
    (responses(text={"format": {"type": "json_schema", "schema": 5}}), "text.format.schema"),
    (responses(text={"format": {"type": "json_schema", "name": "a", "schema": {"type": "bogus"}}}),
     "text.format"),
    (responses(input=[USER, CALL, {**CALL, "call_id": "c2", "arguments": "{bad"}]),
     "input[2].arguments"),
    (responses(input=[{**CALL, "call_id": ""}]), "input[0].call_id"),
    (responses(instructions="be brief", input=[USER, {
        "type": "function_call_output", "call_id": 5, "output": "x"}]), "input[1].call_id"),
    (responses(input=[{"role": "tool", "content": "x"}]), "input[0].role"),
])
def test_responses_refusals_name_responses_fields(body: dict[str, Any], field: str) -> None:
    param, message = refusal("/v1/responses", body)
    assert (param, message.split(":")[0]) == (field, field), message


def test_infill_refusals_name_infill_s_fields() -> None:
    param, message = refusal("/infill", {"input_prefix": "def f(", "n_predict": "many"})
    assert param == "n_predict" and message.startswith("n_predict:"), message


@pytest.mark.parametrize(("path", "client"), [
    ("tools[1].function.parameters", "tools[1].input_schema"),  # the longest prefix wins
    ("tools[1].function.name", "tools[1].name"),
    ("tools[10].function.name", "tools[10].function.name"),  # tools[1] is not its prefix
    ("messages[3].tool_calls[0].function.arguments", "messages[2].content[1].input"),
    ("messages[3].content", "messages[2].content"),
    ("max_tokens", "max_tokens"),
])
def test_a_path_is_renamed_by_its_longest_recorded_whole_field_prefix(path: str,
                                                                      client: str) -> None:
    names = {"tools[1].function": "tools[1]",
             "tools[1].function.parameters": "tools[1].input_schema",
             "messages[3]": "messages[2]",
             "messages[3].tool_calls[0]": "messages[2].content[1]",
             "messages[3].tool_calls[0].function.arguments": "messages[2].content[1].input"}
    assert renamed(path, names) == client


def test_an_empty_user_turn_is_named() -> None:
    _, message = refusal("/v1/messages", anthropic(messages=[{"role": "user", "content": []}]))
    assert message.startswith("messages[0].content:"), message


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 9000}]},
     "messages"),
    ("/v1/completions", {"prompt": "x" * 9000}, "prompt"),
    ("/v1/responses", {"input": "x" * 9000}, "input"),
    ("/infill", {"input_prefix": "x" * 9000}, "input_prefix"),
])
def test_a_prompt_over_the_context_is_openai_s_context_length_exceeded(
        path: str, body: dict[str, Any], field: str) -> None:
    app = create_app(make_settings(calibrate=False, max_tokens=40), FakeModel())
    with TestClient(app) as client:
        r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (field, "context_length_exceeded"), error
    assert error["message"].startswith("This model's maximum context length is "), error


def test_a_prompt_over_the_context_is_anthropic_s_prompt_is_too_long() -> None:
    """Claude Code compacts the conversation on these words."""
    _, message = refusal("/v1/messages", anthropic(messages=[{"role": "user",
                                                              "content": "x" * 9000}]))
    assert re.fullmatch(r"prompt is too long: \d+ tokens > \d+ maximum", message), message


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [USER], "max_tokens": 10 ** 8}),
    ("/v1/messages", anthropic(max_tokens=10 ** 8)),
    ("/v1/responses", responses(max_output_tokens=10 ** 8)),
])
def test_a_max_tokens_past_the_context_is_served_up_to_the_context(
        path: str, body: dict[str, Any]) -> None:
    """Agents ask for 32k tokens whatever the model (llama-server takes it too): the reply
    ends where the context does."""
    model = FakeModel(n_ctx=64, eos_bias=-1e9)
    with TestClient(create_app(make_settings(calibrate=False), model)) as client:
        r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0)) + \
        usage.get("cache_read_input_tokens", 0)
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    assert completion > 0 and prompt + completion <= 64 + 1, usage
