"""The Responses API and Anthropic's Messages API over a fake target (/infill:
tests/test_infill.py): shapes plain and streamed through the official SDKs (in one
process), tool calls and their round trip, stop reasons, what each refuses (a 400 naming
the field, in Anthropic's error shape on its path), the key as x-api-key; and tools on a
template without a call format (the generic JSON format)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import numpy as np
import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.apis.generictools import GenericStream, generic_messages, reply_schema
from lead.server.app import create_app
from shared.wire.httpclient import sse_events
from tests.conftest import make_settings
from tests.test_tools_api import CALL, PieceModel

WEATHER = {"type": "function", "name": "get_weather", "description": "the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
WEATHER_ANTHROPIC = {"name": "get_weather", "description": "the weather in a city",
                     "input_schema": WEATHER["parameters"]}


def app_over(model: FakeModel, **settings: Any) -> Any:
    return create_app(make_settings(calibrate=False, max_tokens=40, **settings), model)


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(body(), 60))


def openai_client(app: Any) -> Any:
    from openai import AsyncOpenAI

    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://lead")
    return AsyncOpenAI(base_url="http://lead/v1", api_key="k", http_client=http, max_retries=0)


def anthropic_client(app: Any, key: str = "k") -> Any:
    from anthropic import AsyncAnthropic

    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://lead")
    return AsyncAnthropic(base_url="http://lead", api_key=key, http_client=http,
                          max_retries=0)


def chat_text(app: Any, text: str, max_tokens: int = 20) -> str:
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens})
        return r.json()["choices"][0]["message"]["content"]


# --- the Responses API ---


def test_a_response_holds_what_a_chat_completion_would_say() -> None:
    app = app_over(FakeModel(eos_bias=-100.0))
    expected = chat_text(app, "hello there")

    async def body() -> Any:
        return await openai_client(app).responses.create(model="duo", input="hello there",
                                                          max_output_tokens=20)

    r = run(body)
    assert r.object == "response" and r.status == "incomplete"  # cut at max_output_tokens
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == expected and r.output[0].type == "message"
    assert r.usage.output_tokens == 20 and r.usage.input_tokens > 0


def test_a_streamed_response_adds_up_to_the_whole_one() -> None:
    app = app_over(FakeModel(eos_bias=-100.0))
    expected = chat_text(app, "hello there")

    async def body() -> list[Any]:
        stream = await openai_client(app).responses.create(model="duo", input="hello there",
                                                            max_output_tokens=20, stream=True)
        return [event async for event in stream]

    events = run(body)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == expected == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))


def test_a_call_and_its_output_make_a_tool_round_trip() -> None:
    app = app_over(PieceModel(CALL))

    async def body() -> tuple[Any, Any]:
        client = openai_client(app)
        first = await client.responses.create(model="duo", input="weather in Paris?",
                                              tools=[WEATHER])
        call = next(item for item in first.output if item.type == "function_call")
        history = [{"role": "user", "content": "weather in Paris?"}, call.model_dump(),
                   {"type": "function_call_output", "call_id": call.call_id,
                    "output": '{"sky": "sunny"}'}]
        second = await client.responses.create(model="duo", input=history, tools=[WEATHER],
                                               tool_choice="none")
        return first, second

    first, second = run(body)
    call = first.output[-1]
    assert first.output[0].content[0].text == "I will look."
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and second.status == "completed"


def test_a_streamed_call_comes_as_a_function_call_item() -> None:
    app = app_over(PieceModel(CALL))

    async def body() -> list[Any]:
        stream = await openai_client(app).responses.create(
            model="duo", input="weather in Paris?", tools=[WEATHER], stream=True)
        return [event async for event in stream]

    events = run(body)
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [item.type for item in added] == ["message", "function_call"]
    args = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert json.loads("".join(args)) == {"city": "Paris"}
    assert events[-1].type == "response.completed"
    assert [item.type for item in events[-1].response.output] == ["message", "function_call"]


@pytest.mark.parametrize(("extra", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "local_computer"}]}, "tools[0].type"),
    ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
     "tool_choice"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"text": {"format": "json"}}, "text.format"),
    ({"text": {"format": 5}}, "text.format"),
])
def test_what_responses_does_not_serve_is_a_400_naming_it(extra: dict[str, Any],
                                                          param: str) -> None:
    with TestClient(app_over(FakeModel())) as client:
        r = client.post("/v1/responses", json={"input": "hi", **extra})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.json()


@pytest.mark.parametrize("extra", [
    {"store": True, "reasoning": {"effort": "low", "summary": "auto"}},
    {"include": ["reasoning.encrypted_content", "file_search_call.results"]},
    {"client_metadata": {"turn": "1"}, "prompt_cache_key": "k", "truncation": "auto",
     "text": {"verbosity": "low"}, "no_such_field": 1},
    {"tools": [{"type": "web_search", "external_web_access": False}]},
    {"input": [{"type": "reasoning", "id": "rs_1", "summary": [], "content": None,
                "encrypted_content": "eA=="},
               {"type": "message", "id": "m1", "role": "user",
                "content": [{"type": "input_text", "text": "hi"}]}]},
])
def test_what_changes_nothing_the_client_relies_on_is_accepted(extra: dict[str, Any]) -> None:
    """Codex sends reasoning settings, encrypted-reasoning includes, its metadata and a
    hosted web search with every request: the model thinks not and searches not, and
    says so by writing neither."""
    with TestClient(app_over(FakeModel())) as client:
        r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 3, **extra})
        assert r.status_code == 200, r.text
        assert {item["type"] for item in r.json()["output"]} == {"message"}
        assert r.json()["usage"]["output_tokens_details"]["reasoning_tokens"] == 0


# --- Anthropic's Messages API ---


def test_a_message_holds_what_a_chat_completion_would_say() -> None:
    app = app_over(FakeModel(eos_bias=-100.0))
    expected = chat_text(app, "hello there")

    async def body() -> Any:
        return await anthropic_client(app).messages.create(
            model="duo", max_tokens=20, messages=[{"role": "user", "content": "hello there"}])

    m = run(body)
    assert m.type == "message" and m.role == "assistant" and m.stop_reason == "max_tokens"
    assert m.content[0].text == expected and m.usage.output_tokens == 20


def test_a_stop_sequence_ends_a_message_and_is_named() -> None:
    app = app_over(FakeModel(eos_bias=-100.0))
    text = chat_text(app, "hello there")
    stop = text[5:7]

    async def body() -> Any:
        return await anthropic_client(app).messages.create(
            model="duo", max_tokens=20, stop_sequences=["zzz", stop],
            messages=[{"role": "user", "content": "hello there"}])

    m = run(body)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == text[:text.index(stop)]


def test_a_streamed_message_adds_up_to_the_whole_one() -> None:
    app = app_over(FakeModel(eos_bias=-100.0))
    expected = chat_text(app, "hello there")

    async def body() -> tuple[list[Any], Any]:
        client = anthropic_client(app)
        async with client.messages.stream(
                model="duo", max_tokens=20,
                messages=[{"role": "user", "content": "hello there"}]) as stream:
            events = [event async for event in stream]
            return events, await stream.get_final_message()

    events, final = run(body)
    kinds = [e.type for e in events if not e.type.startswith("text")]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert final.content[0].text == expected and final.stop_reason == "max_tokens"


def test_a_tool_use_and_its_result_make_a_round_trip() -> None:
    app = app_over(PieceModel(CALL))

    async def body() -> tuple[Any, Any, Any]:
        client = anthropic_client(app)
        ask = [{"role": "user", "content": "weather in Paris?"}]
        first = await client.messages.create(model="duo", max_tokens=40, messages=ask,
                                             tools=[WEATHER_ANTHROPIC])
        use = next(b for b in first.content if b.type == "tool_use")
        history = [*ask, {"role": "assistant", "content": [b.model_dump() for b in
                                                           first.content]},
                   {"role": "user", "content": [{"type": "tool_result",
                                                 "tool_use_id": use.id,
                                                 "content": '{"sky": "sunny"}'}]}]
        second = await client.messages.create(model="duo", max_tokens=40, messages=history,
                                              tools=[WEATHER_ANTHROPIC],
                                              tool_choice={"type": "none"})
        async with client.messages.stream(model="duo", max_tokens=40, messages=ask,
                                          tools=[WEATHER_ANTHROPIC]) as stream:
            streamed = await stream.get_final_message()
        return first, second, streamed

    first, second, streamed = run(body)
    use = first.content[-1]
    assert first.stop_reason == "tool_use" and first.content[0].text == "I will look."
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in streamed.content] == ["text", "tool_use"]
    assert streamed.content[1].input == {"city": "Paris"}


def test_anthropic_errors_come_in_anthropic_s_shape_and_the_key_as_x_api_key() -> None:
    app = app_over(FakeModel(), api_key="k")
    with TestClient(app) as client:
        body = {"model": "duo", "messages": [{"role": "user", "content": "hi"}]}
        r = client.post("/v1/messages", json=body, headers={"x-api-key": "k"})
        assert r.status_code == 400 and r.json()["type"] == "error"  # no max_tokens
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert "max_tokens" in r.json()["error"]["message"]
        wrong = client.post("/v1/messages", json={**body, "max_tokens": 5},
                            headers={"x-api-key": "nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == \
            "authentication_error"
        ok = client.post("/v1/messages", json={**body, "max_tokens": 5},
                         headers={"x-api-key": "k"})
        assert ok.status_code == 200 and ok.json()["usage"]["output_tokens"] == 5
        image = {**body, "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {}}]}]}
        refused = client.post("/v1/messages", json=image, headers={"x-api-key": "k"})
        assert refused.status_code == 400
        assert "messages[0].content[0].type" in refused.json()["error"]["message"]


# --- tools on a template without a call format ---


class AnyConstraint:
    """A grammar that allows everything (the fake's own cannot hold JSON)."""

    def allows(self, token_id: int) -> bool:
        return True

    def mask(self, row: np.ndarray) -> np.ndarray:
        return row

    def advanced(self, tokens: Any) -> AnyConstraint:
        return self


class PlainPieces(PieceModel):
    """A scripted target whose template has no call format."""

    def __init__(self, pieces: list[str]) -> None:
        super().__init__(pieces)
        self.chat_template = "{{ messages }}"
        self.prompts: list[str] = []

    def constraint(self, gbnf: str) -> Any:
        self.gbnf = gbnf
        return AnyConstraint()

    def schema_grammar(self, schema: dict[str, Any], strict: bool = True) -> str:
        self.schema = schema
        return 'root ::= "x"'

    def format_chat(self, messages: list[dict[str, Any]], tools: Any = None,
                    **switches: Any) -> str:
        self.prompts.append(json.dumps(messages))
        return super().format_chat(messages, tools, **switches)


GENERIC_CALL = ['{"tool_call": {"name": "get_weather", ', '"arguments": {"city": "Paris"}}}']
GENERIC_ANSWER = ['{"response": "It is ', 'sunny in Par', 'is, 21\\u00b0C."}']


def test_a_template_without_a_call_format_calls_tools_in_the_generic_format() -> None:
    model = PlainPieces(GENERIC_CALL)
    with TestClient(app_over(model)) as client:
        r = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "weather in Paris?"}],
            "tools": [{"type": "function", "function": {k: WEATHER[k] for k in (
                "name", "description", "parameters")}}]})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert model.schema["anyOf"][1]["properties"] == {"response": {"type": "string"}}
    assert "get_weather" in model.prompts[-1] and "tool_call" in model.prompts[-1]


