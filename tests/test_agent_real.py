"""The APIs agents and editors speak, on the default pair in real processes, with a back
drafting: the openai SDK's Responses API and the anthropic SDK's Messages API, plain and
streamed, each with a tool round trip; fill-in-the-middle shaped as an editor sends it
(llama.cpp's /infill). Lead's draft length is forced and its own drafts off, one CPU each
(tests/drafting.py): in every reply the back's drafts are verified, on any machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.procs import Back, Lead, metric
from shared.wire.httpclient import sse_events
from tests.drafting import FORCED
from tests.test_real_pair import DRAFT, TARGET, WEATHER_RESULT, _installed

pytestmark = pytest.mark.real

WEATHER = {"type": "function", "name": "get_weather",
           "description": "Get the current weather in a given city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
WEATHER_ANTHROPIC = {"name": "get_weather", "description": WEATHER["description"],
                     "input_schema": WEATHER["parameters"]}
ASK = "What is the weather in Paris right now?"


@pytest.fixture(scope="module")
def pair() -> Iterator[Lead]:
    if not (_installed(TARGET) and _installed(DRAFT)):
        pytest.skip("default pair not installed: run `make models`")
    lead = Lead(TARGET, *FORCED)  # one thread: the back drafts on the other CPU
    back = Back(lead, DRAFT)
    try:
        back.wait_attached()
        yield lead
    finally:
        back.stop()
        lead.stop()


def drafted(lead: Lead) -> float:
    """Draft tokens lead has verified so far (a stream's final usage, put together by an
    SDK, keeps only the fields it knows)."""
    return metric(lead, "duo_drafted_tokens_total")


@pytest.mark.parametrize("stream", [False, True])
def test_responses_tool_round_trip_through_the_openai_sdk(pair: Lead, stream: bool) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{pair.url}/v1", api_key="unused", max_retries=0)

    def create(**kw: Any) -> Any:
        if not stream:
            return client.responses.create(model="duo", max_output_tokens=120, **kw)
        with client.responses.stream(model="duo", max_output_tokens=120, **kw) as events:
            return events.get_final_response()

    before = drafted(pair)
    first = create(input=ASK, tools=[WEATHER])
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and "paris" in json.loads(call.arguments)["city"].lower()
    history = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id,
                "output": WEATHER_RESULT}]
    answer = create(input=history, tools=[WEATHER], tool_choice="none")  # (as test_real_pair)
    assert answer.status == "completed" and "21" in answer.output_text, answer.output_text
    assert drafted(pair) > before  # the back's drafts were verified


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_round_trip_through_the_anthropic_sdk(pair: Lead, stream: bool) -> None:
    from anthropic import Anthropic

    client = Anthropic(base_url=pair.url, api_key="unused", max_retries=0)

    def create(**kw: Any) -> Any:
        if not stream:
            return client.messages.create(model="duo", max_tokens=120, **kw)
        with client.messages.stream(model="duo", max_tokens=120, **kw) as events:
            return events.get_final_message()

    ask = [{"role": "user", "content": ASK}]
    before = drafted(pair)
    first = create(messages=ask, tools=[WEATHER_ANTHROPIC])
    assert first.stop_reason == "tool_use", first.content
    use = next(block for block in first.content if block.type == "tool_use")
    assert use.name == "get_weather" and "paris" in use.input["city"].lower()
    history = [*ask, {"role": "assistant",
                      "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": WEATHER_RESULT}]}]
    answer = create(messages=history, tools=[WEATHER_ANTHROPIC], tool_choice={"type": "none"})
    text = "".join(b.text for b in answer.content if b.type == "text")
    assert answer.stop_reason == "end_turn" and "21" in text, text
    assert drafted(pair) > before


def test_an_editors_fill_in_the_middle_request_is_drafted_for(pair: Lead) -> None:
    """As llama.vim asks llama.cpp's server: the text before the cursor, the line typed so
    far (its indentation as `n_indent`), the text after; the body of a function, ended where
    a line is indented less. (The instruct model goes on past the middle, writing the suffix
    again and a comment, on llama-server b11434 too: the plugin's n_indent is what ends it.)"""
    r = httpx.post(f"{pair.url}/infill", timeout=120, json={
        "input_prefix": "def fib(n):\n", "prompt": "    ", "n_indent": 4,
        "input_suffix": "\n\nprint(fib(10))\n", "n_predict": 80, "temperature": 0})
    assert r.status_code == 200, r.text
    got = r.json()
    assert "return" in got["content"] and "print" not in got["content"], got
    assert got["stop_type"] == "limit" and got["tokens_predicted"] < 80, got
    assert got["drafted_tokens"] > 0, got


def test_tools_on_a_model_whose_template_has_no_call_format() -> None:
    """SmolLM2's template has no tool-call format: the generic JSON one, held by a grammar,
    gives a call that parses, plain and streamed, and an answer after its result."""
    lead = Lead("smollm2-135m")
    try:
        ask = {"messages": [{"role": "user", "content": ASK}], "max_tokens": 80,
               "tools": [{"type": "function", "function": {k: WEATHER[k] for k in (
                   "name", "description", "parameters")}}], "tool_choice": "required"}
        r = httpx.post(f"{lead.url}/v1/chat/completions", json=ask, timeout=120).json()
        (call,) = r["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert "city" in json.loads(call["function"]["arguments"])
        with httpx.stream("POST", f"{lead.url}/v1/chat/completions", timeout=120,
                          json={**ask, "tool_choice": "auto", "stream": True}) as s:
            chunks = [e for e in sse_events(s) if e.get("choices")]
        finish = chunks[-1]["choices"][0]["finish_reason"]
        assert finish in ("tool_calls", "stop", "length")  # a call, or an answer: both parse
    finally:
        lead.stop()
