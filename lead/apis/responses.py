"""OpenAI's Responses API (POST /v1/responses) over lead's chat: a request turned into a
chat request, a reply turned into a response object or its stream of events.

Each field and what lead does with it: lead/apis/fields.py (RESPONSES). Codex CLI's
requests are served whole: its namespaced tools are functions, its hosted web search is
not offered, its reasoning settings and items are hints the model cannot take.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lead.apis import fields, shapes
from lead.apis.renames import ORIGIN, Names, chat_request

LOGPROBS = "message.output_text.logprobs"
ROLES = ("user", "assistant", "system", "developer")
# The chat request's fields this request names otherwise (its messages: where each came from)
NAMES = {"max_tokens": "max_output_tokens", "response_format.json_schema": "text.format",
         "response_format": "text.format", "tool_choice.function": "tool_choice",
         "logprobs": "include", "messages": "input"}
# Items of earlier turns that say nothing the model can read again: its reasoning (the
# model here writes none; another's is encrypted), hosted tools' calls lead never ran
SKIPPED = {"reasoning", "web_search_call", "file_search_call", "code_interpreter_call",
           "image_generation_call", "compaction", "compaction_summary"}
# Tools the API hosts (it runs them, not the client): lead has none, so the model is not
# offered them; a tool_choice forcing one is refused
HOSTED = {"web_search", "web_search_preview", "file_search", "code_interpreter",
          "image_generation", "computer_use_preview", "mcp", "local_shell", "shell",
          "apply_patch", "tool_search"}  # tool_search: Codex's, for its catalog's models


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # what else it holds: lead/apis/fields.py
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
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    reasoning: dict[str, Any] | None = None
    return_progress: bool = False  # llama-server's: response.in_progress with prompt_progress
    timings_per_token: bool = False  # llama-server's: each text delta with the timings so far


def refusal(body: ResponsesRequest) -> shapes.FieldRefused | None:
    """The 400 for the first field whose absence of service would change the reply."""
    try:
        fields.judge(fields.RESPONSES, body.model_extra or {}, "/v1/responses")
    except fields.Unserved as exc:
        return shapes.openai_refusal(exc)
    fmt = (body.text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        return shapes.FieldRefused("text.format", "text.format: an object, e.g. "
                                                  '{"type": "json_schema", "schema": {...}}')
    return None


def thinking(body: ResponsesRequest) -> bool | None:
    """A thinking switch's setting from `reasoning.effort` (None: the template's default)."""
    effort = (body.reasoning or {}).get("effort")
    return None if effort is None else effort != "none"


def to_chat(body: ResponsesRequest) -> tuple[shapes.ChatRequest, Names, Tools]:
    """The chat request this response is decoded as, where its fields came from (a 400
    naming the field at fault, as this request writes it), and its tools' own kinds."""
    messages = ([{"role": "system", "content": body.instructions,
                  ORIGIN: {"": "instructions"}}] if body.instructions else []) + \
        _messages(body.input)
    logprobs = LOGPROBS in (body.include or []) or bool(body.top_logprobs)
    effort = thinking(body)
    fields_ = {"messages": messages, "max_tokens": body.max_output_tokens,
               **shapes.given(body, "temperature", "top_p"), "stream": body.stream,
               "return_progress": body.return_progress,
               "response_format": _format(body.text), "logprobs": logprobs or None,
               "top_logprobs": body.top_logprobs if logprobs else None,
               "reasoning_effort": None if effort is None else ("low" if effort else "none")}
    tools = Tools.of(body.tools or [])
    names = {**NAMES, **tools.names}
    if body.tools is not None:
        fields_["tools"] = tools.chat
    if body.tool_choice is not None:
        fields_["tool_choice"] = _tool_choice(body.tool_choice)
    chat, names = chat_request({k: v for k, v in fields_.items() if v is not None}, names)
    return chat, names, tools


