"""What real clients need beyond the fields they send (in process, over a fake model):
several choices, prefill, token counts, usage by each API's convention, a system message
in place, a JSON-looking reply that streams, llama-server's schema fields, CORS and the
per-request log line."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.apis.toolparse import HERMES, ToolStream, could_be_call
from lead.server.app import create_app
from tests.conftest import chat_body, make_settings
from tests.test_api import sse_events

CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


def app_over(model: FakeModel | None = None, **settings: Any) -> Any:
    return create_app(make_settings(calibrate=False, max_tokens=12, **settings),
                      model or FakeModel())


@pytest.fixture(scope="module")
def client() -> Any:
    with TestClient(app_over()) as c:
        yield c


def text_of(model: FakeModel, tokens: list[int]) -> str:
    return "".join(model.token_bytes(t).decode() for t in tokens)


# --- n choices ---


def test_n_choices_are_each_the_reply_of_its_own_seed(client: TestClient) -> None:
    body = chat_body("tell me", temperature=1.0, seed=5, max_tokens=10)
    many = client.post(CHAT, json={**body, "n": 3}).json()
    alone = [client.post(CHAT, json={**body, "seed": 5 + i}).json() for i in range(3)]
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in many["choices"]] == \
        [a["choices"][0]["message"]["content"] for a in alone]
    assert len({c["message"]["content"] for c in many["choices"]}) > 1  # seeds differ
    assert many["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"]  # once
    assert many["usage"]["completion_tokens"] == \
        sum(a["usage"]["completion_tokens"] for a in alone)


def test_n_choices_stream_each_with_its_index(client: TestClient) -> None:
    body = chat_body("tell me", temperature=1.0, seed=9, max_tokens=10, n=2)
    whole = client.post(CHAT, json=body).json()
    events = sse_events(client.post(CHAT, json={**body, "stream": True}).text)
    texts: dict[int, str] = defaultdict(str)
    finishes = {}
    for e in events:
        choice = e["choices"][0]
        texts[choice["index"]] += choice["delta"].get("content") or ""
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert dict(texts) == {c["index"]: c["message"]["content"] for c in whole["choices"]}
    assert set(finishes) == {0, 1}
    assert "usage" in events[-1] and events[-1]["usage"] == whole["usage"]


def test_more_choices_than_lead_can_hold_in_line_is_a_400() -> None:
    with TestClient(app_over(parallel=2, max_queue=1)) as c:
        r = c.post(CHAT, json=chat_body(n=4))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text


# --- prefill: an assistant message last is the reply's start ---


@pytest.mark.parametrize("path", [CHAT, MESSAGES])
def test_an_assistant_message_last_is_continued(path: str) -> None:
    model = FakeModel()
    messages = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "one, two,"}]
    with TestClient(app_over(model)) as c:
        r = c.post(path, json={"messages": messages, "max_tokens": 8})
    assert r.status_code == 200, r.text
    reply = r.json()
    text = reply["choices"][0]["message"]["content"] if path == CHAT else \
        reply["content"][0]["text"]
    prompt = model.tokenize("user: count\nassistant: one, two,")  # the fake's template
    assert text == text_of(model, model.greedy_continuation(prompt, 8))


def test_text_parts_join_by_a_newline_and_a_prefill_s_by_a_blank_line(
        client: TestClient) -> None:
    parts = [{"type": "text", "text": t} for t in ("Wh", "ill")]
    asked = {"messages": [{"role": "user", "content": parts},
                          {"role": "assistant", "content": parts}]}
    prompt = client.post("/apply-template", json=asked).json()["prompt"]
    assert prompt == "user: Wh\nill\nassistant: Wh\n\nill"  # as llama-server joins them


def test_anthropic_and_responses_text_blocks_join_as_chat_parts(client: TestClient) -> None:
    blocks = [{"type": "text", "text": t} for t in ("ab", "cd")]
    counted = client.post("/v1/messages/count_tokens", json={
        "model": "any", "messages": [{"role": "user", "content": blocks}]}).json()
    assert counted["input_tokens"] == len("user: ab\ncd\nassistant: ")
    parts = [{"type": "input_text", "text": t} for t in ("ab", "cd")]
    usage = client.post("/v1/responses", json={"max_output_tokens": 1, "input": [
        {"type": "message", "role": "user", "content": parts}]}).json()["usage"]
    assert usage["input_tokens"] == len("user: ab\ncd\nassistant: ")


def test_a_chat_reply_does_not_continue_a_message_before_the_users(client: TestClient) -> None:
    body = {"messages": [{"role": "assistant", "content": "hello"},
                         {"role": "user", "content": "hi"}], "max_tokens": 4}
    assert client.post(CHAT, json=body).json()["usage"]["prompt_tokens"] == \
        len("assistant: hello\nuser: hi\nassistant: ")


# --- Anthropic: count_tokens, usage net of the cache ---


def message(text: str = "what is up", **fields: Any) -> dict[str, Any]:
    return {"model": "any", "max_tokens": 4,
            "messages": [{"role": "user", "content": text}], **fields}


def test_count_tokens_counts_what_the_reply_s_prompt_holds(client: TestClient) -> None:
    body = message(system="be brief")
    counted = client.post("/v1/messages/count_tokens",
                          json={k: v for k, v in body.items() if k != "max_tokens"})
    assert counted.status_code == 200, counted.text
    usage = client.post(MESSAGES, json=body).json()["usage"]
    assert counted.json() == {"input_tokens": usage["input_tokens"] +
                              usage["cache_read_input_tokens"]}


def test_anthropic_input_tokens_are_those_not_read_from_the_cache() -> None:
    with TestClient(app_over()) as c:
        first = c.post(MESSAGES, json=message("the same question")).json()["usage"]
        again = c.post(MESSAGES, json=message("the same question")).json()["usage"]
        streamed = c.post(MESSAGES, json=message("the same question", stream=True)).text
    n_prompt = len("user: the same question\nassistant: ")
    assert (first["input_tokens"], first["cache_read_input_tokens"]) == (n_prompt, 0)
    # asked again: all but the last token come from the cache (it is evaluated to decode)
    assert (again["input_tokens"], again["cache_read_input_tokens"]) == (1, n_prompt - 1)
    start = next(line for line in streamed.splitlines() if '"message_start"' in line)
    assert '"input_tokens": 1,' in start and f'"cache_read_input_tokens": {n_prompt - 1}' in start


def test_chat_usage_says_how_much_of_the_prompt_was_cached() -> None:
    with TestClient(app_over()) as c:
        c.post(CHAT, json=chat_body("once more"))
        usage = c.post(CHAT, json=chat_body("once more")).json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": usage["prompt_tokens"] - 1}


def test_the_first_chunk_is_the_role_and_null_content_as_llama_server_sends(
        client: TestClient) -> None:
    events = sse_events(client.post(CHAT, json=chat_body(stream=True)).text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}


def test_include_usage_puts_usage_and_timings_in_a_last_chunk_with_no_choices(
        client: TestClient) -> None:
    body = chat_body(stream=True, stream_options={"include_usage": True})
    *_, finish, last = sse_events(client.post(CHAT, json=body).text)
    assert finish["choices"][0]["finish_reason"] and "usage" not in finish
    assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0
    assert last["timings"]["predicted_n"] == last["usage"]["completion_tokens"]


def progress_of(c: TestClient, text: str) -> list[dict[str, int]]:
    body = chat_body(text, stream=True, return_progress=True, max_tokens=2)
    return [e["prompt_progress"] for e in sse_events(c.post(CHAT, json=body).text)
            if "prompt_progress" in e]


def test_return_progress_tells_each_prompt_batch_as_it_is_evaluated() -> None:
    text = "a prompt of some forty characters or so"
    with TestClient(app_over(batch_size=8)) as c:
        cold, warm = progress_of(c, text), progress_of(c, text)
    total = len(f"user: {text}\nassistant: ")  # the fake's template, a token a character
    # found cached; each batch of 8 evaluated; the last, with the prompt's last token (its
    # first decoding step evaluates that), as one batch
    processed = [0, *range(8, total - 1, 8), total]
    assert [(p["total"], p["cache"], p["processed"]) for p in cold] == \
        [(total, 0, n) for n in processed]
    assert [(p["cache"], p["processed"]) for p in warm] == [(total - 1, total - 1),
                                                            (total - 1, total)]
    assert all(p["time_ms"] >= 0 for p in cold + warm)


def test_no_progress_unless_asked(client: TestClient) -> None:
    events = sse_events(client.post(CHAT, json=chat_body(stream=True)).text)
    assert not any("prompt_progress" in e for e in events)


def test_without_include_usage_the_finish_chunk_carries_usage_and_timings(
        client: TestClient) -> None:
    last = sse_events(client.post(CHAT, json=chat_body(stream=True)).text)[-1]
    assert last["choices"][0]["finish_reason"] and last["usage"]["completion_tokens"] > 0
    assert last["timings"]["prompt_n"] + last["timings"]["cache_n"] == \
        last["usage"]["prompt_tokens"]


# --- a system message after the start ---


class SystemFirstOnly(FakeModel):
    """A template as strict as many: a system message only first."""

    def __init__(self) -> None:
        super().__init__()
        self.rendered: list[str] = []

    def format_chat(self, messages: list[dict[str, Any]], tools: Any = None,
                    **switches: Any) -> str:
        if any(m["role"] == "system" for m in messages[1:]):
            raise ValueError("System message must be at the beginning.")
        self.rendered.append(super().format_chat(messages, tools, **switches))
        return self.rendered[-1]


def test_a_system_message_a_template_refuses_in_place_is_folded_into_the_next_user_turn(
        ) -> None:
    model = SystemFirstOnly()
    body = {"model": "any", "max_tokens": 3, "system": "you help",
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                         {"role": "system", "content": "be brief"},
                         {"role": "user", "content": "why"}]}
    with TestClient(app_over(model)) as c:
        assert c.post(MESSAGES, json=body).status_code == 200
    assert model.rendered[-1] == ("system: you help\nuser: hi\nassistant: yo\nuser: "
                                  "<system-reminder>\nbe brief\n</system-reminder>\n\nwhy\n"
                                  "assistant: ")


def test_a_system_message_the_template_takes_in_place_stays_there(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "hi"},
                         {"role": "system", "content": "now"}], "max_tokens": 2}
    assert client.post(CHAT, json=body).json()["usage"]["prompt_tokens"] == \
        len("user: hi\nsystem: now\nassistant: ")


# --- a reply with tools that looks like JSON but is no call ---


@pytest.mark.parametrize(("text", "can"), [
    ("", True), ("```js", True), ("```json\n", True), ('{"na', True), ('[{"name"', True),
    ('{"type": "function"', True), ('  {"arguments": {}', True),
    ('{"a": 1', False), ("[1, 2]", False), ("{}", False), ("```json\n[3", False),
])
def test_what_can_still_be_a_bare_call(text: str, can: bool) -> None:
    assert could_be_call(text) is can


@pytest.mark.parametrize(("text", "can"), [
    ('{"name"', True), ('{"name": ', True), ('{"name": "get_w', True),
    ('{"name": "get_weather"', True), ('```json\n{"name": "get_weather", "argu', True),
    ('{"name": "Alice"', False), ('{"name": "get_weatherman"', False),
    ('{"name": "get_x', False), ('{"name": 5', False),
])
def test_a_bare_call_s_name_must_be_a_tool_s(text: str, can: bool) -> None:
    """JSON shown to the user ({"name": "Alice", ...}) streams once its name is no tool's."""
    assert could_be_call(text, ["get_weather"]) is can


