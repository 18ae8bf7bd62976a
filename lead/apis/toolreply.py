"""A chat request's tools joined to the model and to the reply (lead/apis/tools.py and
lead/apis/toolparse.py are the pure parts): the prompt with the tools the template renders,
the grammar a forced call follows, and the calls parsed out of the reply, whole or
streamed as deltas."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from lead.apis.generictools import generic_messages
from lead.apis.shapes import ChatRequest, FieldRefused
from lead.apis.thinking import ThinkSplit
from lead.apis.toolparse import Delta, ToolStream, finish_reason
from lead.apis.tools import ToolPlan, ToolsError, plan_tools, template_messages, wrap_gbnf
from shared.chat_template import continued
from shared.model import Model


def chat_prompt(model: Model, body: ChatRequest) -> tuple[ToolPlan, str]:
    """The request's tool plan and its prompt; FieldRefused naming a bad tools field,
    ValueError where the chat template refuses the messages."""
    try:
        plan = plan_tools(model.chat_template, body.tools, body.tool_choice)
        last = len(body.messages) - 1
        messages = template_messages([m.for_template(i == last)
                                      for i, m in enumerate(body.messages)])
    except ToolsError as exc:
        raise FieldRefused(exc.param, str(exc)) from None
    if plan.generic:
        messages = generic_messages(messages, plan.tools, plan.choice.mode == "required")
    render = partial(_render, model, plan.template_tools(),
                     body.thinking if model.thinks else None, body.add_generation_prompt)
    try:
        return plan, render(messages)
    except ValueError:  # many templates take a system message only first
        folded = folded_system(messages)
        if folded == messages:
            raise
        return plan, render(folded)


def _render(model: Model, tools: list[dict[str, Any]] | None, thinking: bool | None,
            generation_prompt: bool, messages: list[dict[str, Any]]) -> str:
    prefill = prefilled(messages)
    if not prefill:
        return model.format_chat(messages, tools, add_generation_prompt=generation_prompt,
                                 thinking=thinking)
    # the reply continues the assistant's last message (llama-server's prefill)
    rendered = model.format_chat(messages, tools, add_generation_prompt=False,
                                 thinking=thinking)
    prompt = continued(rendered, prefill)
    if prompt is not None:
        return prompt
    return model.format_chat(messages[:-1], tools, thinking=thinking) + prefill


def prefilled(messages: list[dict[str, Any]]) -> str:
    """The text of an assistant's message that ends the conversation (no calls): the
    start of the reply, which the reply continues; "" where there is none."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return ""
    return last.get("content") or ""


def folded_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with each system message after its start folded into the user
    message next to it (the next, else the one before), as a <system-reminder> the way
    Claude Code folds its own: the start, and so the cached prefix, stays as it was."""
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    out = messages[:head]
    pending: list[str] = []
    for message in messages[head:]:
        if message["role"] == "system":
            pending.append(f"<system-reminder>\n{message['content']}\n</system-reminder>")
        elif message["role"] == "user" and pending:
            out.append({**message, "content": "\n\n".join([*pending, message["content"]])})
            pending = []
        else:
            out.append(message)
    users = [i for i, m in enumerate(out) if m["role"] == "user"]
    if pending and not users:
        return messages  # nowhere to fold them
    if pending:
        last = out[users[-1]]
        out[users[-1]] = {**last, "content": "\n\n".join([last["content"], *pending])}
    return out


def forced_grammar(plan: ToolPlan, model: Model) -> str | None:
    """GBNF for the call that tool_choice "required" or a named function forces."""
    if plan.grammar is None:
        return None
    try:  # a function's parameters are a hint to the model: keywords past the grammar pass
        schema_gbnf = model.schema_grammar(plan.grammar.schema, strict=False)
    except ValueError as exc:
        where, why = _unconvertible(plan, model) or ("tools", str(exc))
        raise FieldRefused(where, f"{where}: {why}") from None
    return wrap_gbnf(schema_gbnf, plan.grammar)


def _unconvertible(plan: ToolPlan, model: Model) -> tuple[str, str] | None:
    """(field, why) of the first tool the call may name whose parameters alone do not
    convert, its path inside them; None where each does, and only their union does not."""
    for i, tool in enumerate(plan.tools):
        if not plan.choice.allows(tool):
            continue
        try:
            model.schema_grammar(tool["function"]["parameters"], strict=False)
        except ValueError as exc:
            return f"tools[{i}].function.parameters", str(exc)
    return None


@dataclass(frozen=True)
class Parts:
    """A finished reply's reasoning (a thinking model's), content and calls."""

    reasoning: str
    content: str | None
    calls: list[dict[str, Any]]


def reply_parts(text: str, plan: ToolPlan | None, think: ThinkSplit | None) -> Parts:
    """A whole reply parsed as its stream is: the reasoning split out, then the calls."""
    reasoning = ""
    if think is not None:
        parts = think.push(text) + think.finish()
        reasoning = "".join(p.get("reasoning", "") for p in parts)
        text = "".join(p.get("content", "") for p in parts)
    content, calls = plan.parse(text) if plan is not None else (text, [])
    return Parts(reasoning, content, calls)


def with_parts(choice: dict[str, Any], parts: Parts) -> dict[str, Any]:
    """A plain reply's choice with its content as parsed, the calls it holds (OpenAI's
    message.tool_calls, finish_reason "tool_calls") and its reasoning, if any (as
    llama-server's reasoning_content)."""
    message = {**choice["message"], "content": parts.content}
    if parts.reasoning:
        message["reasoning_content"] = parts.reasoning
    if not parts.calls:
        return {**choice, "message": message}
    return {**choice, "message": {**message, "tool_calls": parts.calls},
            "finish_reason": finish_reason(choice["finish_reason"], True)}


class Deltas:
    """A streamed reply's text as chunk deltas: content as it comes, or, with tools,
    content and whole calls as the parser releases them; a thinking model's reasoning
    split out first (`{"reasoning": ...}`)."""

    def __init__(self, plan: ToolPlan | None, think: ThinkSplit | None = None) -> None:
        self.stream: ToolStream | None = plan.stream() if plan is not None else None
        self.think = think

    def push(self, text: str) -> list[Delta]:
        return self._answer(self.think.push(text) if self.think else [{"content": text}])

    def finish(self) -> list[Delta]:
        out = self._answer(self.think.finish()) if self.think else []
        return out + (self.stream.finish() if self.stream is not None else [])

    def _answer(self, parts: list[Delta]) -> list[Delta]:
        out: list[Delta] = []
        for part in parts:
            if "reasoning" in part or self.stream is None:
                out += [part] if next(iter(part.values())) else []
            else:
                out += self.stream.push(part["content"])
        return out

    def finish_reason(self, finish: str | None) -> str | None:
        return self.stream.finish_reason(finish) if self.stream is not None else finish
