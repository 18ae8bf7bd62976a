"""Tool calls out of a reply's text, in OpenAI's shape.

One incremental parser serves both paths: a non-streamed reply is fed whole
(`parse_reply`), so a streamed reply and a plain one agree by construction. Content is
released at once except what might still open a call (a prefix of the marker, held as
stop strings are held in lead/decode/textstream.py) and whitespace that would end up beside a
call. A call is emitted whole when it closes, so no call is ever emitted that later
proves malformed; malformed call text is released as content.

A call's text is held no longer than it takes to decide. A bare one (JSON opening the
reply, or after a marker that has no closing) is emitted as soon as its JSON value (and
its fence) closes, or, in a format with a closing marker, once the next text shows
whether that marker follows; it is released as content at the first character that
keeps it from being a call. Any call still open past HOLD_LIMIT characters streams as content from
there on, but is still parsed: if it closes as a call, the call is emitted as well (a
client that calls tools needs tool_calls, and a long call, a file's content, is a real
one). The bound is counted in the call's text, not in chunks, so where a reply is cut
into chunks changes nothing.
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


# How much of an open call's text is held: about 300 tokens of JSON. A call naming a tool
# and a few arguments closes well within it; past it, the client would see nothing at
# all while a model writes on (1,024 tokens held were 5.5 silent minutes on a CPU), and a
# longer call (a file's content) loses nothing by streaming: it is still emitted.
HOLD_LIMIT = 1024
OPEN, DONE, BAD = "open", "done", "bad"  # how an open call's text stands (call_end)
SEPARATORS = " \t\r\n,;"  # between calls that run to the reply's end


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
        self._more = False  # after a call that runs to the end: another may follow it, bare
        self._shown: str | None = None  # an open call's body sent as content (past the bound)

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
        if self._shown is not None:  # sent already; the call it makes, if it is one
            found = self._decode(self._shown + self._pending)
            self._content(deltas, "" if found else self._pending)
            self._emit(found, deltas)
        elif self._inside:
            self._close(self._pending, self._opening + self._pending, deltas)
        else:
            self._content(deltas, self._pending.lstrip() if self._after_call else self._pending)
        self._pending = ""
        return _merged(deltas)

    def finish_reason(self, finish: str | None) -> str | None:
        return finish_reason(finish, bool(self.calls))

    def _advance(self, deltas: list[Delta]) -> bool:
        """One step; True while another may make progress."""
        if self._shown is not None:
            return self._shown_step(deltas)
        if self._inside:
            return self._held_step(deltas)
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
        self._more = False
        return True

    def _openers(self) -> tuple[str, ...]:
        """What opens a bare call here: at the reply's start, or right after such a call."""
        if self._more:
            return (*self.fmt.bare, ",", ";")
        return self.fmt.bare if self._fresh else ()

    def _find_opening(self) -> tuple[int, int]:
        """Where a call opens in the pending text, and the marker's length to consume."""
        start = len(self._pending) - len(self._pending.lstrip())
        if self._pending.startswith(self._openers(), start):
            return start, 0  # the opener is the body's
        return self._pending.find(self.fmt.opening), len(self.fmt.opening)

    def _release(self, deltas: list[Delta]) -> None:
        """Send what cannot open a call; hold a marker's prefix and trailing whitespace."""
        head = self._pending.lstrip()
        if any(b.startswith(head) for b in self._openers()):
            return  # a bare call may still open here
        keep = _partial_len(self._pending, self.fmt.opening)
        out = self._pending[:len(self._pending) - keep].rstrip()
        self._content(deltas, out)
        self._pending = self._pending[len(out):]

    def _held_step(self, deltas: list[Delta]) -> bool:
        """The open call's body, held: closed, disowned or past the bound, else held on.
        Only its first HOLD_LIMIT characters are judged, however the reply is chunked."""
        state, at = self._end(self._pending[:HOLD_LIMIT])
        if state == OPEN and len(self._pending) <= HOLD_LIMIT:
            return False  # it may still become a call
        if state == DONE:
            body, self._pending = self._pending[:at], self._pending[at:]
            self._close(body.removesuffix(self.fmt.closing or ""), self._opening + body, deltas)
        elif state == BAD:
            self._disown(deltas)
        else:  # still open past the bound: streamed from here, and still watched
            self._content(deltas, self._space + self._opening)
            self._shown, self._space = "", ""
        return True

    def _shown_step(self, deltas: list[Delta]) -> bool:
        """Past the bound the body streams as content, and is still a call if it closes
        as one."""
        shown = self._shown or ""
        body, sent = shown + self._pending, len(shown)
        state, at = self._end(body)
        if state == OPEN:  # what may still turn out to follow the call stays held
            at = max(at, sent)
            self._content(deltas, body[sent:at])
            self._shown, self._pending = body[:at], body[at:]
            return False
        cut = max(at, sent)
        self._content(deltas, body[sent:cut])
        self._pending = body[cut:]
        call = body[:at].removesuffix(self.fmt.closing or "")
        self._emit(self._decode(call) if state == DONE else None, deltas)
        return True

    def _end(self, body: str) -> tuple[str, int]:
        """How the open call's text stands as far as `body` goes (see call_end)."""
        closing = self.fmt.closing
        if self._opening and closing:  # an explicit marker's call runs to its closing
            end = body.find(closing)
            return (DONE, end + len(closing)) if end >= 0 else (OPEN, len(body))
        state, at = call_end(body, self.names)
        return _through_closing(body, at, closing) if state == DONE and closing else (state, at)

    def _disown(self, deltas: list[Delta]) -> None:
        """Not a call: the opening marker is content, the body is read again as text (a
        reply that opens like a bare call but is not one streams from here)."""
        self._content(deltas, self._space + self._opening)
        self._inside, self._opening, self._space, self._more = False, "", "", False

    def _close(self, body: str, raw: str, deltas: list[Delta]) -> None:
        found = self._decode(body)
        if found is None:
            self._content(deltas, self._space + raw)
        self._emit(found, deltas)

    def _decode(self, body: str) -> list[tuple[str, str]] | None:
        # A bare opening ("[") may be the marker's own first character ("[TOOL_CALLS]").
        return decode_calls(body.lstrip().removeprefix(self.fmt.opening), self.fmt.key,
                            self.names)

    def _emit(self, found: list[tuple[str, str]] | None, deltas: list[Delta]) -> None:
        """The calls found, a delta each; the open call's state cleared."""
        for name, arguments in found or []:
            call = {"id": self.new_id(), "type": "function",
                    "function": {"name": name, "arguments": arguments}}
            deltas.append({"tool_calls": [{"index": len(self.calls), **call}]})
            self.calls.append(call)
        runs_to_end = not self._opening or self.fmt.closing is None
        self._after_call, self._more = found is not None, found is not None and runs_to_end
        self._inside, self._opening, self._space, self._shown = False, "", "", None

    def _content(self, deltas: list[Delta], text: str) -> None:
        if text:
            deltas.append({"content": text})
            self._fresh = self._more = False


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


