"""Every request field is honoured, harmless by definition, or a 400 that names it; chat
roles and templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.apis import fields
from lead.server.app import create_app
from shared.chat_template import ChatTemplate, continued
from tests.conftest import chat_body, make_settings

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(make_settings(max_tokens=4), FakeModel()))


def post(client: TestClient, path: str, **fields: object) -> tuple[int, dict]:
    base = chat_body(max_tokens=2) if path == CHAT else {"prompt": "ab", "max_tokens": 2}
    r = client.post(path, json={**base, **fields})
    return r.status_code, r.json()


REFUSED = [
    (CHAT, {"tools": [{"type": "shell"}]}, "tools[0].type"),  # functions only
    (CHAT, {"tool_choice": "auto"}, "tool_choice"),  # without tools
    (COMPLETIONS, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    (CHAT, {"functions": [{"name": "f"}]}, "functions"),
    (CHAT, {"function_call": "auto"}, "function_call"),
    (CHAT, {"audio": {"voice": "alloy"}}, "audio"),
    (CHAT, {"modalities": ["text", "audio"]}, "modalities"),
    (CHAT, {"web_search_options": {}}, "web_search_options"),
    (COMPLETIONS, {"echo": True}, "echo"),
    (COMPLETIONS, {"best_of": 3}, "best_of"),
    (COMPLETIONS, {"suffix": "return x"}, "suffix"),
    (CHAT, {"messages": [{"role": "assistant", "content": "",
                          "tool_calls": [{"id": "1", "type": "function"}]}]},
     "messages[0].tool_calls[0].function"),
    (CHAT, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}, "messages[0].content[1].type"),
]


@pytest.mark.parametrize(("path", "fields", "param"), REFUSED, ids=[r[2] for r in REFUSED])
def test_what_would_silently_change_the_reply_is_a_400_naming_it(
        client: TestClient, path: str, fields: dict, param: str) -> None:
    status, body = post(client, path, **fields)
    assert status == 400, body
    assert body["error"]["param"] == param, body
    assert param in body["error"]["message"], body
    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(("fields", "code", "words"), [
    ({"functions": [{"name": "f"}]}, "unsupported_parameter",
     "Unsupported parameter: 'functions' is not supported with this model"),
    ({"modalities": ["text", "audio"]}, "unsupported_value",
     "Unsupported value: 'modalities' does not support ['text', 'audio'] with this model"),
])
def test_a_refusal_is_in_openai_s_own_words_and_code(client: TestClient, fields: dict,
                                                     code: str, words: str) -> None:
    _, body = post(client, CHAT, **fields)
    assert body["error"]["code"] == code and body["error"]["message"].startswith(words), body


ACCEPTED = [
    (CHAT, {"user": "u-1", "metadata": {"k": "v"}, "store": True, "service_tier": "auto"}),
    (CHAT, {"stream": True, "stream_options": {"include_usage": True}}),
    (CHAT, {"n": 1, "parallel_tool_calls": False, "tool_choice": "none"}),
    (CHAT, {"response_format": {"type": "text"}, "modalities": ["text"]}),
    (CHAT, {"prompt_cache_key": "k", "prompt_cache_retention": "24h", "verbosity": "low",
            "safety_identifier": "s", "reasoning_effort": "high"}),
    (CHAT, {"prediction": {"type": "content", "content": "abc"}}),
    (CHAT, {"cache_prompt": True, "id_slot": 2, "samplers": ["top_k", "temperature"],
            "chat_template_kwargs": {"enable_thinking": False}}),
    (CHAT, {"no_such_field": 1, "another": {"x": 1}}),  # ignored, and logged
    (COMPLETIONS, {"echo": False, "best_of": 1, "suffix": ""}),
    (CHAT, {"tools": None, "functions": None, "no_such_field": None}),  # null: not set
    (CHAT, {"messages": [{"role": "user", "content": "hi", "name": "ann"},
                         {"role": "assistant", "content": "yes", "refusal": None,
                          "reasoning_content": "thought", "annotations": [],
                          "tool_calls": []}, {"role": "user", "content": "go on"}]}),
]


@pytest.mark.parametrize(("path", "fields"), ACCEPTED)
def test_what_changes_nothing_the_client_relies_on_is_accepted(
        client: TestClient, path: str, fields: dict) -> None:
    status, body = post(client, path, **fields) if not fields.get("stream") else \
        (client.post(path, json={**chat_body(max_tokens=2), **fields}).status_code, {})
    assert status == 200, body


def test_a_field_no_api_knows_is_logged(client: TestClient,
                                        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="lead"):
        assert post(client, CHAT, no_such_field=1)[0] == 200
    assert any("no_such_field" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("table", ["CHAT", "COMPLETIONS", "RESPONSES", "MESSAGES", "INFILL"])
def test_each_field_of_each_table_is_in_the_api_docs(table: str) -> None:
    """docs/api.md's tables say what lead does with each field, as lead/apis/fields.py."""
    docs = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    for name, rule in getattr(fields, table).items():
        assert f"| `{name}` | {rule.verdict} | {rule.why} |" in docs, (table, name)


# What duo's own clients send (chat/client.py, lead/server/web/app.js, bench/runs.py,
# bench/acceptance.py) stays accepted.
OWN_CLIENTS = [
    {"stream": True, "max_tokens": 3, "temperature": 0.0},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x"}],
     "stream": True, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
     "max_tokens": 3, "seed": 4},
    {"max_tokens": 3, "stream": False, "temperature": 0.5, "seed": 1000},
]


