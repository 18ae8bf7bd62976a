"""OpenAI's Responses API (POST /v1/responses) over lead's chat: a request turned into a
chat request, a reply turned into a response object or its stream of events.

Served: `input` as text or items (messages with text parts, `function_call` and
`function_call_output` items), `instructions`, `max_output_tokens`, `temperature`,
`top_p`, `text.format` (text, json_object, json_schema), function `tools` and
`tool_choice`, `stream`, logprobs through `include` and `top_logprobs`. Not served, a 400
naming it: stored responses (`store: true`, `previous_response_id`, `conversation`),
built-in tools, reasoning, background runs, images and files.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lead.apis import shapes
from lead.apis.renames import ORIGIN, Names, chat_request
from lead.apis.toolreply import Deltas
from lead.apis.tools import ToolPlan
from lead.decode.session import Emission, Session

LOGPROBS = "message.output_text.logprobs"
ROLES = ("user", "assistant", "system", "developer")
# The chat request's fields this request names otherwise (its messages: where each came from)
NAMES = {"max_tokens": "max_output_tokens", "response_format.json_schema": "text.format",
         "response_format": "text.format", "tool_choice.function": "tool_choice",
         "logprobs": "include", "messages": "input"}
HARMLESS = {"metadata", "user", "service_tier", "safety_identifier", "prompt_cache_key"}
UNSERVED = {
    "previous_response_id": "stored responses are not served: send the whole conversation "
                            "as input",
    "conversation": "stored conversations are not served: send the whole conversation as "
                    "input",
    "reasoning": "reasoning is not served",
    "background": "background responses are not served",
    "prompt": "prompt templates are not served",
    "max_tool_calls": "max_tool_calls is not served",
}


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # what else it holds: `refusal`
    model: str | None = None
    input: shapes.Text | list[dict[str, Any]]
    instructions: shapes.Text | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stream: bool = False
    text: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    truncation: str | None = None


def refusal(body: ResponsesRequest) -> shapes.FieldRefused | None:
    """The 400 for the first field lead would otherwise have to ignore."""
    for name, value in (body.model_extra or {}).items():
        if value is None or name in HARMLESS:
            continue
        reason = UNSERVED.get(name, "unknown field; lead refuses what it cannot honour")
        return shapes.FieldRefused(name, f"{name}: {reason}")
    if body.store:
        return shapes.FieldRefused("store", "store: responses are not stored here (send "
                                         "store: false, or leave it out)")
    if body.truncation not in (None, "disabled"):
        return shapes.FieldRefused("truncation", "truncation: only \"disabled\" is served")
    unknown = [i for i in body.include or [] if i != LOGPROBS]
    if unknown:
        return shapes.FieldRefused("include", f"include: {unknown[0]!r} is not served")
    fmt = (body.text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        return shapes.FieldRefused("text.format", "text.format: an object, e.g. "
                                                  '{"type": "json_schema", "schema": {...}}')
    return None


def to_chat(body: ResponsesRequest) -> tuple[shapes.ChatRequest, Names]:
    """The chat request this response is decoded as, and where its fields came from (a
    400 naming the field at fault, as this request writes it)."""
    messages = ([{"role": "system", "content": body.instructions,
                  ORIGIN: {"": "instructions"}}] if body.instructions else []) + \
        _messages(body.input)
    logprobs = LOGPROBS in (body.include or []) or bool(body.top_logprobs)
    fields = {"messages": messages, "max_tokens": body.max_output_tokens,
              "temperature": body.temperature, "top_p": body.top_p, "stream": body.stream,
              "response_format": _format(body.text), "logprobs": logprobs or None,
              "top_logprobs": body.top_logprobs if logprobs else None}
    if body.tools is not None:
        fields["tools"] = [_tool(i, t) for i, t in enumerate(body.tools)]
    if body.tool_choice is not None:
        fields["tool_choice"] = _tool_choice(body.tool_choice)
    names = {**NAMES, **{f"tools[{i}].function": f"tools[{i}]"
                         for i in range(len(body.tools or []))}}
    return chat_request({k: v for k, v in fields.items() if v is not None}, names)


def _messages(given: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(given, str):
        return [{"role": "user", "content": given, ORIGIN: {"": "input", ".content": "input"}}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(given):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            out.append({"role": _role(i, item), "content": _text(f"input[{i}]", item),
                        ORIGIN: {"": f"input[{i}]"}})
        elif kind == "function_call":
            _add_call(out, i, item)
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": _text(f"input[{i}]", item, "output"),
                        ORIGIN: {"": f"input[{i}]", ".content": f"input[{i}].output",
                                 ".tool_call_id": f"input[{i}].call_id"}})
        else:
            raise shapes.FieldRefused(f"input[{i}].type", f"input[{i}].type: {kind!r} items are "
                                                      "not served (messages, function_call, "
                                                      "function_call_output are)")
    return out


def _role(i: int, item: dict[str, Any]) -> str:
    role = item.get("role")
    if role not in ROLES:
        raise shapes.FieldRefused(f"input[{i}].role", f"input[{i}].role: one of "
                                                   f"{', '.join(ROLES)}")
    return role


def _text(where: str, item: dict[str, Any], key: str = "content") -> str:
    """A message's text: a string, or its text parts joined."""
    content = item.get(key)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise shapes.FieldRefused(f"{where}.{key}", f"{where}.{key}: text or a list of parts")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise shapes.FieldRefused(f"{where}.{key}[{j}].type", f"{where}.{key}[{j}].type: "
                                   f"only text parts are served, not {kind!r}")
    return "".join(str(part.get("text", "")) for part in content)


