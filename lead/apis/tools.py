"""OpenAI tool calling's pure core: a request's tools and tool_choice checked, the
messages and tools the chat template reads, which call format the model writes (from
its template), and the grammar a forced call follows. The reply's calls are parsed in
lead/apis/toolparse.py.

tool_choice "none" renders no tools and parses no calls: the prompt is the one without
tools, so the model answers in prose and nothing it writes can become a call (history
with calls still renders).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lead.apis.generictools import GenericStream, reply_schema
from lead.apis.toolparse import (
    GENERIC,
    HERMES,
    LLAMA3,
    MISTRAL,
    CallFormat,
    ToolStream,
    parse_reply,
)
from shared.grammar.schema_bounds import within_bounds

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name

# A family and what in a chat template shows it, first match wins (Qwen 2.5 and 3,
# Hermes 2 Pro/3: <tool_call>; Mistral: [TOOL_CALLS]; Llama 3.1-3.3: a JSON object with
# "parameters", <|python_tag|> for built-in tools).
FAMILIES: list[tuple[CallFormat, tuple[str, ...]]] = [
    (HERMES, ("<tool_call>",)),
    (MISTRAL, ("[TOOL_CALLS]",)),
    (LLAMA3, ("<|python_tag|>", '"parameters": ')),
]


class ToolsError(ValueError):
    """A request's tools, tool_choice or tool messages refused; `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def detect_format(template: str | None) -> CallFormat | None:
    """The call format a chat template's model writes; None where none is known."""
    for fmt, marks in FAMILIES:
        if template and any(mark in template for mark in marks):
            return fmt
    return None


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "none", "auto" or "required" (a named function is required too)
    name: str | None = None  # the one function allowed, when named

    def allows(self, tool: dict[str, Any]) -> bool:
        """Whether a forced call may name this tool."""
        return self.name in (None, tool["function"]["name"])


@dataclass(frozen=True)
class CallGrammar:
    """A forced call: `prefix`, JSON valid against `schema`, `suffix`, then the end."""

    prefix: str
    schema: dict[str, Any]
    suffix: str