@pytest.mark.parametrize("pieces", [GENERIC_ANSWER, GENERIC_ANSWER[:2]])  # (and cut short)
def test_a_generic_answer_is_unwrapped_alike_whether_streamed_or_not(pieces: list[str]) -> None:
    body = {"messages": [{"role": "user", "content": "weather in Paris?"}],
            "tools": [{"type": "function", "function": {k: WEATHER[k] for k in (
                "name", "description", "parameters")}}]}
    with TestClient(app_over(PlainPieces(pieces))) as client:
        plain = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    with TestClient(app_over(PlainPieces(pieces))) as client, \
            client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        streamed = "".join(e["choices"][0]["delta"].get("content") or ""
                           for e in sse_events(r) if e.get("choices"))
    expected = "It is sunny in Paris, 21\u00b0C." if len(pieces) == 3 else "It is sunny in Par"
    assert plain["message"]["content"] == streamed == expected
    assert "tool_calls" not in plain["message"]


def test_the_generic_format_streams_an_answer_as_its_string_decodes() -> None:
    stream = GenericStream(["get_weather"])
    pieces = [stream.push(p) for p in ['{"resp', 'onse": "It is ', 'sunny \\', 'u00b0 ok"}']]
    assert pieces == [[], [{"content": "It is "}], [{"content": "sunny "}],
                      [{"content": "° ok"}]]
    assert stream.finish() == [] and stream.finish_reason("stop") == "stop"
    calls = GenericStream(["get_weather"])
    assert calls.push("".join(GENERIC_CALL)) == []
    (delta,) = calls.finish()
    assert delta["tool_calls"][0]["function"]["name"] == "get_weather"
    assert calls.finish_reason("stop") == "tool_calls"
    unknown = GenericStream(["get_weather"])
    unknown.push('{"tool_call": {"name": "rm_rf", "arguments": {}}}')
    assert unknown.finish() == [{"content": '{"tool_call": {"name": "rm_rf", "arguments": {}}}'}]