def test_json_that_is_no_call_streams_as_it_comes() -> None:
    stream = ToolStream(HERMES, ["get_weather"])
    assert stream.push('{"') == []  # may still be a call
    assert stream.push('city": "Par') == [{"content": '{"city": "Par'}]
    assert stream.push('is"}') == [{"content": 'is"}'}]
    assert stream.finish() == []


def test_a_bare_call_is_still_held_whole_and_parsed() -> None:
    stream = ToolStream(HERMES, ["get_weather"], new_id=lambda: "c1")
    held = stream.push('{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert held == []
    assert stream.finish() == [{"tool_calls": [{
        "index": 0, "id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}]


# --- llama-server's schema fields ---


SCHEMA = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "json_object", "schema": SCHEMA}},  # instructor's JSON_SCHEMA
    {"json_schema": SCHEMA},
])
def test_llama_server_s_schema_fields_hold_the_reply(client: TestClient,
                                                     fields: dict[str, Any]) -> None:
    r = client.post(CHAT, json=chat_body(max_tokens=8, **fields))
    assert r.status_code == 200, r.text  # enforced as far as the grammar can, as there
    assert r.json()["choices"][0]["message"]["content"].startswith("age:")  # the fake's JSON


# --- browsers and the log ---


def preflight(c: TestClient, origin: str) -> Any:
    return c.options(CHAT, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                    "Access-Control-Request-Headers": "authorization,content-type"})


