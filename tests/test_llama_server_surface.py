"""More of llama-server's surface on lead: its chat template flags (--chat-template NAME or
Jinja, --no-jinja through llama.cpp's built-in templates, --reasoning), /models' aliases and
tags, GET /slots, /chat/completions/input_tokens, a chat request's add_generation_prompt and
continue_final_message, __verbose, its error type for a prompt over the context, and its
CORS answers."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.server.app import create_app
from shared.chat_template import ChatTemplate
from shared.llama.chat import BuiltinTemplate
from tests.conftest import chat_body, make_settings

QWEN3_LIKE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
              "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>"
              "\n\n{% endif %}{% endif %}")
R1_LIKE = "{% for m in messages %}{{ m.content }}{% endfor %}{{ '<Assistant><think>\\n' }}"
TURN = [{"role": "user", "content": "What is today?"}]


def client(n_slots: int = 1, **settings: Any) -> TestClient:
    return TestClient(create_app(make_settings(calibrate=False, **settings),
                                 FakeModel(slots=n_slots)))


def test_no_jinja_renders_llama_cpp_s_built_in_template_by_name() -> None:
    messages = [{"role": "system", "content": "Book"}, {"role": "user", "content": "Hi"}]
    assert BuiltinTemplate("llama3").render(messages) == (
        "<|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|><|start_header_id|>user"
        "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert BuiltinTemplate("chatml").render(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nBook<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def test_no_jinja_refuses_tools_and_an_unknown_name_in_llama_server_s_words() -> None:
    with pytest.raises(ValueError, match="tools param requires --jinja flag"):
        BuiltinTemplate("chatml").render(TURN, tools=[{"type": "function"}])
    with pytest.raises(ValueError, match="no built-in chat template like 'no such'"):
        BuiltinTemplate("no such")


@pytest.mark.parametrize(("default", "ending"), [
    (True, "<|im_start|>assistant\n"), (False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    (None, "<|im_start|>assistant\n")])
def test_reasoning_sets_the_template_s_switch_where_a_request_does_not(
        default: bool | None, ending: str) -> None:
    template = ChatTemplate(QWEN3_LIKE)
    template.thinking = default
    assert template.render(TURN).endswith(ending)
    assert template.render(TURN, thinking=True).endswith("<|im_start|>assistant\n")


def test_reasoning_off_closes_the_reasoning_a_template_opens_regardless() -> None:
    template = ChatTemplate(R1_LIKE)
    assert template.render(TURN).endswith("<think>\n")
    template.thinking = False
    assert template.render(TURN).endswith("<think>\n</think>")


def test_a_template_gets_today_as_llama_3_s_date_string() -> None:
    import datetime
    text = ChatTemplate("{{ date_string }}").render(TURN)
    assert text == datetime.date.today().strftime("%d %b %Y")


def test_models_lists_every_alias_and_tag_its_id_the_first_in_order() -> None:
    c = client(alias="tinyllama-2,fim,code", tags="chat,fim,small")
    card = c.get("/models").json()["data"][0]
    assert (card["id"], set(card["aliases"]), set(card["tags"])) == \
        ("code", {"tinyllama-2", "fim", "code"}, {"chat", "fim", "small"})
    assert c.post("/v1/chat/completions", json=chat_body(max_tokens=2)).json()["model"] == "code"


def test_slots_lists_each_slot_or_is_llama_server_s_501_without_slots() -> None:
    slots = client(2, parallel=2).get("/slots").json()
    assert [(s["id"], s["is_processing"]) for s in slots] == [(0, False), (1, False)]
    refused = client(slots=False).get("/slots")
    assert refused.status_code == 501
    assert refused.json()["error"]["type"] == "not_supported_error"


def test_input_tokens_counts_the_prompt_a_chat_would_have() -> None:
    c = client()
    body = chat_body("count me", max_tokens=2)
    counted = c.post("/chat/completions/input_tokens", json=body).json()["input_tokens"]
    assert counted == c.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]


def test_add_generation_prompt_and_continue_final_message_as_llama_server_takes_them() -> None:
    c = client()
    turn = {"messages": [{"role": "user", "content": "hi"}]}
    with_header = c.post("/apply-template", json=turn).json()["prompt"]
    without = c.post("/apply-template", json={**turn, "add_generation_prompt": False})
    assert without.status_code == 200 and with_header.startswith(without.json()["prompt"])
    assert without.json()["prompt"] != with_header
    both = c.post("/v1/chat/completions", json=chat_body(
        max_tokens=2, add_generation_prompt=True, continue_final_message=True))
    assert both.status_code == 400 and "Cannot set both" in both.json()["error"]["message"]
    assert c.post("/v1/chat/completions", json=chat_body(max_tokens=2)).status_code == 200
    two = c.post("/v1/chat/completions", json={"max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": "b"}]})
    assert two.status_code == 400 and "2 or more assistant messages" in two.text


def test_verbose_replies_carry_the_prompt_the_model_was_given() -> None:
    c = client()
    body = chat_body("show me", max_tokens=2)
    prompt = c.post("/apply-template", json=body).json()["prompt"]
    said = c.post("/v1/chat/completions", json={**body, "verbose": True}).json()
    assert said["__verbose"]["prompt"] == prompt
    assert "__verbose" not in c.post("/v1/chat/completions", json=body).json()
    assert client(verbose=True).post("/v1/chat/completions",
                                     json=body).json()["__verbose"]["prompt"] == prompt


def test_a_prompt_over_the_context_has_llama_server_s_type_and_counts() -> None:
    c = client()
    error = c.post("/v1/chat/completions", json=chat_body("x" * 9000)).json()["error"]
    assert (error["type"], error["code"]) == ("exceed_context_size_error",
                                              "context_length_exceeded")
    assert error["n_prompt_tokens"] > error["n_ctx"] == FakeModel().n_ctx


@pytest.mark.parametrize(("setting", "origin", "allowed"), [
    ("localhost", "http://[::1]:3000", True), ("localhost", "http://localhost.evil.com", False),
    ("*", "https://web.example", True)])
def test_a_preflight_is_answered_as_llama_server_answers_it(setting: str, origin: str,
                                                           allowed: bool) -> None:
    r = client(cors_origins=setting).options("/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization"})
    assert r.status_code == 200
    assert (r.headers.get("access-control-allow-origin") == origin) is allowed
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert r.headers["access-control-allow-headers"] == "*"