def test_the_generic_format_describes_the_tools_and_writes_history_as_text() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    history = [{"role": "system", "content": "Be brief."},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}]},
               {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"}]
    out = generic_messages(history, tools, required=False)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.")
    assert '"name": "f"' in out[0]["content"]
    assert json.loads(out[1]["content"]) == {"tool_call": {"name": "f", "arguments": {"x": 1}}}
    assert out[2] == {"role": "user", "content": "f returned: 42"}
    assert "anyOf" not in reply_schema([{"name": "f", "parameters": {}}], required=True)


def test_response_logprobs_are_chat_s_for_the_same_tokens() -> None:
    app = app_over(FakeModel(eos_bias=-100.0))
    with TestClient(app) as client:
        chat = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "logprobs": True, "top_logprobs": 2}).json()["choices"][0]["logprobs"]["content"]
        whole = client.post("/v1/responses", json={
            "input": "hi", "max_output_tokens": 6, "top_logprobs": 2,
            "include": ["message.output_text.logprobs"]}).json()
        with client.stream("POST", "/v1/responses", json={
                "input": "hi", "max_output_tokens": 6, "top_logprobs": 2, "stream": True,
                "include": ["message.output_text.logprobs"]}) as s:
            events = list(sse_events(s))
    assert whole["output"][0]["content"][0]["logprobs"] == chat
    streamed = [lp for e in events if e["type"] == "response.output_text.delta"
                for lp in e["logprobs"]]
    assert streamed == chat and len(chat) == 6
