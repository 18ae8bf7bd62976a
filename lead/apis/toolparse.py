"""Tool calls out of a reply's text, in OpenAI's shape.

One incremental parser serves both paths: a non-streamed reply is fed whole
(`parse_reply`), so a streamed reply and a plain one agree by construction. Content is
released at once except what might still open a call (a prefix of the marker, held as
stop strings are held in lead/decode/textstream.py) and whitespace that would end up beside a
call. A call is emitted whole when it closes, so no call is ever emitted that later
proves malformed; malformed call text is released as content.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallFormat:
    """How a model family writes tool calls in its reply."""

    family: str
    opening: str  # marker that opens calls (consumed; may appear after content)
    closing: str | None  # marker that closes one call; None: the calls run to the end
    key: str  # the arguments' key in the model's JSON ("parameters" is accepted too)
    # Openers of calls that run to the reply's end, when they open the reply: JSON
    # where the marker is a control token (lead's text leaves those out), and a fenced
    # JSON block, as Qwen2.5-Coder writes its calls in spite of its template.
    bare: tuple[str, ...] = ()
    prefix: str = ""  # what a forced call starts with (tools.call_grammar)
    suffix: str = ""  # and ends with
    array: bool = False  # a forced call is a JSON list of calls


FENCE = "```json"
HERMES = CallFormat("hermes", "<tool_call>", "</tool_call>", "arguments", bare=("{", FENCE),
                    prefix="<tool_call>\n", suffix="\n</tool_call>")
LLAMA3 = CallFormat("llama3", "<|python_tag|>", None, "parameters", bare=("{", FENCE))
MISTRAL = CallFormat("mistral", "[TOOL_CALLS]", None, "arguments", bare=("[", FENCE),
                     prefix="[TOOL_CALLS]", array=True)
# A template with none of these: the reply is one JSON object (lead/apis/generictools.py)
GENERIC = CallFormat("generic", "", None, "arguments")


def finish_reason(finish: str | None, called: bool) -> str | None:
    """OpenAI's "tool_calls" once any call was made (a reply cut short stays "length")."""
    return "tool_calls" if called and finish != "length" else finish


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


Delta = dict[str, Any]


class ToolStream:
    """Text in as it is released; chat-chunk deltas out (`{"content": ...}` or
    `{"tool_calls": [{index, id, type, function: {name, arguments}}]}`)."""

    def __init__(self, fmt: CallFormat, names: Collection[str] = (),
                 new_id: Callable[[], str] = call_id) -> None:
        self.fmt, self.names, self.new_id = fmt, frozenset(names), new_id
        self.calls: list[dict[str, Any]] = []  # OpenAI's message.tool_calls, so far
        self._pending = ""  # text not yet judged: held content, or the open call's body
        self._inside = False
        self._opening = ""  # the text that opened the call (released if it is malformed)
        self._space = ""  # whitespace before the opening (dropped if the call is good)
        self._fresh = True  # only whitespace so far (bare)
        self._after_call = False  # whitespace after a call is dropped

    def push(self, text: str) -> list[Delta]:
        """Feed released text; return the deltas now safe to send."""
        deltas: list[Delta] = []
        self._pending += text
        while self._advance(deltas):
            pass
        return _merged(deltas)

    def finish(self) -> list[Delta]:
        """End of the reply: a call still open is judged as it stands; held text goes."""
        deltas: list[Delta] = []
        if self._inside:
            self._close(self._pending, self._opening + self._pending, deltas)
        else:
            self._content(deltas, self._pending.lstrip() if self._after_call else self._pending)
        self._pending = ""
        return _merged(deltas)

    def finish_reason(self, finish: str | None) -> str | None:
        return finish_reason(finish, bool(self.calls))

    def _advance(self, deltas: list[Delta]) -> bool:
        """One step; True while another may make progress."""
        if self._inside:
            return self._close_found(deltas)
        if self._after_call:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return False
            self._after_call = False
        at, used = self._find_opening()
        if at < 0:
            self._release(deltas)
            return False
        before = self._pending[:at]
        self._content(deltas, before.rstrip())
        self._space = before[len(before.rstrip()):]
        self._opening = self._pending[at:at + used]
        self._pending, self._inside, self._fresh = self._pending[at + used:], True, False
        return True

    def _find_opening(self) -> tuple[int, int]:
        """Where a call opens in the pending text, and the marker's length to consume."""
        start = len(self._pending) - len(self._pending.lstrip())
        if self._fresh and self._pending.startswith(self.fmt.bare, start):
            return start, 0  # the opener is the body's
        return self._pending.find(self.fmt.opening), len(self.fmt.opening)

    def _release(self, deltas: list[Delta]) -> None:
        """Send what cannot open a call; hold a marker's prefix and trailing whitespace."""
        head = self._pending.lstrip()
        if self._fresh and any(b.startswith(head) for b in self.fmt.bare):
            return  # the reply may still open with a bare call
        keep = _partial_len(self._pending, self.fmt.opening)
        out = self._pending[:len(self._pending) - keep].rstrip()
        self._content(deltas, out)
        self._pending = self._pending[len(out):]

    def _close_found(self, deltas: list[Delta]) -> bool:
        if not self._opening and not could_be_call(self._pending, self.names):
            # A reply that opens like a bare call but is not one (JSON shown to the user, a
            # fenced example) streams as content from here, not held until its end.
            self._pending, self._inside, self._space = self._space + self._pending, False, ""
            return True
        closing = self.fmt.closing
        end = self._pending.find(closing) if closing else -1
        if closing is None or end < 0:
            return False  # the body goes on (until finish, for formats without a closing)
        raw = self._opening + self._pending[:end + len(closing)]
        body, self._pending = self._pending[:end], self._pending[end + len(closing):]
        self._close(body, raw, deltas)
        return True

    def _close(self, body: str, raw: str, deltas: list[Delta]) -> None:
        # A bare opening ("[") may be the marker's own first character ("[TOOL_CALLS]").
        found = decode_calls(body.lstrip().removeprefix(self.fmt.opening), self.fmt.key,
                             self.names)
        if found is None:
            self._content(deltas, self._space + raw)
        for name, arguments in found or []:
            call = {"id": self.new_id(), "type": "function",
                    "function": {"name": name, "arguments": arguments}}
            deltas.append({"tool_calls": [{"index": len(self.calls), **call}]})
            self.calls.append(call)
        self._after_call = found is not None
        self._inside, self._opening, self._space = False, "", ""

    def _content(self, deltas: list[Delta], text: str) -> None:
        if text:
            deltas.append({"content": text})
            self._fresh = False


