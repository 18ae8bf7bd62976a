"""A thinking model's reply split into its reasoning and its answer (pure).

Models whose chat template switches thinking (Qwen3 and its kind: `enable_thinking`)
write `<think>...</think>` before the answer; some templates open the `<think>` in the
prompt, so the reply starts inside it. The reasoning goes out as each API carries it
(chat: `reasoning_content`, as llama-server and DeepSeek send it; Messages: a thinking
block; Responses: a reasoning item), the answer as content, to the tool parser as before.
Text is released as it comes but for a prefix of a marker, held until it is told apart.
"""

from __future__ import annotations

from lead.apis.toolparse import Delta

OPEN, CLOSE = "<think>", "</think>"


def starts_inside(prompt: str) -> bool:
    """Whether a prompt leaves its reply inside the reasoning (it ends opening it)."""
    return prompt.rstrip().endswith(OPEN)


class ThinkSplit:
    """Text in as it is released; `{"reasoning": ...}` and `{"content": ...}` deltas out."""

    def __init__(self, inside: bool = False) -> None:
        self.inside = inside
        self._opened = inside  # the reasoning was opened (its start is decided)
        self._done = False  # the reasoning closed, or the reply has none
        self._closed = False  # the reasoning closed: the answer's first blank lines go
        self._fresh = True  # nothing of the reasoning out yet: its first newlines go
        self._held = ""

    def push(self, text: str) -> list[Delta]:
        self._held += text
        if not self._opened and not self._done:
            self._open()
        if self.inside:
            return self._reasoning()
        if self._closed:
            self._held = self._held.lstrip()
            self._closed = not self._held
        return self._release("content", len(self._held))

    def finish(self) -> list[Delta]:
        kind = "reasoning" if self.inside else "content"
        return self._release(kind, len(self._held))

    def _open(self) -> None:
        head = self._held.lstrip()
        if head.startswith(OPEN):
            self._held, self.inside, self._opened = head[len(OPEN):], True, True
        elif not OPEN.startswith(head):  # no reasoning in this reply
            self._done = True

    def _reasoning(self) -> list[Delta]:
        if self._fresh:
            self._held = self._held.lstrip("\n")
            self._fresh = not self._held
        end = self._held.find(CLOSE)
        if end < 0:
            return self._release("reasoning", len(self._held) - _partial(self._held, CLOSE))
        out = self._release("reasoning", end)
        self._held = self._held[len(CLOSE):].lstrip()
        self.inside, self._done, self._closed = False, True, not self._held
        return out + self._release("content", len(self._held))

    def _release(self, kind: str, n: int) -> list[Delta]:
        if not self._opened and not self._done:
            return []  # still telling whether the reply opens with reasoning
        text, self._held = self._held[:n], self._held[n:]
        return [{kind: text}] if text else []


def _partial(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that begins `marker`."""
    return next((n for n in range(min(len(marker) - 1, len(text)), 0, -1)
                 if text.endswith(marker[:n])), 0)