@pytest.mark.parametrize(("setting", "origin", "allowed"), [
    ("local", "http://localhost:3000", True),
    ("local", "http://127.0.0.1:8080", True),
    ("local", "https://evil.example", False),
    ("https://chat.example.com", "https://chat.example.com", True),
    ("https://chat.example.com", "http://localhost:3000", False),
    ("*", "https://anyone.example", True),
    ("", "http://localhost:3000", False),
])
def test_a_page_on_another_origin_is_answered_where_cors_origins_allows_it(
        setting: str, origin: str, allowed: bool) -> None:
    with TestClient(app_over(cors_origins=setting, api_key="k")) as c:
        pre = preflight(c, origin)  # a browser's preflight carries no key
        call = c.post(CHAT, json=chat_body(max_tokens=2),
                      headers={"Origin": origin, "Authorization": "Bearer k"})
    # as llama-server: every preflight 200, the page allowed only where its origin is said
    assert pre.status_code == 200, pre.text
    assert (pre.headers.get("access-control-allow-origin") in (origin, "*")) is allowed
    said = call.headers.get("access-control-allow-origin")
    assert (said in (origin, "*")) is allowed, call.headers
    assert call.status_code == 200


def test_each_api_request_is_one_log_line_with_an_error_s_message(
        client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="lead"):
        client.post(CHAT, json=chat_body(max_tokens=2))
        client.post(CHAT, json=chat_body(max_tokens=2, functions=[{"name": "f"}]))
        client.get("/health")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("POST", "GET"))]
    assert len(lines) == 2, lines  # /health is polled: not logged
    assert lines[0].startswith("POST /v1/chat/completions 200 in ")
    assert lines[1].startswith("POST /v1/chat/completions 400 in ")
    assert lines[1].endswith("Unsupported parameter: 'functions' is not supported with this "
                             "model (the legacy form of tools: send tools).")