def call_end(text: str, names: Collection[str] = ()) -> tuple[str, int]:
    """How a bare call's text stands: (DONE, where its JSON value, and its fence if
    fenced, ends), (OPEN, how much of it is surely the call's) while it may still go on
    to be calls, or (BAD, where it no longer can). Separators may lead it (a call that
    follows another)."""
    at = len(text) - len(text.lstrip(SEPARATORS))
    head = text[at:]
    if not could_be_call(head, names):
        return BAD, at
    if FENCE.startswith(head):
        return OPEN, len(text)
    fenced = head.startswith(FENCE)
    return _values_end(text, at + len(FENCE) * fenced, fenced)


def _values_end(text: str, at: int, fenced: bool) -> tuple[str, int]:
    """From `at`: one JSON value, or (fenced) values up to the fence's closing."""
    decoder = json.JSONDecoder()
    while (at := _skip(text, at, " \t\r\n")) < len(text):
        try:
            at = decoder.raw_decode(text, at)[1]
        except json.JSONDecodeError as err:
            return (OPEN, len(text)) if _truncated(err) else (BAD, err.pos)
        if not fenced:
            return DONE, at
        at = _skip(text, at, SEPARATORS)
        if text.startswith("```", at):
            return DONE, at + 3
        if "```".startswith(text[at:]):
            return OPEN, len(text)
    return OPEN, len(text)


def _skip(text: str, at: int, chars: str) -> int:
    return len(text) - len(text[at:].lstrip(chars))


# What JSON cut short ends in, past where the decoder stopped: a literal's or a number's
# start ("tr", "-", "1." stops at ".", "1e+" at "e"), or nothing but spaces.
_CUT_TAIL = re.compile(r"\s*(?:t(?:ru?)?|f(?:a(?:ls?)?)?|n(?:ul?)?|-|\.|[eE][-+]?)?")


def _truncated(err: json.JSONDecodeError) -> bool:
    """Whether JSON failed only for running out: more text may still make it whole."""
    tail = err.doc[err.pos:]
    if err.msg.startswith("Unterminated string"):
        return True
    if err.msg.startswith("Invalid \\uXXXX"):
        return re.fullmatch(r"u[0-9a-fA-F]{0,3}", tail) is not None
    return _CUT_TAIL.fullmatch(tail) is not None


def _through_closing(text: str, at: int, closing: str) -> tuple[str, int]:
    """A bare call that ends at `at` takes a closing marker that follows it (its opening
    marker a control token, left out of the text); while one may still come, it is open."""
    rest = text[at:].lstrip()
    if rest.startswith(closing):
        return DONE, len(text) - len(rest) + len(closing)
    return (OPEN, at) if closing.startswith(rest) else (DONE, at)


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