@pytest.mark.parametrize(("fields", "param"), [
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),  # (a union)
    ({"stop": [1]}, "stop"),
    ({"temperature": "hot"}, "temperature"),
    ({"mirostat": 3}, "mirostat"),  # llama-server's samplers: their values checked
    ({"dry_sequence_breakers": []}, "dry_sequence_breakers"),
    ({"xtc_threshold": 1.5}, "xtc_threshold"),
    ({"typical_p": -0.1}, "typical_p"),
])
def test_a_value_of_the_wrong_type_is_a_400_naming_it_as_the_request_writes_it(
        client: TestClient, fields: dict, param: str) -> None:
    status, body = post(client, CHAT, **fields)
    assert status == 400 and body["error"]["param"] == param, body
    assert body["error"]["message"].startswith(f"{param}: "), body


@pytest.mark.parametrize(("raw", "says"), [
    ('{"messages":', "the body is not valid JSON: Expecting value (at character 12)"),
    ("", "the body is empty or not a JSON object"),
    ("[1]", "the body is empty or not a JSON object"),
])
def test_a_body_that_is_no_json_object_is_a_400_saying_so(client: TestClient, raw: str,
                                                           says: str) -> None:
    r = client.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(says), r.text
    assert r.json()["error"]["param"] is None


@pytest.mark.parametrize("fields", OWN_CLIENTS)
def test_what_duos_own_clients_send_is_accepted(client: TestClient, fields: dict) -> None:
    assert client.post(CHAT, json={**chat_body(), **fields}).status_code == 200


@pytest.mark.parametrize(("fields", "param"), [
    ({"logit_bias": {"96": 1.0}}, "logit_bias"),  # the fake's vocabulary is 96 tokens
    ({"logit_bias": {"word": 1.0}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"repeat_last_n": -2}, "repeat_last_n"),
])
def test_penalties_and_bias_out_of_range_are_400(client: TestClient, fields: dict,
                                                 param: str) -> None:
    status, body = post(client, CHAT, **fields)
    assert status == 400 and body["error"]["param"].startswith(param), body


def test_penalties_and_bias_in_range_are_served(client: TestClient) -> None:
    status, body = post(client, CHAT, frequency_penalty=-2, presence_penalty=2,
                        repeat_penalty=1.3, repeat_last_n=-1, logit_bias={"95": -100, "3": 100})
    assert status == 200, body


# --- roles and chat templates ---

class StrictTemplate(FakeModel):
    """A chat template as strict as many in GGUF files: system, user and assistant only,
    user and assistant in turn. It raises ValueError, as shared/llama/model.py's templates do."""

    def format_chat(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None, **switches: Any) -> str:
        turns = [m["role"] for m in messages if m["role"] != "system"]
        unknown = set(turns) - {"user", "assistant"}
        if unknown:
            raise ValueError(f"unknown role {unknown.pop()}")
        if any(a == b for a, b in zip(turns, turns[1:], strict=False)):
            raise ValueError("Conversation roles must alternate user/assistant/user/assistant")
        return super().format_chat(messages, tools, **switches)


@pytest.fixture(scope="module")
def strict() -> TestClient:
    return TestClient(create_app(make_settings(max_tokens=6), StrictTemplate()))


def test_the_developer_role_is_the_system_role(strict: TestClient) -> None:
    def reply(role: str) -> dict:
        r = strict.post(CHAT, json={"messages": [{"role": role, "content": "be brief"},
                                                 {"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        return r.json()

    developer, system = reply("developer"), reply("system")
    assert developer["choices"] == system["choices"]  # (the second drafted from the first)
    assert developer["usage"]["prompt_tokens"] == system["usage"]["prompt_tokens"]


def test_a_template_refusing_the_messages_is_a_400_with_its_message(strict: TestClient) -> None:
    r = strict.post(CHAT, json={"messages": [{"role": "user", "content": "a"},
                                             {"role": "user", "content": "b"}]})
    assert r.status_code == 400 and "must alternate" in r.json()["error"]["message"], r.text
    assert strict.post(CHAT, json=chat_body()).status_code == 200


@pytest.mark.parametrize(("template", "fragment"), [
    ("{% if messages[0].role != 'user' %}{{ raise_exception('user first, please') }}"
     "{% endif %}{{ messages[0].content }}", "user first, please"),
    ("{{ messages[0].content.nope() }}", "nope"),  # a template bug: jinja2's UndefinedError
    ("{% for m in messages %}{{ m.content + 1 }}{% endfor %}", "str"),  # a TypeError
])
def test_a_gguf_templates_errors_become_value_errors(template: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ChatTemplate(template).render([{"role": "system", "content": "x"}])


def test_a_template_s_thinking_switch_is_rendered_as_the_request_sets_it() -> None:
    template = ChatTemplate("{% if enable_thinking is defined and not enable_thinking %}"
                            "<think></think>{% endif %}{{ messages[0].content }}"
                            "{% if add_generation_prompt %}>{% endif %}")
    said = [{"role": "user", "content": "x"}]
    assert template.thinking_switch
    assert template.render(said, thinking=False) == "<think></think>x>"
    assert template.render(said, thinking=True) == template.render(said) == "x>"
    assert template.render(said, add_generation_prompt=False) == "x"
    assert not ChatTemplate("{{ messages[0].content }}").thinking_switch


@pytest.mark.parametrize(("rendered", "text", "prompt"), [
    ("<|im_start|>assistant\n1, 2,<|im_end|>\n", "1, 2,", "<|im_start|>assistant\n1, 2,"),
    ("A: 1, 2,</s>", "1, 2, ", "A: 1, 2,"),  # a template that strips the text's ends
    ("A: hi</s>", "bye", None),  # not rendered as given
])
def test_a_prefill_continues_right_after_the_assistant_s_text(rendered: str, text: str,
                                                              prompt: str | None) -> None:
    assert continued(rendered, text) == prompt