def _add_call(out: list[dict[str, Any]], i: int, item: dict[str, Any]) -> None:
    """A call of the model's, into the assistant message before it (calls in a row: one)."""
    where = f"input[{i}]"
    call = {"id": item.get("call_id"), "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            ORIGIN: {"": where, ".id": f"{where}.call_id", ".function": where}}
    if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
        out[-1]["tool_calls"].append(call)
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call],
                    ORIGIN: {"": where}})


def _tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise shapes.FieldRefused(f"tools[{i}].type", f"tools[{i}].type: only function tools "
                                                   f"are served, not built-in {kind!r}")
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice  # "auto", "none", "required"; anything else tools.py refuses


def _format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return {"type": fmt.get("type")}


# --- the reply ---


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ResponseShape:
    """One reply as a response object (whole) or events (streamed)."""

    def __init__(self, body: ResponsesRequest, model: str, rid: str,
                 token_bytes: shapes.TokenBytes) -> None:
        self.body, self.model, self.rid = body, model, rid
        self.token_bytes = token_bytes
        self.created = int(time.time())

    def response(self, status: str, output: list[dict[str, Any]],
                 session: Session | None = None) -> dict[str, Any]:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.rid, "object": "response", "created_at": self.created,
                "status": status, "error": None, "incomplete_details": incomplete,
                "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
                "model": self.model, "output": output, "parallel_tool_calls": True,
                "temperature": body.temperature, "top_p": body.top_p,
                "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
                "text": body.text or {"format": {"type": "text"}}, "truncation": "disabled",
                "metadata": (body.model_extra or {}).get("metadata") or {},
                "usage": usage(session) if session is not None else None}

    def whole(self, emissions: list[Emission], plan: ToolPlan | None) -> dict[str, Any]:
        session = emissions[-1].session
        assert session is not None, "the last emission carries the session"
        text = "".join(e.text for e in emissions)
        content, calls = plan.parse(text) if plan is not None else (text, [])
        entries = [lp for e in emissions for lp in e.logprobs]
        output = [self.message(new_id("msg"), content, self._logprobs(entries))] \
            if content else []
        output += [function_call(call, "completed") for call in calls]
        return self.response(status_of(session), output, session)

    def message(self, item_id: str, text: str, logprobs: list[Any] | None = None,
                status: str = "completed") -> dict[str, Any]:
        return {"type": "message", "id": item_id, "status": status, "role": "assistant",
                "content": [] if text is None else [self.part(text, logprobs)]}

    @staticmethod
    def part(text: str, logprobs: list[Any] | None = None) -> dict[str, Any]:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        if logprobs is not None:
            part["logprobs"] = logprobs
        return part

    def _logprobs(self, entries: list[Any]) -> list[Any] | None:
        if self.body.top_logprobs is None and LOGPROBS not in (self.body.include or []):
            return None
        return shapes.chat_logprobs(entries, self.token_bytes)["content"]

    async def events(self, emissions: AsyncIterator[Emission], plan: ToolPlan | None
                     ) -> AsyncIterator[str]:
        """The stream: created, each item opened, its deltas, closed, then completed."""
        writer = EventWriter(self)
        for text in writer.opening():
            yield text
        deltas, last = Deltas(plan), None
        async for e in emissions:
            for part in deltas.push(e.text):
                for text in writer.delta(part, e.logprobs if "content" in part else []):
                    yield text
            last = e
        for part in deltas.finish():
            for text in writer.delta(part, []):
                yield text
        session = last.session if last is not None else None
        assert session is not None, "the last emission carries the session"
        for text in writer.closing(session):
            yield text


