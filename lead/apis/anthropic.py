"""Anthropic's Messages API (POST /v1/messages) over lead's chat: a request turned into a
chat request, a reply turned into a message or its stream of events, errors in Anthropic's
shape (`{"type": "error", "error": {"type", "message"}}`).

Served: `system`, `messages` with text, `tool_use` and `tool_result` blocks, `max_tokens`,
`stop_sequences`, `temperature`, `top_p`, `top_k`, `stream`, `tools` and `tool_choice`
(auto, any, tool, none); the key may come as `x-api-key`. Not served, a 400 naming it:
images and documents, thinking, server tools (web search ...), and fields lead does not
know.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lead.apis import shapes
from lead.apis.renames import ORIGIN, Names, chat_request
from lead.apis.toolreply import Deltas
from lead.apis.tools import ToolPlan
from lead.decode.session import Emission, Session

HARMLESS = {"metadata", "service_tier", "container", "mcp_servers", "context_management"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 529: "overloaded_error"}


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # what else it holds: `refusal`
    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: shapes.Text | list[dict[str, Any]] | None = None
    stop_sequences: list[shapes.Text] | None = Field(None, max_length=16)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


def refusal(body: MessagesRequest) -> shapes.FieldRefused | None:
    """The 400 for the first field lead would otherwise have to ignore."""
    for name, value in (body.model_extra or {}).items():
        if value is not None and name not in HARMLESS:
            return shapes.FieldRefused(name, f"{name}: unknown field; lead refuses what it "
                                          "cannot honour")
    if body.thinking and body.thinking.get("type") != "disabled":
        return shapes.FieldRefused("thinking", "thinking: extended thinking is not served")
    return None


def to_chat(body: MessagesRequest) -> tuple[shapes.ChatRequest, Names]:
    """The chat request this message is decoded as, and where its fields came from (a 400
    naming the field at fault, as this request writes it)."""
    system = _blocks_text("system", body.system) if body.system else None
    messages = ([{"role": "system", "content": system, ORIGIN: {"": "system"}}]
                if system else []) + \
        [m for i, message in enumerate(body.messages) for m in _turn(i, message)]
    fields: dict[str, Any] = {
        "messages": messages, "max_tokens": body.max_tokens, "stop": body.stop_sequences,
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
        "stream": body.stream}
    names = {"stop": "stop_sequences", "tool_choice.function": "tool_choice"}
    if body.tools is not None:
        fields["tools"] = [_tool(i, t) for i, t in enumerate(body.tools)]
        names.update(_tool_names(len(body.tools)))
    if body.tool_choice is not None:
        fields["tool_choice"] = _tool_choice(body.tool_choice)
    return chat_request({k: v for k, v in fields.items() if v is not None}, names)


def _tool_names(n: int) -> Names:
    return {chat: client for i in range(n) for chat, client in (
        (f"tools[{i}].function", f"tools[{i}]"),
        (f"tools[{i}].function.parameters", f"tools[{i}].input_schema"))}


def _turn(i: int, message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user's tool results come first, as tool
    messages; an assistant's tool uses are its calls."""
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise shapes.FieldRefused(f"messages[{i}].role", f"messages[{i}].role: user or "
                                                      "assistant")
    origin = {"": f"messages[{i}]"}
    if isinstance(content, str):
        return [{"role": role, "content": content, ORIGIN: origin}]
    if not isinstance(content, list) or (role == "user" and not content):
        raise shapes.FieldRefused(f"messages[{i}].content", f"messages[{i}].content: text or "
                                                         "a list of blocks, not empty")
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        _take_block(f"messages[{i}].content[{j}]", block, texts, calls, results)
    text = "".join(texts)
    own = [{"role": role, "content": text, ORIGIN: origin,
            **({"tool_calls": calls} if calls else {})}] if text or calls else []
    return results + own


def _take_block(where: str, block: Any, texts: list[str], calls: list[dict[str, Any]],
                results: list[dict[str, Any]]) -> None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        texts.append(str(block.get("text", "")))
    elif kind == "tool_use":
        if not isinstance(block.get("input", {}), dict):
            raise shapes.FieldRefused(f"{where}.input", f"{where}.input: an object")
        calls.append({"id": block.get("id"), "type": "function",
                      "function": {"name": block.get("name"),
                                   "arguments": json.dumps(block.get("input") or {})},
                      ORIGIN: {"": where, ".function": where,
                               ".function.arguments": f"{where}.input"}})
    elif kind == "tool_result":
        text = _blocks_text(f"{where}.content", block.get("content") or "")
        results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                        "content": f"error: {text}" if block.get("is_error") else text,
                        ORIGIN: {"": where, ".tool_call_id": f"{where}.tool_use_id"}})
    else:
        raise shapes.FieldRefused(f"{where}.type", f"{where}.type: {kind!r} blocks are not "
                                                "served (text, tool_use, tool_result are)")