# --- a template's thinking switch ---


class Recording(FakeModel):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.rendered: list[str] = []

    def format_chat(self, messages: list[dict[str, Any]], tools: Any = None,
                    **switches: Any) -> str:
        self.rendered.append(super().format_chat(messages, tools, **switches))
        return self.rendered[-1]


@pytest.mark.parametrize(("path", "fields", "switch"), [
    (MESSAGES, {"thinking": {"type": "disabled"}}, "off"),
    (MESSAGES, {"thinking": {"type": "adaptive"}}, "on"),
    (MESSAGES, {"thinking": {"type": "enabled", "budget_tokens": 1024}}, "on"),
    (CHAT, {"chat_template_kwargs": {"enable_thinking": False}}, "off"),
    (CHAT, {"reasoning_effort": "none"}, "off"),
    (CHAT, {"reasoning_effort": "high"}, "on"),
    ("/v1/responses", {"reasoning": {"effort": "none"}}, "off"),
    ("/v1/responses", {"reasoning": {"effort": "medium", "summary": "auto"}}, "on"),
    (CHAT, {}, None),  # the template's own default
])
def test_thinking_settings_reach_a_template_that_switches_thinking(
        path: str, fields: dict[str, Any], switch: str | None) -> None:
    model = Recording(thinks=True)
    body = {"input": "hi", "max_output_tokens": 2} if path.endswith("responses") else \
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with TestClient(app_over(model)) as c:
        assert c.post(path, json={**body, **fields}).status_code == 200
    said = [line for line in model.rendered[-1].splitlines() if line.startswith("thinking:")]
    assert said == ([f"thinking: {switch}"] if switch else [])