def function_call(call: dict[str, Any], status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": new_id("fc"), "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"],
            "status": status}


def status_of(session: Session) -> str:
    return "incomplete" if session.finish_reason == "length" else "completed"


def usage(s: Session) -> dict[str, Any]:
    return {"input_tokens": s.n_prompt, "output_tokens": s.n_generated,
            "total_tokens": s.n_prompt + s.n_generated,
            "input_tokens_details": {"cached_tokens": max(s.n_prompt - s.prompt_evaluated - 1,
                                                          0)},
            "output_tokens_details": {"reasoning_tokens": 0},
            "drafted_tokens": s.drafted, "accepted_tokens": s.accepted}


class EventWriter:
    """The Responses stream's events, in order, each with its sequence number."""

    def __init__(self, shape: ResponseShape) -> None:
        self.shape, self.seq = shape, 0
        self.output: list[dict[str, Any]] = []  # items closed so far
        self.open: dict[str, Any] | None = None  # the message item being written
        self.text = ""
        self.logprobs: list[Any] = []

    def event(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        data = {"type": kind, "sequence_number": self.seq, **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def opening(self) -> list[str]:
        started = self.shape.response("in_progress", [])
        return [self.event("response.created", response=started),
                self.event("response.in_progress", response=started)]

    def delta(self, part: dict[str, Any], logprobs: list[Any]) -> list[str]:
        if "content" in part:
            return self._text(part["content"], logprobs)
        out = self._close_message()
        for call in part.get("tool_calls", []):
            out += self._call(call)
        return out

    def _text(self, text: str, logprobs: list[Any]) -> list[str]:
        out = [] if self.open is not None else self._open_message()
        self.text += text
        entries = self.shape._logprobs(logprobs) or []
        self.logprobs += entries
        out.append(self.event("response.output_text.delta", item_id=self.open["id"],
                              output_index=len(self.output), content_index=0, delta=text,
                              logprobs=entries))
        return out

    def _open_message(self) -> list[str]:
        self.open = self.shape.message(new_id("msg"), None, status="in_progress")
        self.text, self.logprobs = "", []
        index = len(self.output)
        return [self.event("response.output_item.added", output_index=index, item=self.open),
                self.event("response.content_part.added", item_id=self.open["id"],
                           output_index=index, content_index=0, part=self.shape.part(""))]

    def _close_message(self) -> list[str]:
        if self.open is None:
            return []
        item_id, index = self.open["id"], len(self.output)
        logprobs = self.logprobs if self.shape._logprobs([]) is not None else None
        part = self.shape.part(self.text, logprobs)
        done = {**self.open, "status": "completed", "content": [part]}
        self.output.append(done)
        self.open = None
        return [self.event("response.output_text.done", item_id=item_id, output_index=index,
                           content_index=0, text=self.text, logprobs=logprobs or []),
                self.event("response.content_part.done", item_id=item_id, output_index=index,
                           content_index=0, part=part),
                self.event("response.output_item.done", output_index=index, item=done)]

    def _call(self, call: dict[str, Any]) -> list[str]:
        index, item = len(self.output), function_call(call, "completed")
        opened = {**item, "arguments": "", "status": "in_progress"}
        self.output.append(item)
        return [self.event("response.output_item.added", output_index=index, item=opened),
                self.event("response.function_call_arguments.delta", item_id=item["id"],
                           output_index=index, delta=item["arguments"]),
                self.event("response.function_call_arguments.done", item_id=item["id"],
                           output_index=index, arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=item)]

    def closing(self, session: Session) -> list[str]:
        out = self._close_message()
        status = status_of(session)
        done = self.shape.response(status, self.output, session)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*out, self.event(kind, response=done)]
