"""Anthropic's Messages API (POST /v1/messages) over lead's chat: a request turned into a
chat request, a reply turned into a message or its stream of events, errors in Anthropic's
shape (`{"type": "error", "error": {"type", "message"}}`).

Each field and what lead does with it: lead/apis/fields.py (MESSAGES). Claude Code's
requests are served whole: its system message inside `messages` is rendered in place,
its thinking, effort and context management are hints the model cannot take, and
thinking blocks it sends back are skipped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lead.apis import fields, shapes
from lead.apis.prepare import Prepared
from lead.apis.renames import ORIGIN, Names, chat_request
from lead.decode.session import Emission, Session

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 529: "overloaded_error"}
# Blocks of earlier turns the model cannot read again: its thinking (this model writes
# none; another's is signed for Anthropic's), server tools' calls and results lead never ran
SKIPPED = {"thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result",
           "web_fetch_tool_result", "code_execution_tool_result",
           "bash_code_execution_tool_result", "text_editor_code_execution_tool_result",
           "tool_search_tool_result", "mcp_tool_use", "mcp_tool_result", "container_upload"}
# Server tools (Anthropic's API runs them, not the client): not offered to the model
SERVER_TOOLS = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_",
                "mcp_toolset")


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # what else it holds: lead/apis/fields.py
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
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None


class CountRequest(MessagesRequest):
    """POST /v1/messages/count_tokens: a message without max_tokens."""

    max_tokens: int = Field(1, ge=1)


def refusal(body: MessagesRequest) -> shapes.FieldRefused | None:
    """The 400 for the first field whose absence of service would change the reply."""
    try:
        fields.judge(fields.MESSAGES, body.model_extra or {}, "/v1/messages")
    except fields.Refused as exc:
        return shapes.FieldRefused(exc.param, f"{exc.param}: {exc.rule.why}")
    return None


def thinking(body: MessagesRequest) -> bool | None:
    """A thinking switch's setting (None: the template's default)."""
    kind = (body.thinking or {}).get("type")
    return None if kind is None else kind != "disabled"


def to_chat(body: MessagesRequest) -> tuple[shapes.ChatRequest, Names]:
    """The chat request this message is decoded as, and where its fields came from (a 400
    naming the field at fault, as this request writes it)."""
    system = _blocks_text("system", body.system) if body.system else None
    messages = ([{"role": "system", "content": system, ORIGIN: {"": "system"}}]
                if system else []) + \
        [m for i, message in enumerate(body.messages) for m in _turn(i, message)]
    switch = thinking(body)
    fields_: dict[str, Any] = {
        "messages": messages, "max_tokens": body.max_tokens, "stop": body.stop_sequences,
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
        "stream": body.stream, "response_format": _format(body),
        "chat_template_kwargs": None if switch is None else {"enable_thinking": switch}}
    names = {"stop": "stop_sequences", "tool_choice.function": "tool_choice",
             "response_format": _format_field(body),
             "response_format.json_schema": _format_field(body)}
    offered = [(i, t) for i, t in enumerate(body.tools or []) if not _server_tool(i, t)]
    if body.tools is not None:
        fields_["tools"] = [_tool(i, t) for i, t in offered]
        names.update(_tool_names([i for i, _ in offered]))
    if body.tool_choice is not None:
        fields_["tool_choice"] = _tool_choice(body.tool_choice, body.tools or [])
    return chat_request({k: v for k, v in fields_.items() if v is not None}, names)


def _format(body: MessagesRequest) -> dict[str, Any] | None:
    """output_config.format (or the beta's output_format): the reply follows a schema."""
    fmt = (body.output_config or {}).get("format") or body.output_format
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    return {"type": "json_schema", "json_schema": {"name": "output", "strict": True,
                                                   "schema": fmt.get("schema") or {}}}


def _format_field(body: MessagesRequest) -> str:
    return "output_format" if body.output_format else "output_config.format"


def _server_tool(i: int, tool: Any) -> bool:
    kind = tool.get("type", "custom") if isinstance(tool, dict) else None
    return isinstance(kind, str) and kind.startswith(SERVER_TOOLS)


def _tool_names(given: list[int]) -> Names:
    """The chat tools' paths -> the request's (server tools left out, the rest in order)."""
    return {chat: client for k, i in enumerate(given) for chat, client in (
        (f"tools[{k}].function", f"tools[{i}]"),
        (f"tools[{k}].function.parameters", f"tools[{i}].input_schema"))}


def _turn(i: int, message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user's tool results come first, as tool
    messages; an assistant's tool uses are its calls."""
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant", "system"):  # system: the mid-conversation beta's
        raise shapes.FieldRefused(f"messages[{i}].role", f"messages[{i}].role: user, "
                                                      "assistant or system")
    if role == "system":
        return [{"role": "system", "content": _blocks_text(f"messages[{i}].content", content),
                 ORIGIN: {"": f"messages[{i}]"}}]
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
    elif kind not in SKIPPED:
        raise shapes.FieldRefused(f"{where}.type", f"{where}.type: {kind!r} blocks are not "
                                                "served: the model reads text (text, "
                                                "tool_use, tool_result blocks)")


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
                                              "served; Anthropic-defined tools (bash, "
                                              "text_editor ...) need their input_schema")
    function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any], tools: list[Any]) -> Any:
    kind = choice.get("type")
    server = {t.get("name") for i, t in enumerate(tools) if _server_tool(i, t)}
    if kind == "tool" and choice.get("name") in server:
        raise shapes.FieldRefused("tool_choice.name", f"tool_choice.name: lead has no server "
                                                      f"tool {choice.get('name')!r} to force")
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
    """Anthropic's convention: `input_tokens` are those not read from the cache (clients
    add the three to know the prompt's size)."""
    return {**prompt_usage(s), "output_tokens": s.n_generated,
            "drafted_tokens": s.drafted, "accepted_tokens": s.accepted}


