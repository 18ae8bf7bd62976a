"""A call's text held no longer than it takes to decide (lead/apis/toolparse.py): a bare
call emitted as soon as its JSON closes, text that cannot be a call streamed at once, and
a call still open past HOLD_LIMIT streamed as content, yet still a call if it closes as
one. Fake text, cut into 4-character "tokens"; streamed and whole replies agree."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lead.apis import toolparse
from lead.apis.toolparse import (
    BAD,
    DONE,
    HERMES,
    HOLD_LIMIT,
    LLAMA3,
    MISTRAL,
    OPEN,
    CallFormat,
    Delta,
    ToolStream,
    call_end,
    parse_reply,
)

TOOLS = {"get_weather", "write_file"}
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
LYON = '{"name": "get_weather", "arguments": {"city": "Lyon"}}'
# The reply: a call whose JSON never closes, 1,024 tokens of it.
UNCLOSED = ('{"name": "get_weather", "arguments": {"city": "' + "Paris, " * 600)[:4096]
# The model: call objects one after another, none of them closed.
UNCLOSED_OBJECT = '{"name": "get_weather", "arguments": {"city": "Paris"}\n'
FILE = "x = 1\\n" * 500  # 3,000 characters of a file, as a JSON string holds them
WRITE = {"path": "a.py", "content": "x = 1\n" * 500}
WRITE_CALL = '{"name": "write_file", "arguments": {"path": "a.py", "content": "' + FILE + '"}}'


def ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def tokens(text: str, size: int = 4) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def pushed(fmt: CallFormat, chunks: list[str]) -> tuple[list[list[Delta]], list[Delta]]:
    """Each push's deltas, and finish's."""
    stream = ToolStream(fmt, TOOLS, ids())
    return [stream.push(chunk) for chunk in chunks], stream.finish()


def calls_in(deltas: list[Delta]) -> list[dict[str, Any]]:
    return [{k: v for k, v in d["tool_calls"][0].items() if k != "index"}
            for d in deltas if "tool_calls" in d]


def agrees(fmt: CallFormat, reply: str, chunks: list[str]) -> tuple[str | None, list[Any]]:
    """The reply parsed whole, after checking the stream of `chunks` gives the same."""
    per_push, last = pushed(fmt, chunks)
    deltas = [d for ds in per_push for d in ds] + last
    content = "".join(d.get("content", "") for d in deltas)
    whole = parse_reply(fmt, reply, TOOLS, ids())
    assert (content, calls_in(deltas)) == (whole[0] or "", whole[1])
    return whole


def first_sent(per_push: list[list[Delta]]) -> int:
    return next(i for i, ds in enumerate(per_push) if ds)


# --- held no longer than it takes to decide ---

@pytest.mark.parametrize("fmt", [HERMES, LLAMA3])
def test_a_bare_call_never_closed_streams_long_before_the_reply_ends(fmt: CallFormat) -> None:
    chunks = tokens(UNCLOSED)
    assert len(chunks) == 1024
    per_push, last = pushed(fmt, chunks)
    assert first_sent(per_push) == HOLD_LIMIT // 4  # the chunk that crosses the bound
    assert sum(1 for ds in per_push if ds) == 1024 - HOLD_LIMIT // 4  # then every one
    assert calls_in(last) == []
    assert agrees(fmt, UNCLOSED, chunks) == (UNCLOSED, [])


def test_call_objects_left_open_stream_at_the_first_that_cannot_be_one() -> None:
    reply = UNCLOSED_OBJECT * 40
    per_push, _ = pushed(HERMES, tokens(reply))
    assert first_sent(per_push) == len(UNCLOSED_OBJECT) // 4  # the second "{": no call
    assert agrees(HERMES, reply, tokens(reply)) == (reply, [])


def test_a_marker_never_closed_streams_past_the_bound_marker_and_all() -> None:
    reply = "Checking.\n<tool_call>\n" + UNCLOSED
    per_push, last = pushed(HERMES, tokens(reply))
    held = [d["content"] for ds in per_push[first_sent(per_push) + 1:] for d in ds]
    assert "<tool_call>" in "".join(held)  # released with the body, the marker too
    assert sum(1 for ds in per_push if ds) > 700 and calls_in(last) == []
    assert agrees(HERMES, reply, tokens(reply)) == (reply, [])


# --- a call that closes is a call at once ---

@pytest.mark.parametrize(("fmt", "call", "decided"), [
    (LLAMA3, PARIS.replace("arguments", "parameters"), 0),  # at its closing brace
    (HERMES, PARIS, 2),  # once no </tool_call> follows (its <tool_call> a control token)
    (HERMES, f"```json\n{PARIS}\n```", 2),
])
def test_a_bare_call_that_closes_is_emitted_before_the_reply_ends(fmt: CallFormat, call: str,
                                                                   decided: int) -> None:
    chunks = [call, "\n", "It is", " sunny."]
    per_push, last = pushed(fmt, chunks)
    assert [bool(calls_in(ds)) for ds in per_push] == [i == decided for i in range(4)]
    assert per_push[3] == [{"content": " sunny."}] and last == []
    content, calls = agrees(fmt, "".join(chunks), chunks)
    assert content == "It is sunny." and calls[0]["function"]["name"] == "get_weather"


def test_calls_that_run_to_the_end_are_each_emitted_as_they_close() -> None:
    chunks = [PARIS.replace("arguments", "parameters"), "; ",
              LYON.replace("arguments", "parameters")]
    per_push, last = pushed(LLAMA3, chunks)
    assert [len(calls_in(ds)) for ds in per_push] == [1, 0, 1] and last == []
    assert len(agrees(LLAMA3, "".join(chunks), chunks)[1]) == 2


# --- a long call is still a call ---

@pytest.mark.parametrize(("fmt", "reply"), [
    (HERMES, WRITE_CALL),
    (HERMES, f"```json\n{WRITE_CALL}\n```"),
    (HERMES, f"<tool_call>\n{WRITE_CALL}\n</tool_call>"),
    (LLAMA3, WRITE_CALL.replace('"arguments"', '"parameters"')),
    (LLAMA3, "<|python_tag|>" + WRITE_CALL.replace('"arguments"', '"parameters"')),
    (MISTRAL, f"[TOOL_CALLS][{WRITE_CALL}]"),
])
def test_a_call_longer_than_the_bound_streams_and_is_still_a_call(fmt: CallFormat,
                                                                  reply: str) -> None:
    chunks = tokens(reply)
    per_push, _ = pushed(fmt, chunks)
    assert first_sent(per_push) <= HOLD_LIMIT // 4 + 4  # no silence to the end
    content, calls = agrees(fmt, reply, chunks)
    assert content == reply  # shown as it came, and then
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] \
        == [("write_file", WRITE)]


def test_a_call_within_the_bound_is_held_and_shows_nothing() -> None:
    reply = f"<tool_call>\n{PARIS}\n</tool_call>"
    per_push, _ = pushed(HERMES, tokens(reply))
    assert [calls_in(ds) != [] for ds in per_push if ds] == [True]
    assert agrees(HERMES, reply, tokens(reply))[0] is None


# --- where a bare call's text stands ---

W = '{"name": "get_weather", "arguments": '


@pytest.mark.parametrize(("text", "state"), [
    (W + '{"city": "Par', OPEN), (W + '{"n": tru', OPEN), (W + '{"n": 1.', OPEN),
    (W + '{"n": -', OPEN), (W + '{"s": "\\u00', OPEN), (W + '{"s": "a\\', OPEN),
    ("```json\n" + W + "{}}\n", OPEN), ("```json\n" + W + "{}}\n``", OPEN),
    ("; " + W, OPEN), ("```js", OPEN),
    (W + "{}}", DONE), ("```json\n" + W + "{}}\n```", DONE),
    (W + "{}\n{", BAD), (W + '{"n": trux', BAD), (W + '{"s": "a\nb"', BAD),
    ("```json\n" + W + "{}}\nSee?", BAD), ('{"name": "Alice"', BAD), ("```jsx", BAD),
])
def test_how_a_bare_call_s_text_stands(text: str, state: str) -> None:
    assert call_end(text, TOOLS)[0] == state


def test_a_closed_call_ends_where_its_json_or_its_fence_does() -> None:
    assert call_end(PARIS + "\nmore", TOOLS) == (DONE, len(PARIS))
    fenced = f"```json\n{PARIS}\n```"
    assert call_end(fenced + "\nmore", TOOLS) == (DONE, len(fenced))


# --- however the reply is cut ---

SEGMENTS = ["Hi", " ", "\n", "<tool_call>", "</tool_call>", "<tool", "```json\n", "```", PARIS,
            LYON, '{"name": "get_weather", ', '"arguments": {"city": "', "P" * 30, '"}}', "}",
            "; ", "tru", "e", "[TOOL_CALLS]", "[", "]", "<|python_tag|>", '{"name": "Alice"']


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([HERMES, LLAMA3, MISTRAL]), st.lists(st.sampled_from(SEGMENTS),
                                                             max_size=10), st.data())
def test_any_cut_of_any_reply_agrees_across_the_bound(fmt: CallFormat, parts: list[str],
                                                      data: st.DataObject) -> None:
    reply = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(reply)), max_size=8)))
    chunks = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(toolparse, "HOLD_LIMIT", 24)  # replies cross it often
        agrees(fmt, reply, chunks)
        agrees(fmt, reply, list(reply))