CALL_KEYS = ("name", "function", "type", "arguments", "parameters", "id")
_NAME_VALUE = re.compile(r'\s*:\s*"([^"\\]*)("?)')


def could_be_call(text: str, names: Collection[str] = ()) -> bool:
    """Whether a bare call's text so far can still be calls: optionally fenced, a JSON
    object (or a list of them) whose first key is one a call has, and whose "name", if
    that comes first, names one of `names` (any, where none are given)."""
    text = text.lstrip()
    if FENCE.startswith(text):
        return True
    text = text.removeprefix(FENCE).lstrip().lstrip("[").lstrip()
    if not text:
        return True
    if not text.startswith("{"):
        return False
    key = text[1:].lstrip()
    if not key:
        return True
    if not key.startswith('"'):
        return False
    end = key.find('"', 1)
    if end < 0:
        return any(k.startswith(key[1:]) for k in CALL_KEYS)
    if key[1:end] != "name" or not names:
        return key[1:end] in CALL_KEYS
    return _could_name(key[end + 1:], names)


def _could_name(rest: str, names: Collection[str]) -> bool:
    """Whether the text after a call's "name" key can still name one of `names`."""
    value = _NAME_VALUE.match(rest)
    if value is None:  # no string yet: only a colon and spaces may have come
        return not rest.strip().strip(":").strip()
    said, closed = value.group(1), value.group(2) == '"'
    return said in names if closed else any(n.startswith(said) for n in names)


def _partial_len(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that begins `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def _merged(deltas: list[Delta]) -> list[Delta]:
    out: list[Delta] = []
    for delta in deltas:
        if out and "content" in delta and "content" in out[-1]:
            out[-1] = {"content": out[-1]["content"] + delta["content"]}
        else:
            out.append(delta)
    return out


def decode_calls(body: str, key: str, names: Collection[str] = ()) -> list[tuple[str, str]] | None:
    """(name, arguments as a JSON string) for each call in `body`: JSON objects or lists
    of them, apart by whitespace, "," or ";". None where anything is not a call (or
    names a tool not in `names`, when given)."""
    decoder, items, at = json.JSONDecoder(), [], 0
    while (at := _skip_separators(body, at)) < len(body):
        try:
            value, at = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            return None
        items.extend(value if isinstance(value, list) else [value])
    calls = [_call(item, key, names) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _skip_separators(body: str, at: int) -> int:
    """Past whitespace, "," ";" and code fences between calls."""
    while at < len(body):
        fence = next((f for f in (FENCE, "```") if body.startswith(f, at)), "")
        if not fence and not (body[at].isspace() or body[at] in ",;"):
            break
        at += len(fence) or 1
    return at


def _call(item: Any, key: str, names: Collection[str]) -> tuple[str, str] | None:
    if isinstance(item, dict) and isinstance(item.get("function"), dict):
        item = item["function"]  # OpenAI's own shape, which some models echo
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    if names and item["name"] not in names:
        return None
    arguments = item.get(key, item.get("arguments", item.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return item["name"], json.dumps(arguments, ensure_ascii=False)


def parse_reply(fmt: CallFormat, text: str, names: Collection[str] = (),
                new_id: Callable[[], str] = call_id) -> tuple[str | None, list[dict[str, Any]]]:
    """A finished reply's (content, tool_calls). Content is None when calls took all of
    it; without calls it is the text as it came."""
    stream = ToolStream(fmt, names, new_id)
    deltas = stream.push(text) + stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    return (content or None) if stream.calls else content, stream.calls