def test_a_template_without_the_switch_gets_no_such_variable() -> None:
    model = Recording()  # thinks=False
    with TestClient(app_over(model)) as c:
        c.post(MESSAGES, json=message(thinking={"type": "adaptive"}))
    assert "thinking:" not in model.rendered[-1]


def test_a_clients_preconnect_head_is_answered(client: TestClient) -> None:
    """Claude Code's first request is HEAD / (its runtime's preconnect)."""
    r = client.head("/")
    assert r.status_code == 200 and r.content == b""


@pytest.mark.parametrize("max_tokens", [1, 5])
def test_a_streamed_message_that_ends_at_its_first_token_starts_with_its_usage(
        max_tokens: int) -> None:
    """Its generation has ended before the stream starts (a 500 once)."""
    with TestClient(app_over(FakeModel(eos_bias=100.0))) as c:
        r = c.post(MESSAGES, json=message(max_tokens=max_tokens, stream=True))
    assert r.status_code == 200, r.text
    start = next(line for line in r.text.splitlines() if '"message_start"' in line)
    n_prompt = len("user: what is up\nassistant: ")
    assert f'"input_tokens": {n_prompt},' in start, start


# --- a long wait for the first token ---


class SlowPrompt(FakeModel):
    """A prompt that takes a while to read (an agent's 20k tokens on a CPU take minutes)."""

    def _append(self, cached: Any, tokens: Any, n_logits: int, abort: Any = None) -> Any:
        if len(tokens) > 4:
            time.sleep(1.0)  # the model's own time, not the test's synchronisation
        return super()._append(cached, tokens, n_logits, abort)


@pytest.mark.parametrize("path", [CHAT, MESSAGES, "/v1/responses"])
def test_a_stream_waiting_for_its_first_token_is_kept_alive(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients give up on a stream silent for 300 s (Claude Code, Codex): while a reply
    waits for its turn and its prompt, comment lines keep it alive, and SDKs skip them."""
    monkeypatch.setattr("lead.apis.streaming.KEEPALIVE_S", 0.05)
    body = {"input": "hello there", "max_output_tokens": 3} if path.endswith("responses") \
        else {"model": "any", "max_tokens": 3, "messages": [{"role": "user",
                                                             "content": "hello there"}]}
    with TestClient(app_over(SlowPrompt())) as c:
        text = c.post(path, json={**body, "stream": True}).text
    lines = [line for line in text.splitlines() if line]
    said = next(i for i, line in enumerate(lines) if not line.startswith(":"))
    assert said >= 1 and lines[0].startswith(": waiting for the first token"), text[:300]
    assert not any(line.startswith(":") for line in lines[said:])  # only before the first
    assert any(end in lines[-1] for end in ("[DONE]", "message_stop", "response.incomplete"))
