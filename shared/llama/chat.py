"""Chat templates without Jinja: llama.cpp's built-in ones (llama-server without --jinja).

llama.cpp recognises a template by its source or by name (chatml, llama3, command-r,
...) and renders it in C++: what `--no-jinja` and `--chat-template NAME` give there.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp


def _text(content: Any) -> str:
    """A message's content as one text (llama-server joins the parts' text with newlines)."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


class BuiltinTemplate:
    """A template llama.cpp renders itself: `name_or_source` as llama_chat_apply_template
    takes it. Same `render` as shared.chat_template.ChatTemplate; no tools, no thinking."""

    thinking_switch = False

    def __init__(self, name_or_source: str) -> None:
        self.source = name_or_source
        self.render([{"role": "user", "content": "x"}])  # an unknown name fails at start

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, thinking: bool | None = None) -> str:
        if tools:
            raise ValueError("tools param requires --jinja flag")
        texts = [(str(m.get("role", "")).encode(), _text(m.get("content")).encode())
                 for m in messages]
        chat = (llama_cpp.llama_chat_message * max(len(texts), 1))(
            *(llama_cpp.llama_chat_message(role=r, content=c) for r, c in texts))
        size = 2 * sum(len(r) + len(c) for r, c in texts) + 256
        for _ in range(2):  # once more where the first buffer was too small
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_chat_apply_template(self.source.encode(), chat, len(texts),
                                                    add_generation_prompt, buf, size)
            if n < 0:
                raise ValueError(f"llama.cpp has no built-in chat template like "
                                 f"{self.source[:40]!r} (give --jinja)")
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1
        raise AssertionError("unreachable")
