"""Tools on a model whose chat template has no call format (SmolLM2, say): a generic JSON
format, as llama.cpp's server has one, enforced by a grammar (pure).

The tools are described in a system message, and the whole reply is one JSON object:
`{"tool_call": {"name": ..., "arguments": {...}}}` to call one, or `{"response": "..."}`
to answer (tool_choice "required" or a named function: a call only). A grammar built from
that schema holds the model to it, so the reply always parses. History goes to the
template as text it can render: a call as the assistant's JSON, a tool's result as a user
turn saying so. A streamed reply's answer text is released as the JSON string decodes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

from lead.apis.toolparse import Delta, call_id, finish_reason

INTRO = ("You can call these tools. Reply with one JSON object: "
         '{"tool_call": {"name": <a tool\'s name>, "arguments": <its arguments>}} to call '
         'one, or {"response": <your answer, a string>} to answer without one.')
INTRO_REQUIRED = ('You must call one of these tools. Reply with one JSON object: '
                  '{"tool_call": {"name": <a tool\'s name>, "arguments": <its arguments>}}.')


def generic_messages(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
                     required: bool) -> list[dict[str, Any]]:
    """The messages with the tools described up front and the history's calls and results
    written as text the template renders."""
    listing = json.dumps([t["function"] for t in tools], ensure_ascii=False)
    intro = f"{INTRO_REQUIRED if required else INTRO}\nTools: {listing}"
    out = [m for m in (_as_text(m) for m in messages) if m is not None]
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{intro}"}
    else:
        out.insert(0, {"role": "system", "content": intro})
    return out


def _as_text(message: dict[str, Any]) -> dict[str, Any] | None:
    if message.get("tool_calls"):
        calls = [{"tool_call": {"name": c["function"]["name"],
                                "arguments": c["function"]["arguments"]}}
                 for c in message["tool_calls"]]
        text = "\n".join(json.dumps(c, ensure_ascii=False) for c in calls)
        return {"role": "assistant", "content": text}
    if message.get("role") == "tool":
        name = message.get("name") or "the tool"
        return {"role": "user", "content": f"{name} returned: {message.get('content', '')}"}
    return {k: v for k, v in message.items() if k in ("role", "content", "name")}


def reply_schema(functions: Sequence[dict[str, Any]], required: bool) -> dict[str, Any]:
    """The reply's JSON schema: a call of one of `functions`, or (unless `required`) an
    answer."""
    calls = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                               "arguments": f["parameters"]},
              "required": ["name", "arguments"]} for f in functions]
    call = {"type": "object", "properties": {"tool_call": calls[0] if len(calls) == 1
                                             else {"anyOf": calls}},
            "required": ["tool_call"]}
    if required:
        return call
    answer = {"type": "object", "properties": {"response": {"type": "string"}},
              "required": ["response"]}
    return {"anyOf": [call, answer]}


class GenericStream:
    """A reply in the generic format as it streams: the answer's text released as its JSON
    string decodes, a call emitted whole once the reply ends (the ToolStream interface)."""

    def __init__(self, names: Collection[str] = (), new_id: Callable[[], str] = call_id
                 ) -> None:
        self.names, self.new_id = frozenset(names), new_id
        self.calls: list[dict[str, Any]] = []
        self._text = ""  # the whole reply so far
        self._sent = 0  # characters of the answer released

    def push(self, text: str) -> list[Delta]:
        self._text += text
        answer = _answer_so_far(self._text)
        if answer is None or len(answer) <= self._sent:
            return []
        out, self._sent = answer[self._sent:], len(answer)
        return [{"content": out}]

    def finish(self) -> list[Delta]:
        try:
            value = json.loads(self._text)
        except json.JSONDecodeError:
            return [] if self._sent else [{"content": self._text}] if self._text else []
        call = value.get("tool_call") if isinstance(value, dict) else None
        if isinstance(call, dict) and isinstance(call.get("name"), str) and \
                (not self.names or call["name"] in self.names):
            arguments = json.dumps(call.get("arguments") or {}, ensure_ascii=False)
            made = {"id": self.new_id(), "type": "function",
                    "function": {"name": call["name"], "arguments": arguments}}
            self.calls.append(made)
            return [{"tool_calls": [{"index": 0, **made}]}]
        if self._sent or _answer_so_far(self._text) is not None:
            return []  # the answer went out as it came
        return [{"content": self._text}]

    def finish_reason(self, finish: str | None) -> str | None:
        return finish_reason(finish, bool(self.calls))


def _answer_so_far(text: str) -> str | None:
    """The answer's text decoded so far, where the reply is `{"response": "...`; None where
    it is not (yet) one. A partial escape at the end waits for its next characters."""
    head = text.lstrip()
    if not head.startswith("{"):
        return None
    rest = head[1:].lstrip()
    if not rest.startswith('"response"'):
        return None
    rest = rest[len('"response"'):].lstrip()
    if not rest.startswith(":"):
        return None
    rest = rest[1:].lstrip()
    if not rest.startswith('"'):
        return None
    return _decoded_prefix(rest[1:])


def _decoded_prefix(body: str) -> str:
    """A JSON string's body (after its opening quote), decoded as far as it is complete."""
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch == '"':
            break
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        size = 2
        if body[i + 1:i + 2] == "u":  # \uXXXX, and its pair where it is a high surrogate
            size = 12 if body[i + 2:i + 4].lower() in ("d8", "d9", "da", "db") else 6
        if i + size > len(body):
            break  # the escape's rest has not come
        try:
            out.append(json.loads(f'"{body[i:i + size]}"'))
        except json.JSONDecodeError:
            break
        i += size
    return "".join(out)
