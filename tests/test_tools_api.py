"""Tools through lead's API over a fake target whose template writes Hermes calls
(`<tool_call>`): calls parsed into OpenAI's tool_calls, plain and streamed alike, with
a back's drafts or without; history with calls; every bad tools field a 400 naming it.
The call format's parsing and the forced-call grammar are tested in test_tools.py; the
real tier (test_tools_real.py) runs the default pair through the openai SDK."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from lead.server.app import create_app
from shared.wire.httpclient import sse_events
from tests.conftest import ScriptedModel, chat_body, make_settings

HERMES_TEMPLATE = "{% for tool in tools %}<tools>{{ tool }}</tools>{% endfor %}<tool_call>"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALL = ['I will look.', '\n<tool_call>', '\n{"name": "get_weather", ',
        '"arguments": {"city": "Paris"}}', '\n</tool_call>']


class PieceModel(ScriptedModel):
    """A scripted target whose script is text pieces, one token each (ids 100 on)."""

    BASE = 100

    def __init__(self, pieces: list[str], **kw: Any) -> None:
        super().__init__([self.BASE + i for i in range(len(pieces))] + [0],
                         n_vocab=self.BASE + len(pieces), chat_template=HERMES_TEMPLATE, **kw)
        self.pieces = pieces

    def token_bytes(self, token_id: int) -> bytes:
        if token_id >= self.BASE:
            return self.pieces[token_id - self.BASE].encode()
        return super().token_bytes(token_id)

    def logits_for(self, context: list[int]) -> np.ndarray:  # type: ignore[override]
        # the script's place: how many of its tokens end the context (a prompt has none)
        done = next((i for i, t in enumerate(reversed(context)) if t < self.BASE),
                    len(context))
        self.prompt_len = len(context) - done
        return super().logits_for(context)


def client_for(pieces: list[str]) -> TestClient:
    return TestClient(create_app(make_settings(max_tokens=16), PieceModel(pieces)))


def ask(client: TestClient, **extra: Any) -> dict[str, Any]:
    r = client.post("/v1/chat/completions", json=chat_body(tools=[WEATHER], **extra))
    assert r.status_code == 200, r.text
    return r.json()


def ask_streamed(client: TestClient, **extra: Any) -> list[dict[str, Any]]:
    with client.stream("POST", "/v1/chat/completions",
                       json=chat_body(tools=[WEATHER], stream=True, **extra)) as r:
        assert r.status_code == 200
        return list(sse_events(r))


def test_a_call_in_the_reply_becomes_tool_calls() -> None:
    reply = ask(client_for(CALL))["choices"][0]
    assert reply["finish_reason"] == "tool_calls"
    assert reply["message"]["content"] == "I will look."
    (call,) = reply["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_a_streamed_call_comes_as_deltas_that_add_up_to_the_plain_reply() -> None:
    events = ask_streamed(client_for(CALL))
    deltas = [e["choices"][0]["delta"] for e in events]
    content = "".join(d.get("content") or "" for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert content == "I will look." and len(calls) == 1
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # every token still reported: the call's pieces were held, not lost
    assert sum(e["duo"]["tokens"] for e in events) == len(CALL) + 1


def test_a_reply_without_calls_is_plain_content() -> None:
    pieces = ["It is ", "sunny."]
    assert ask(client_for(pieces))["choices"][0] == {
        "index": 0, "message": {"role": "assistant", "content": "It is sunny."},
        "logprobs": None, "finish_reason": "stop"}
    events = ask_streamed(client_for(pieces))
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == \
        "It is sunny."
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_tool_choice_none_leaves_call_text_as_content() -> None:
    reply = ask(client_for(CALL), tool_choice="none")["choices"][0]
    assert reply["finish_reason"] == "stop" and "tool_calls" not in reply["message"]
    assert reply["message"]["content"] == "".join(CALL)


def test_a_call_cut_by_max_tokens_stays_content_and_length() -> None:
    reply = ask(client_for(CALL), max_tokens=3)["choices"][0]
    assert reply["finish_reason"] == "length" and "tool_calls" not in reply["message"]


def test_history_with_a_call_and_its_result_is_served() -> None:
    history = [{"role": "user", "content": "weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {
                       "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    r = client_for(["Sunny."]).post("/v1/chat/completions",
                                    json={"messages": history, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Sunny."


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tool_choice.function.name"),
    ({"tools": [WEATHER], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_bad_tools_fields_are_a_400_naming_them(fields: dict[str, Any], param: str) -> None:
    r = client_for(CALL).post("/v1/chat/completions", json={**chat_body(), **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert r.json()["error"]["message"].startswith(param)
