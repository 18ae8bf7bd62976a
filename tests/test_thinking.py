"""A thinking model's reply: its reasoning split out as each API carries it (chat's
reasoning_content, a Messages thinking block, a Responses reasoning item), the answer and
its calls as before; whole and streamed alike."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.apis.thinking import ThinkSplit, starts_inside
from lead.server.app import create_app
from shared.chat_template import ChatTemplate
from tests.conftest import make_settings
from tests.test_api import sse_events
from tests.test_tools_api import WEATHER, PieceModel

THOUGHT = ["<think>", "\nThe user", " greets me.", "</think>", "\n\n", "Hello", " there."]
CALLING = ["<think>", "Weather: a tool.", "</think>", "\n\n", "<tool_call>",
           '\n{"name": "get_weather", "arguments": {"city": "Paris"}}', "\n</tool_call>"]


def joined(deltas: list[dict[str, str]], key: str) -> str:
    return "".join(d.get(key) or "" for d in deltas)


@pytest.mark.parametrize("pieces", [
    ["<think>reasoning</think>\n\nanswer"],
    ["<", "think>reas", "oning</th", "ink>", "\n", "\nans", "wer"],
    ["  \n<think>\n", "reasoning", "</think>answer"],
])
def test_reasoning_and_answer_are_told_apart_however_the_text_is_cut(pieces: list[str]) -> None:
    split = ThinkSplit()
    deltas = [d for p in pieces for d in split.push(p)] + split.finish()
    assert (joined(deltas, "reasoning"), joined(deltas, "content")) == ("reasoning", "answer")


def test_a_reply_that_does_not_open_with_reasoning_is_all_answer() -> None:
    split = ThinkSplit()
    assert split.push("  ") == []  # may still open it
    assert split.push("<thank you>") == [{"content": "  <thank you>"}]
    assert split.push(" <think>no</think>") == [{"content": " <think>no</think>"}]


def test_a_prompt_that_opens_the_reasoning_starts_the_reply_inside_it() -> None:
    assert starts_inside("<|im_start|>assistant\n<think>\n") and not starts_inside("x")
    split = ThinkSplit(inside=True)
    deltas = split.push("mulling") + split.push("</thi") + split.push("nk>done") + split.finish()
    assert (joined(deltas, "reasoning"), joined(deltas, "content")) == ("mulling", "done")


def test_reasoning_cut_short_stays_reasoning() -> None:
    split = ThinkSplit()
    deltas = split.push("<think>still thinking</th") + split.finish()
    assert deltas == [{"reasoning": "still thinking"}, {"reasoning": "</th"}]


def client(pieces: list[str], thinks: bool = True) -> TestClient:
    return TestClient(create_app(make_settings(calibrate=False, max_tokens=16),
                                 PieceModel(pieces, thinks=thinks)))


ASK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


def test_chat_carries_reasoning_as_reasoning_content() -> None:
    with client(THOUGHT) as c:
        whole = c.post("/v1/chat/completions", json=ASK).json()["choices"][0]["message"]
        events = sse_events(c.post("/v1/chat/completions", json={**ASK, "stream": True}).text)
    assert (whole["reasoning_content"], whole["content"]) == ("The user greets me.",
                                                              "Hello there.")
    deltas = [e["choices"][0]["delta"] for e in events]
    assert joined(deltas, "reasoning_content") == whole["reasoning_content"]
    assert joined(deltas, "content") == whole["content"]


def test_a_model_whose_template_does_not_think_is_not_split() -> None:
    with client(THOUGHT, thinks=False) as c:
        message = c.post("/v1/chat/completions", json=ASK).json()["choices"][0]["message"]
    assert "reasoning_content" not in message and message["content"].startswith("<think>")


def test_thinking_switched_off_is_not_split() -> None:
    off = {**ASK, "chat_template_kwargs": {"enable_thinking": False}}
    with client(THOUGHT) as c:
        message = c.post("/v1/chat/completions", json=off).json()["choices"][0]["message"]
    assert "reasoning_content" not in message


def test_a_call_after_the_reasoning_is_a_call() -> None:
    with client(CALLING) as c:
        r = c.post("/v1/chat/completions", json={**ASK, "tools": [WEATHER]}).json()
    message = r["choices"][0]["message"]
    assert message["reasoning_content"] == "Weather: a tool." and message["content"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert r["choices"][0]["finish_reason"] == "tool_calls"


def anthropic_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_messages_carry_reasoning_as_a_thinking_block() -> None:
    body = {**ASK, "model": "any", "thinking": {"type": "adaptive"}}
    with client(THOUGHT) as c:
        whole = c.post("/v1/messages", json=body).json()
        events = anthropic_events(c.post("/v1/messages", json={**body, "stream": True}).text)
    assert whole["content"] == [
        {"type": "thinking", "thinking": "The user greets me.", "signature": ""},
        {"type": "text", "text": "Hello there."}]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert joined(deltas, "thinking") == "The user greets me."
    assert joined(deltas, "text") == "Hello there."
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1]


def test_responses_carry_reasoning_as_a_reasoning_item() -> None:
    body = {"input": "hi", "max_output_tokens": 16, "reasoning": {"effort": "low"}}
    with client(THOUGHT) as c:
        whole = c.post("/v1/responses", json=body).json()
        events = anthropic_events(c.post("/v1/responses", json={**body, "stream": True}).text)
    assert [item["type"] for item in whole["output"]] == ["reasoning", "message"]
    assert whole["output"][0]["content"] == [{"type": "reasoning_text",
                                              "text": "The user greets me."}]
    said = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert said == "The user greets me."
    done = events[-1]["response"]["output"]
    assert [item["type"] for item in done] == ["reasoning", "message"]
    assert done[1]["content"][0]["text"] == "Hello there."


# --- earlier turns' thinking, back into the prompt ---

THINKING_TEMPLATE = ("{% for m in messages %}{{ m.role }}: {% if m.reasoning_content %}"
                     "<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}\n"
                     "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")


class ThinkingTemplateModel(FakeModel):
    """A fake whose template renders an assistant's reasoning_content, as Qwen3's does."""

    def format_chat(self, messages: list[dict[str, Any]], tools: Any = None,
                    add_generation_prompt: bool = True, thinking: bool | None = None) -> str:
        return ChatTemplate(THINKING_TEMPLATE).render(messages, tools, add_generation_prompt)


def test_an_earlier_turn_s_reasoning_content_is_rendered_by_the_template() -> None:
    messages = [{"role": "user", "content": "fix it"},
                {"role": "assistant", "content": "done", "reasoning_content": "look first"},
                {"role": "user", "content": "thanks"}]
    with TestClient(create_app(make_settings(calibrate=False), ThinkingTemplateModel())) as c:
        prompt = c.post("/apply-template", json={"messages": messages}).json()["prompt"]
    assert prompt == ("user: fix it\nassistant: <think>look first</think>done\n"
                      "user: thanks\nassistant: ")


def test_anthropic_thinking_blocks_reach_the_prompt_as_reasoning_content() -> None:
    def counted(blocks: list[dict[str, Any]]) -> int:
        body = {"model": "any", "messages": [
            {"role": "user", "content": "fix it"}, {"role": "assistant", "content": blocks},
            {"role": "user", "content": "thanks"}]}
        return c.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
    said = {"type": "text", "text": "done"}
    thought = [{"type": "thinking", "thinking": "look ", "signature": "s"},
               {"type": "thinking", "thinking": "first", "signature": "s"}]
    with TestClient(create_app(make_settings(calibrate=False), ThinkingTemplateModel())) as c:
        assert counted([*thought, said]) - counted([said]) == len("<think>look first</think>")
        alone = counted(thought)  # thinking alone: an assistant turn with no text
    assert alone == len("user: fix it\nassistant: <think>look first</think>\n"
                        "user: thanks\nassistant: ")
