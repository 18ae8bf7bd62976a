"""A GGUF's chat template rendered as llama.cpp's server and Hugging Face render it: Jinja
in a sandbox, with `raise_exception`, `strftime_now`, the bos and eos texts, and per call
`add_generation_prompt` and the template's own switches (`enable_thinking`).

Rendered here rather than through llama-cpp-python's formatter, which fixes
`add_generation_prompt` when it is made and passes no other variable: a reply that
continues the assistant's last message needs the first off, a thinking model the second.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

THINK, THINK_END = "<think>", "</think>"
THINKING_SWITCH = "enable_thinking"  # Qwen3's and others' templates read it


def _raise(message: str) -> None:
    raise ValueError(message)


def _now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Hugging Face's (the model was trained on its prompts): Jinja's own escapes <, >, &
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    def __init__(self, source: str, bos: str = "", eos: str = "") -> None:
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=["jinja2.ext.loopcontrols"])
        environment.filters["tojson"] = _tojson
        self.source, self.bos, self.eos = source, bos, eos
        self.thinking: bool | None = None  # a thinking model's default (--reasoning)
        self._template = environment.from_string(source)

    @property
    def thinking_switch(self) -> bool:
        """Whether the template turns the model's thinking on and off."""
        return THINKING_SWITCH in self.source

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, thinking: bool | None = None) -> str:
        """The prompt; ValueError with the template's own message where it refuses the
        messages (many raise on a role they do not know, or on roles out of turn)."""
        thinking = self.thinking if thinking is None else thinking
        switches = {THINKING_SWITCH: thinking} if thinking is not None else {}
        try:
            text = self._template.render(
                messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos, eos_token=self.eos, raise_exception=_raise,
                strftime_now=_now, date_string=_now("%d %b %Y"), **switches)
        except Exception as exc:  # a template is the model's code: any error is the input's
            raise ValueError(str(exc) or type(exc).__name__) from None
        # reasoning off where the template opens it regardless (DeepSeek-R1's, QwQ's): closed
        if thinking is False and add_generation_prompt and text.rstrip().endswith(THINK):
            return text + THINK_END
        return text


def continued(rendered: str, text: str) -> str | None:
    """The prompt that continues the assistant's last message `text`, from the conversation
    rendered with it and without a generation prompt: cut right after its text (as
    Hugging Face's continue_final_message does), so the end of its turn is not there. None
    where the template did not render the text as given."""
    for wanted in (text, text.strip()):
        at = rendered.rfind(wanted) if wanted else -1
        if at >= 0:
            return rendered[:at + len(wanted)]
    return None