def _blocks_text(where: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise shapes.FieldRefused(where, f"{where}: text or a list of text blocks")
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            raise shapes.FieldRefused(f"{where}[{j}].type", f"{where}[{j}].type: only text "
                                                         f"blocks are served, not {kind!r}")
    return "".join(str(block.get("text", "")) for block in value)


def _tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or \
            "input_schema" not in tool:
        raise shapes.FieldRefused(f"tools[{i}]", f"tools[{i}]: only client tools "
                                              "({name, description, input_schema}) are "
                                              "served, not server tools")
    function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if mapped is None:
        raise shapes.FieldRefused("tool_choice.type", "tool_choice.type: auto, any, tool or "
                                                   "none")
    return mapped


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                       "message": message}}


# --- the reply ---


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def stop_reason(session: Session, called: bool) -> str:
    if called:
        return "tool_use"
    if session.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if session.stop_sequence is not None else "end_turn"


def usage(s: Session) -> dict[str, int]:
    return {"input_tokens": s.n_prompt, "output_tokens": s.n_generated,
            "cache_read_input_tokens": max(s.n_prompt - s.prompt_evaluated - 1, 0),
            "drafted_tokens": s.drafted, "accepted_tokens": s.accepted}


def tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": new_id("toolu"), "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"] or "{}")}


class MessageShape:
    def __init__(self, model: str, mid: str) -> None:
        self.model, self.mid = model, mid

    def message(self, content: list[dict[str, Any]], session: Session | None,
                called: bool = False) -> dict[str, Any]:
        return {"id": self.mid, "type": "message", "role": "assistant", "model": self.model,
                "content": content,
                "stop_reason": stop_reason(session, called) if session else None,
                "stop_sequence": session.stop_sequence if session else None,
                "usage": usage(session) if session else {"input_tokens": 0,
                                                         "output_tokens": 0}}

    def whole(self, emissions: list[Emission], plan: ToolPlan | None) -> dict[str, Any]:
        session = emissions[-1].session
        assert session is not None, "the last emission carries the session"
        text = "".join(e.text for e in emissions)
        content, calls = plan.parse(text) if plan is not None else (text, [])
        blocks = [{"type": "text", "text": content}] if content else []
        blocks += [tool_use(call) for call in calls]
        return self.message(blocks, session, bool(calls))

    async def events(self, emissions: AsyncIterator[Emission], plan: ToolPlan | None,
                     n_prompt: int) -> AsyncIterator[str]:
        """message_start, each block's start, deltas and stop, message_delta, message_stop."""
        writer = BlockWriter()
        started = {**self.message([], None), "usage": {"input_tokens": n_prompt,
                                                        "output_tokens": 0}}
        yield writer.event("message_start", message=started)
        yield writer.event("ping")
        deltas, last, called = Deltas(plan), None, False
        async for e in emissions:
            for part in deltas.push(e.text):
                called = called or "tool_calls" in part
                for text in writer.delta(part):
                    yield text
            last = e
        for part in deltas.finish():
            called = called or "tool_calls" in part
            for text in writer.delta(part):
                yield text
        session = last.session if last is not None else None
        assert session is not None, "the last emission carries the session"
        for text in writer.closing(session, called):
            yield text


class BlockWriter:
    """The Messages stream's events: content blocks opened, filled and closed in order."""

    def __init__(self) -> None:
        self.index = -1
        self.text_open = False

    @staticmethod
    def event(kind: str, **fields: Any) -> str:
        data = {"type": kind, **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def delta(self, part: dict[str, Any]) -> list[str]:
        if "content" in part:
            out = [] if self.text_open else self._open({"type": "text", "text": ""})
            self.text_open = True
            return out + [self.event("content_block_delta", index=self.index,
                                     delta={"type": "text_delta", "text": part["content"]})]
        out = self._close()
        for call in part.get("tool_calls", []):
            block = tool_use(call)
            out += self._open({**block, "input": {}})
            out.append(self.event("content_block_delta", index=self.index, delta={
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])}))
            out += self._close(force=True)
        return out

    def _open(self, block: dict[str, Any]) -> list[str]:
        self.index += 1
        return [self.event("content_block_start", index=self.index, content_block=block)]

    def _close(self, force: bool = False) -> list[str]:
        if not (self.text_open or force):
            return []
        self.text_open = False
        return [self.event("content_block_stop", index=self.index)]

    def closing(self, session: Session, called: bool) -> list[str]:
        delta = {"stop_reason": stop_reason(session, called),
                 "stop_sequence": session.stop_sequence}
        used = {k: v for k, v in usage(session).items() if k != "input_tokens"}
        return [*self._close(), self.event("message_delta", delta=delta, usage=used),
                self.event("message_stop")]
