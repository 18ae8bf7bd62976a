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
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lead.apis import fields, shapes
from lead.apis.renames import ORIGIN, Names, chat_request

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 529: "overloaded_error"}
# Blocks of earlier turns the model cannot read again: redacted thinking (encrypted for
# Anthropic's), server tools' calls and results lead never ran. Thinking is read again:
# the assistant's reasoning_content, which templates render where they use it
SKIPPED = {"redacted_thinking", "server_tool_use", "web_search_tool_result",
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
    except fields.Unserved as exc:
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
        **shapes.given(body, "temperature", "top_p", "top_k"),
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
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        _take_block(f"messages[{i}].content[{j}]", block, texts, calls, results)
    thought = "".join(str(b.get("thinking", "")) for b in content
                      if isinstance(b, dict) and b.get("type") == "thinking")
    text = shapes.text_parts(texts) if texts else ""  # joined as llama-server joins parts
    extra = {**({"tool_calls": calls} if calls else {}),
             **({"reasoning_content": thought} if thought else {})}
    own = [{"role": role, "content": text, ORIGIN: origin, **extra}] \
        if text or calls or thought else []
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
    elif kind not in SKIPPED and kind != "thinking":  # thinking: the caller's
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