class Tools:
    """A request's tools as chat's function tools: functions (in a namespace too) as they
    are, a custom tool as a function of one string (`input`); hosted tools left out."""

    def __init__(self) -> None:
        self.chat: list[dict[str, Any]] = []
        self.names: Names = {}  # chat path -> the request's
        self.kinds: dict[str, dict[str, Any]] = {}  # a function's name -> its item's fields

    @classmethod
    def of(cls, given: list[Any]) -> Tools:
        tools = cls()
        for i, tool in enumerate(given):
            tools._add(f"tools[{i}]", tool)
        return tools

    def _add(self, where: str, tool: Any, namespace: str | None = None) -> None:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace" and namespace is None and isinstance(tool.get("tools"), list):
            for j, inner in enumerate(tool["tools"]):
                self._add(f"{where}.tools[{j}]", inner, str(tool.get("name", "")))
        elif kind in ("function", "custom"):
            self.names[f"tools[{len(self.chat)}].function"] = where
            self.chat.append(_function(where, tool) if kind == "function" else _custom(tool))
            self.kinds[str(tool.get("name"))] = {"custom": kind == "custom",
                                                 "namespace": namespace}
        elif kind not in HOSTED:
            raise shapes.FieldRefused(f"{where}.type", f"{where}.type: {kind!r} tools are not "
                                                       "served (function, custom, namespace "
                                                       "are; hosted tools are skipped)")

    def item(self, call: dict[str, Any], status: str) -> dict[str, Any]:
        """A call's output item: a function call, or a custom tool's call with its input."""
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        kind = self.kinds.get(name, {})
        if kind.get("custom"):
            return {"type": "custom_tool_call", "id": new_id("ctc"), "call_id": call["id"],
                    "name": name, "input": _custom_input(arguments), "status": status}
        item = {"type": "function_call", "id": new_id("fc"), "call_id": call["id"],
                "name": name, "arguments": arguments, "status": status}
        return {**item, "namespace": kind["namespace"]} if kind.get("namespace") else item


def _function(where: str, tool: dict[str, Any]) -> dict[str, Any]:
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


def _custom(tool: dict[str, Any]) -> dict[str, Any]:
    """A custom tool (free text in) as a function of one string: its format's grammar, if
    any, is described to the model, not enforced."""
    return {"type": "function", "function": {
        "name": tool.get("name"), "description": tool.get("description") or "",
        "parameters": {"type": "object", "properties": {"input": {"type": "string"}},
                       "required": ["input"]}}}


def _custom_input(arguments: str) -> str:
    try:
        value = json.loads(arguments or "{}").get("input", "")
    except (ValueError, AttributeError):
        return arguments
    return value if isinstance(value, str) else json.dumps(value)


def _messages(given: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(given, str):
        return [{"role": "user", "content": given, ORIGIN: {"": "input", ".content": "input"}}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(given):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            out.append({"role": _role(i, item),
                        "content": shapes.text_parts(_texts(f"input[{i}]", item)),
                        ORIGIN: {"": f"input[{i}]"}})
        elif kind in ("function_call", "custom_tool_call"):
            _add_call(out, i, item)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": _text(f"input[{i}]", item, "output"),
                        ORIGIN: {"": f"input[{i}]", ".content": f"input[{i}].output",
                                 ".tool_call_id": f"input[{i}].call_id"}})
        elif kind not in SKIPPED:
            raise shapes.FieldRefused(f"input[{i}].type", f"input[{i}].type: {kind!r} items are "
                                                      "not served (messages, function and "
                                                      "custom tool calls and their outputs "
                                                      "are)")
    return out


def _role(i: int, item: dict[str, Any]) -> str:
    role = item.get("role")
    if role not in ROLES:
        raise shapes.FieldRefused(f"input[{i}].role", f"input[{i}].role: one of "
                                                   f"{', '.join(ROLES)}")
    return role


def _text(where: str, item: dict[str, Any], key: str = "content") -> str:
    """An item's text: a string, or its text parts joined."""
    return "".join(_texts(where, item, key))


def _texts(where: str, item: dict[str, Any], key: str = "content") -> list[str]:
    """An item's texts: a string, or its text parts."""
    content = item.get(key)
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise shapes.FieldRefused(f"{where}.{key}", f"{where}.{key}: text or a list of parts")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise shapes.FieldRefused(f"{where}.{key}[{j}].type", f"{where}.{key}[{j}].type: "
                                   f"only text parts are served, not {kind!r}")
    return [str(part.get("text", "")) for part in content]


def _add_call(out: list[dict[str, Any]], i: int, item: dict[str, Any]) -> None:
    """A call of the model's, into the assistant message before it (calls in a row: one);
    a custom tool's input as its one argument."""
    where = f"input[{i}]"
    arguments = item.get("arguments", "{}") if item.get("type") == "function_call" else \
        json.dumps({"input": item.get("input", "")})
    call = {"id": item.get("call_id"), "type": "function",
            "function": {"name": item.get("name"), "arguments": arguments},
            ORIGIN: {"": where, ".id": f"{where}.call_id", ".function": where}}
    if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
        out[-1]["tool_calls"].append(call)
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call],
                    ORIGIN: {"": where}})


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("function", "custom"):
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind in HOSTED:
        raise shapes.FieldRefused("tool_choice", f"tool_choice: lead has no {kind} tool to "
                                                 "force")
    if kind == "allowed_tools":  # a subset the model may call: all are offered, as a hint
        return choice.get("mode", "auto")
    return choice  # "auto", "none", "required"; anything else tools.py refuses


def _format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return {"type": fmt.get("type")}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"