def prompt_usage(s: Session) -> dict[str, int]:
    return {"input_tokens": s.n_prompt - s.n_cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": s.n_cached}


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

    def whole(self, emissions: list[Emission], prepared: Prepared) -> dict[str, Any]:
        session = emissions[-1].session
        assert session is not None, "the last emission carries the session"
        parts = prepared.parts("".join(e.text for e in emissions))
        blocks = [thinking_block(parts.reasoning)] if parts.reasoning else []
        blocks += [{"type": "text", "text": parts.content}] if parts.content else []
        blocks += [tool_use(call) for call in parts.calls]
        return self.message(blocks, session, bool(parts.calls))

    async def events(self, emissions: AsyncIterator[Emission], prepared: Prepared,
                     prompt: Session) -> AsyncIterator[str]:
        """message_start, each block's start, deltas and stop, message_delta, message_stop.
        `prompt`: the session, its prompt evaluated."""
        writer = BlockWriter()
        started = {**self.message([], None), "usage": {**prompt_usage(prompt),
                                                        "output_tokens": 0}}
        yield writer.event("message_start", message=started)
        yield writer.event("ping")
        deltas, last, called = prepared.deltas(), None, False
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


def thinking_block(text: str) -> dict[str, Any]:
    """A thinking model's reasoning (unsigned: lead skips thinking blocks sent back)."""
    return {"type": "thinking", "thinking": text, "signature": ""}


# A streamed part's block: its kind, the block that opens it, its delta's type and key
BLOCKS = {"content": ("text", {"type": "text", "text": ""}, "text_delta", "text"),
          "reasoning": ("thinking", thinking_block(""), "thinking_delta", "thinking")}


class BlockWriter:
    """The Messages stream's events: content blocks opened, filled and closed in order."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # the kind of the block being filled (text, thinking)

    @staticmethod
    def event(kind: str, **fields: Any) -> str:
        data = {"type": kind, **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def delta(self, part: dict[str, Any]) -> list[str]:
        key = next((k for k in BLOCKS if k in part), None)
        if key is not None:
            kind, block, delta_type, field = BLOCKS[key]
            out = [] if self.open == kind else self._close() + self._open(block)
            self.open = kind
            return out + [self.event("content_block_delta", index=self.index,
                                     delta={"type": delta_type, field: part[key]})]
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
        if not (self.open or force):
            return []
        self.open = None
        return [self.event("content_block_stop", index=self.index)]

    def closing(self, session: Session, called: bool) -> list[str]:
        delta = {"stop_reason": stop_reason(session, called),
                 "stop_sequence": session.stop_sequence}
        used = usage(session)
        return [*self._close(), self.event("message_delta", delta=delta, usage=used),
                self.event("message_stop")]
