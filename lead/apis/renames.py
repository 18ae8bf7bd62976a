"""A translated request's errors, named as its client wrote the request.

/v1/messages, /v1/responses and /infill are decoded as chat (or completion) requests, and
most of their checks are the chat request's own: a client of Anthropic's API must not be
told about `tools[0].function.parameters` when it sent `tools[0].input_schema`. Each
translation records where the chat request's fields came from (`Names`: a chat path
-> the client's path); a refusal's path is renamed by its longest recorded prefix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from lead.apis.shapes import ChatRequest, ContextExceeded, FieldRefused

Names = dict[str, str]
T = TypeVar("T")
ORIGIN = "_origin"  # a translated message's or call's Names, relative to itself ("": itself)

# pydantic's name for the member of a union it tried (str, list[Part], function-after[...])
_UNION_MEMBER = re.compile(r"[\[\](),]|^(function-\w+|str|int|float|bool|list|dict|none)$")


def field_path(loc: tuple[int | str, ...]) -> str:
    """A validation error's place as the request writes it: messages[0].content."""
    path = ""
    if loc[:1] in (("query",), ("path",), ("header",)):  # where FastAPI found it
        loc = loc[1:]
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "body" and not _UNION_MEMBER.search(part):
            path += f".{part}" if path else part
    return path


def validation_message(error: Any) -> str:
    """A pydantic error's message, without the "Value error, " a validator's gets."""
    return str(error.get("msg", "")).removeprefix("Value error, ")


def renamed(path: str, names: Names) -> str:
    """`path` with its longest recorded prefix (a whole field: up to a "." or "[")
    replaced by the client's name for it."""
    for chat in sorted(names, key=len, reverse=True):
        if path == chat or path.startswith((chat + ".", chat + "[")):
            return names[chat] + path[len(chat):]
    return path


def refused_as(exc: FieldRefused, names: Names) -> FieldRefused:
    """The same refusal in the client's names (its message leads with its field)."""
    param = renamed(exc.param, names)
    if isinstance(exc, ContextExceeded):
        return ContextExceeded(param, exc.n_prompt, exc.n_ctx)
    message = str(exc.detail)
    if message.startswith(exc.param):
        message = param + message[len(exc.param):]
    return FieldRefused(param, message, exc.code)


def renaming(names: Names, call: Callable[[], T]) -> Callable[[], T]:
    """`call`, with the FieldRefused it raises renamed."""
    def renamed_call() -> T:
        try:
            return call()
        except FieldRefused as exc:
            raise refused_as(exc, names) from None
    return renamed_call


def validated(model: Callable[[dict[str, Any]], T], fields: dict[str, Any],
              names: Names) -> T:
    """`model(fields)`, its first validation error a 400 in the client's names."""
    try:
        return model(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = field_path(tuple(first.get("loc", ())))
        message = validation_message(first)
        raise refused_as(FieldRefused(where, f"{where}: {message}" if where else message),
                         names) from None


def chat_request(fields: dict[str, Any], names: Names) -> tuple[ChatRequest, Names]:
    """The chat request of a translation's `fields`, and its Names: the top-level ones
    given, with each message's and call's origins (popped) under their chat paths."""
    names = {**names, **popped_origins(fields.get("messages", []))}
    return validated(ChatRequest.model_validate, fields, names), names


def popped_origins(messages: list[dict[str, Any]]) -> Names:
    names: Names = {}
    for k, message in enumerate(messages):
        names.update(_under(f"messages[{k}]", message.pop(ORIGIN, {})))
        for j, call in enumerate(message.get("tool_calls") or []):
            names.update(_under(f"messages[{k}].tool_calls[{j}]", call.pop(ORIGIN, {})))
    return names


def _under(path: str, relative: Names) -> Names:
    return {path + rel: client for rel, client in relative.items()}