@dataclass(frozen=True)
class ToolPlan:
    """What one request asks of tools, checked: what the template gets, how to parse."""

    fmt: CallFormat | None  # None: calls are not parsed (tool_choice "none")
    tools: list[dict[str, Any]] = field(default_factory=list)  # for the template
    choice: ToolChoice = ToolChoice("none")
    grammar: CallGrammar | None = None  # set for "required" and a named function

    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def generic(self) -> bool:
        """The template has no call format: the generic JSON one (lead/apis/generictools.py)."""
        return self.fmt is GENERIC

    def stream(self) -> ToolStream | GenericStream | None:
        """A parser for a streamed reply's text, or None where text is only content."""
        if self.fmt is None:
            return None
        return GenericStream(self.names()) if self.generic else ToolStream(self.fmt,
                                                                            self.names())

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """A finished reply's (content, tool_calls)."""
        if self.fmt is None:
            return text, []
        if not self.generic:
            return parse_reply(self.fmt, text, self.names())
        stream = GenericStream(self.names())
        deltas = stream.push(text) + stream.finish()
        content = "".join(d.get("content", "") for d in deltas)
        return (content or None) if stream.calls else content, stream.calls

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The template's `tools` variable (None: render as without tools; the generic
        format describes them in a system message)."""
        return None if self.generic else self.tools or None


def plan_tools(template: str | None, tools: Any, tool_choice: Any) -> ToolPlan:
    """Check a request's `tools` and `tool_choice` against the model's template."""
    checked = check_tools(tools)
    choice = check_tool_choice(tool_choice, checked)
    if choice.mode == "none":
        return ToolPlan(None)
    fmt = detect_format(template) or GENERIC
    return ToolPlan(fmt, checked, choice, call_grammar(fmt, checked, choice))


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """OpenAI-shaped tools, normalised: {type, function: {name, description?,
    parameters}}; ToolsError naming the first field that is not."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ToolsError("tools", "must be a list of {type: function, function: {...}}")
    checked = [_check_tool(i, tool) for i, tool in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ToolsError(f"tools[{i}].function.name", f"{name!r} is named twice")
    return checked


def _check_tool(i: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ToolsError(f"{where}.type", 'only "function" tools are served')
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ToolsError(f"{where}.function", "must be an object")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolsError(f"{where}.function.name", "must be 1-64 letters, digits, _ or -")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolsError(f"{where}.function.description", "must be a string")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise ToolsError(f"{where}.function.parameters", "must be a JSON schema object")
    described = {"description": description} if description is not None else {}
    return {"type": "function",
            "function": {"name": name, **described, "parameters": parameters}}


def check_tool_choice(choice: Any, tools: Sequence[dict[str, Any]]) -> ToolChoice:
    """tool_choice checked against the tools; absent: "auto" with tools, else "none"."""
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if choice == "none":
        return ToolChoice("none")
    if not tools:
        raise ToolsError("tool_choice", "needs tools")
    if choice in ("auto", "required"):
        return ToolChoice(choice)
    name = _named(choice)
    if name not in {t["function"]["name"] for t in tools}:
        raise ToolsError("tool_choice.function.name", f"{name!r} is not in tools")
    return ToolChoice("required", name)


def _named(choice: Any) -> str:
    function = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or \
            not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ToolsError("tool_choice", 'must be "none", "auto", "required" or '
                                        '{"type": "function", "function": {"name": ...}}')
    return function["name"]


def call_grammar(fmt: CallFormat, tools: Sequence[dict[str, Any]],
                 choice: ToolChoice) -> CallGrammar | None:
    """The shape a forced call takes ("required": any one tool; named: that one); in the
    generic format, every reply's (a call, or under "auto" an answer)."""
    if choice.mode != "required" and fmt is not GENERIC:
        return None
    # parameters are a hint: what is over a grammar's bounds is left out, not refused
    allowed = [{**t["function"], "parameters": within_bounds(t["function"]["parameters"])}
               for t in tools if choice.allows(t)]
    if fmt is GENERIC:
        functions = [{**f, "parameters": _without(f["parameters"], _DEFS)} for f in allowed]
        schema = reply_schema(functions, choice.mode == "required")
        return CallGrammar("", {**schema, **_hoisted_defs(allowed)}, "")
    options = [_call_schema(fmt.key, f["name"], _without(f["parameters"], _DEFS))
               for f in allowed]
    one = options[0] if len(options) == 1 else {"anyOf": options}
    schema = {"type": "array", "items": one, "minItems": 1} if fmt.array else one
    return CallGrammar(fmt.prefix, {**schema, **_hoisted_defs(allowed)}, fmt.suffix)


_DEFS = ("$defs", "definitions")  # where "#/$defs/X" refs point: the schema's root


def _without(schema: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k not in keys}


def _hoisted_defs(functions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The parameters' definitions, moved to the call schema's root, where their refs
    (pydantic writes "#/$defs/X") still resolve; ToolsError where two tools define one
    name differently."""
    hoisted: dict[str, dict[str, Any]] = {}
    for function in functions:
        for key in _DEFS:
            for name, definition in (function["parameters"].get(key) or {}).items():
                found = hoisted.setdefault(key, {}).setdefault(name, definition)
                if found != definition:
                    raise ToolsError("tools", f"{key}/{name} is defined differently by two "
                                              "tools' parameters")
    return hoisted


def _call_schema(key: str, name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": name}, key: parameters},
            "required": ["name", key]}


def wrap_gbnf(schema_gbnf: str, grammar: CallGrammar) -> str:
    """A GBNF for the whole call from the schema's GBNF (whose start rule is `root`,
    as llama.cpp's converters write it): prefix, the JSON, suffix."""
    renamed = re.sub(r"^root ::=", "call-json ::=", schema_gbnf, flags=re.MULTILINE)
    body = " ".join(p for p in (_gbnf_literal(grammar.prefix), "call-json",
                                _gbnf_literal(grammar.suffix)) if p)
    return f"root ::= {body}\n{renamed}"


def _gbnf_literal(text: str) -> str:
    if not text:
        return ""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as chat templates read them: a call's arguments as a mapping (Qwen
    and Llama render them with `tojson`: a JSON string would come out quoted), keys
    only where set (Llama tests `'tool_calls' in message`), content "" where null, a
    tool result named after its call where the client did not name it."""
    names: dict[str, str] = {}
    out = []
    for i, message in enumerate(messages):
        item = {"content": "", **{k: v for k, v in message.items()
                                  if v is not None and k != "tool_calls"}}
        calls = _template_calls(i, message.get("tool_calls"))
        if calls:
            item["tool_calls"] = calls
            names.update((c["id"], c["function"]["name"]) for c in calls)
        call_name = names.get(message.get("tool_call_id") or "")
        if message.get("role") == "tool" and call_name and not item.get("name"):
            item["name"] = call_name
        out.append(item)
    return out


def _template_calls(i: int, calls: Any) -> list[dict[str, Any]]:
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise ToolsError(f"messages[{i}].tool_calls", "must be a list")
    return [_template_call(f"messages[{i}].tool_calls[{j}]", call)
            for j, call in enumerate(calls)]


def _template_call(where: str, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ToolsError(f"{where}.function", "must be {name, arguments}")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise ToolsError(f"{where}.id", "must be a non-empty string")
    return {"id": call_id, "type": "function",
            "function": {"name": function["name"],
                         "arguments": _arguments(f"{where}.function.arguments",
                                                 function.get("arguments"))}}


def _arguments(where: str, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}") if isinstance(arguments, str) else None
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ToolsError(where, "must be a JSON object, as a string")
    return value
