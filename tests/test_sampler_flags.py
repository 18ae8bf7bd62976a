"""llama-server's sampling flags (--top-k, --min-p, ...): what a request that leaves a
sampler's field out gets, on every API; a request's own value wins."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from lead.apis import anthropic, responses, shapes
from lead.apis.prepare import Defaults, prepare_chat
from lead.server.app import create_app
from lead.server.settings import LeadSettings
from shared.cli import parse_settings
from tests.conftest import chat_body, make_settings

PRESET = {"top_k": 7, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1}


def params_of(body: shapes.ChatRequest, preset: dict[str, object]) -> object:
    return prepare_chat(FakeModel(), Defaults(samplers=preset), body).req.params


def test_the_flags_are_llama_servers_and_only_those_given_count() -> None:
    s = parse_settings(LeadSettings, "lead", "", ["--top-k", "7", "--top-p", "0.9",
                                                  "--min-p", "0.05", "--repeat-penalty",
                                                  "1.1"])
    assert s.sampler_preset() == PRESET
    assert parse_settings(LeadSettings, "lead", "", []).sampler_preset() == {}


@pytest.mark.parametrize("argv", [["--top-p", "0"], ["--min-p", "1"], ["--top-k", "-1"]])
def test_a_bad_value_is_a_one_line_error(argv: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(LeadSettings, "lead", "", argv)
    assert argv[0].removeprefix("--") in capsys.readouterr().err


def test_a_field_left_out_takes_the_flag_and_one_given_keeps_its_own() -> None:
    left_out = params_of(shapes.ChatRequest(**chat_body()), PRESET)
    assert (left_out.top_k, left_out.top_p, left_out.min_p, left_out.repeat_penalty) == \
        (7, 0.9, 0.05, 1.1)
    own = params_of(shapes.ChatRequest(**chat_body(top_k=3, top_p=1.0)), PRESET)
    assert (own.top_k, own.top_p, own.min_p) == (3, 1.0, 0.05)
    assert params_of(shapes.ChatRequest(**chat_body()), {}).top_k == 0  # no flag: off


def test_anthropic_and_responses_requests_take_the_flags_where_they_leave_fields_out() -> None:
    message = {"role": "user", "content": "hi"}
    chat, _ = anthropic.to_chat(anthropic.MessagesRequest(
        model="m", max_tokens=8, messages=[message], top_p=0.5))
    params = params_of(chat, PRESET)
    assert (params.top_k, params.top_p) == (7, 0.5)
    chat, _, _ = responses.to_chat(responses.ResponsesRequest(model="m", input="hi"))
    assert params_of(chat, PRESET).top_p == 0.9


def test_top_k_1_from_the_flag_samples_as_greedy_at_any_temperature() -> None:
    greedy = TestClient(create_app(make_settings(), FakeModel()))
    want = greedy.post("/v1/chat/completions", json=chat_body(max_tokens=12)).json()
    flagged = TestClient(create_app(make_settings(top_k=1, temp=1.0), FakeModel()))
    for seed in range(4):
        got = flagged.post("/v1/chat/completions",
                           json=chat_body(max_tokens=12, seed=seed)).json()
        assert got["choices"][0]["message"] == want["choices"][0]["message"]
    props = flagged.get("/props").json()["default_generation_settings"]["params"]
    assert props["top_k"] == 1 and props["temperature"] == 1.0
