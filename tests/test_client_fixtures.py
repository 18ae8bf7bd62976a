"""The first requests the coding agents send, and their requests carrying a tool's result,
recorded (tests/fixtures/clients/, bodies verbatim; recorded 2026-11-27 against a stub
server from Claude Code 2.1.197, Codex CLI 0.171.0, opencode 1.18.33, qwen-code 0.15.10
and aider 0.86.2, the versions `make clients` pins), each posted as its client posts it to
a lead in process: a 200 and a whole reply in its API's own shape, streamed, as every one
of them asks. Over a fake model that answers "Hi." and ends (so the bodies' max_tokens of
32000 cost nothing), twice: one whose template has a call format (Hermes, as
Qwen2.5-Coder's), and one without (the generic JSON format, as SmolLM2). The clients
themselves run against lead in tests/test_clients.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from lead.apis.generictools import INTRO
from lead.server.app import create_app
from tests.conftest import make_settings
from tests.scripted_lead import ScriptedReplies
from tests.test_api import sse_events

FIXTURES = Path(__file__).parent / "fixtures" / "clients"
MESSAGES, RESPONSES, CHAT = "/v1/messages?beta=true", "/v1/responses", "/v1/chat/completions"
SENT = {  # each recorded body, and where its client posted it
    "claude-code-first": MESSAGES,
    "claude-code-toolresult": MESSAGES,  # its Read tool's result, a thinking block sent back
    "codex-first": RESPONSES,
    "codex-toolresult": RESPONSES,  # exec_command's output, a reasoning item sent back
    "codex-catalog-model-first": RESPONSES,  # model "gpt-5.5": custom and tool_search tools
    "opencode-title": CHAT,  # opencode's first request: a title for the session
    "opencode-first": CHAT,
    "opencode-toolresult": CHAT,  # reasoning_content sent back, a tool message
    "qwen-code-first": CHAT,
    "qwen-code-toolresult": CHAT,  # the tool's result as a list of text parts
    "aider-first": CHAT,
}
CONTEXT = 1 << 18  # tokens: the fake's are characters, and Claude Code's body has 85k
REPLY = "Hi."
GENERIC_INTRO = INTRO.split(".")[0]  # "You can call these tools": the fake reads it


def body_of(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


class AnyText:
    """A grammar's state that allows every token (the fake's own grammars hold only
    literals; the reply's shape is the real converter's business, tested elsewhere)."""

    def allows(self, token_id: int) -> bool:
        return True

    def mask(self, row: np.ndarray) -> np.ndarray:
        return row.copy()

    def advanced(self, tokens: Sequence[int]) -> AnyText:
        return self


class NoCallFormat(ScriptedReplies):
    """The reply on a template without a call format: where the request has tools, they go
    the generic JSON way (described in a system message, the reply held by a grammar whose
    bounds lead checks as for a real model), and the reply is the answer in that format."""

    def __init__(self, **kw: Any) -> None:
        super().__init__([(GENERIC_INTRO, json.dumps({"response": REPLY})), ("", REPLY)], **kw)
        self.chat_template = None

    def schema_grammar(self, schema: dict[str, Any], strict: bool = True) -> str:
        super().schema_grammar(schema, strict=False)  # the bounds and shapes checked
        return 'root ::= "x"'

    def constraint(self, gbnf: str) -> AnyText:  # type: ignore[override]
        return AnyText()


MODELS = {"a call format": lambda: ScriptedReplies([("", REPLY)], n_ctx=CONTEXT),
          "no call format": lambda: NoCallFormat(n_ctx=CONTEXT)}


@pytest.fixture(scope="module", params=list(MODELS))
def lead(request: pytest.FixtureRequest) -> Any:
    with TestClient(create_app(make_settings(calibrate=False), MODELS[request.param]())) as c:
        yield c


def post(lead: TestClient, name: str) -> str:
    body = body_of(name)
    assert body["stream"] is True  # every client here streams
    r = lead.post(SENT[name], json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return r.text


def named_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """A stream's (event name, data) pairs (Anthropic's and Responses' streams name each)."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        out.append((lines.get("event", ""), json.loads(lines["data"])))
    return out


@pytest.mark.parametrize("name", [n for n, path in SENT.items() if path == MESSAGES])
def test_claude_codes_requests_get_a_whole_message_stream(lead: TestClient, name: str) -> None:
    events = named_events(post(lead, name))
    kinds = [kind for kind, _ in events]
    assert all(kind == data["type"] for kind, data in events), kinds
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    start = events[0][1]["message"]
    assert start["role"] == "assistant" and start["usage"]["input_tokens"] > 10_000
    text = "".join(d["delta"]["text"] for k, d in events
                   if k == "content_block_delta" and d["delta"]["type"] == "text_delta")
    assert text == REPLY
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    opened = [d["index"] for k, d in events if k == "content_block_start"]
    closed = [d["index"] for k, d in events if k == "content_block_stop"]
    assert opened == closed == [0]


@pytest.mark.parametrize("name", [n for n, path in SENT.items() if path == RESPONSES])
def test_codexs_requests_get_a_whole_response_stream(lead: TestClient, name: str) -> None:
    events = named_events(post(lead, name))
    kinds = [kind for kind, _ in events]
    assert all(kind == data["type"] for kind, data in events), kinds
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    numbers = [data["sequence_number"] for _, data in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    done = events[-1][1]["response"]
    assert done["status"] == "completed" and done["usage"]["input_tokens"] > 5_000
    (message,) = [item for item in done["output"] if item["type"] == "message"]
    assert message["content"][0]["text"] == REPLY
    assert "".join(d["delta"] for k, d in events if k == "response.output_text.delta") == REPLY


@pytest.mark.parametrize("name", [n for n, path in SENT.items() if path == CHAT])
def test_the_chat_clients_requests_get_a_whole_chunk_stream(lead: TestClient, name: str) -> None:
    chunks = sse_events(post(lead, name))  # (ends with data: [DONE])
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[0]["delta"]["role"] == "assistant"
    assert "".join(c["delta"].get("content") or "" for c in choices) == REPLY
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["stop"]
    assert not any(c["delta"].get("tool_calls") for c in choices)
    usage = chunks[-1]["usage"]  # as stream_options.include_usage asks (aider does not)
    assert usage["prompt_tokens"] > 500 and usage["completion_tokens"] > 0


def test_the_fixtures_are_the_clients_bodies_verbatim() -> None:
    """What each records, as its client sent it (these fields are what lead must take)."""
    claude, codex = body_of("claude-code-first"), body_of("codex-first")
    assert claude["thinking"] == {"type": "adaptive"} and claude["messages"][1]["role"] == \
        "system" and len(claude["tools"]) == 25 and claude["max_tokens"] == 32000
    assert codex["include"] == ["reasoning.encrypted_content"] and "instructions" not in codex
    assert {t["type"] for t in codex["tools"]} == {"function", "namespace", "web_search"}
    result = body_of("claude-code-toolresult")["messages"]
    assert result[2]["content"][0]["type"] == "thinking"  # sent back, signature and all
    assert result[3]["content"][0]["type"] == "tool_result"
    tool = body_of("qwen-code-toolresult")["messages"][-1]
    assert tool["role"] == "tool" and isinstance(tool["content"], list)
    assert set(SENT) == {p.stem for p in FIXTURES.glob("*.json")}
