"""The interactive REPL and the piped mode."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from chat.client import ChatClient, ChatError, ReplyStats

DRAFT_COLOUR = "\x1b[32m"  # accepted-draft tokens in green, as llama_duo's console does
DIM, RESET = "\x1b[2m", "\x1b[0m"
HELP = """commands:
  /new            start a fresh conversation
  /system TEXT    set the system prompt (and start fresh)
  /stats          lead's metrics: backs attached, acceptance, draft length
  /help           this text
  /quit           leave (or Ctrl-D)
Enter sends; Alt-Enter (or Esc then Enter) adds a line; pasted text keeps its lines.
Ctrl-C stops a reply. Tokens from accepted drafts are shown in green."""


@dataclass
class Conversation:
    system: str | None = None
    turns: list[dict[str, str]] = field(default_factory=list)

    def messages(self, user_text: str) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns + [{"role": "user", "content": user_text}]


class Repl:
    def __init__(self, client: ChatClient, conversation: Conversation, colour: bool,
                 params: dict[str, object], write: Callable[[str], object] = sys.stdout.write
                 ) -> None:
        self.client, self.conv, self.colour, self.params = client, conversation, colour, params
        self.write = write

    def reply(self, user_text: str) -> ReplyStats:
        """Stream one reply; Ctrl-C stops it (closing the stream stops lead too)."""
        stats = ReplyStats()
        try:
            for piece in self.client.stream(self.conv.messages(user_text), stats, **self.params):
                self._show(piece.text, piece.from_draft)
        except KeyboardInterrupt:
            self._out(f"\n{self._dim('[stopped]')}\n")
            return stats
        except ChatError:
            self.end_line(stats)  # the error goes on a line of its own
            raise
        self.conv.turns += [{"role": "user", "content": user_text},
                            {"role": "assistant", "content": "".join(stats.text)}]
        self._out("\n" + self._dim(stats.line()) + "\n")
        return stats

    def end_line(self, stats: ReplyStats) -> None:
        """End the reply's line where some of it was shown (before an error is said)."""
        if stats.text and not stats.text[-1].endswith("\n"):
            self._out("\n")

    def _show(self, text: str, from_draft: bool) -> None:
        self._out(f"{DRAFT_COLOUR}{text}{RESET}" if self.colour and from_draft else text)

    def _dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self.colour else text

    def _out(self, text: str) -> None:
        self.write(text)
        sys.stdout.flush()

    def command(self, line: str) -> bool:
        """Run a /command; False means quit."""
        name, _, arg = line.partition(" ")
        if name in ("/quit", "/exit"):
            return False
        if name == "/new":
            self.conv.turns.clear()
            self._out("(new conversation)\n")
        elif name == "/system":
            self.conv.system, self.conv.turns = arg.strip() or None, []
            self._out(f"(system prompt {'set' if arg.strip() else 'cleared'}; new conversation)\n")
        elif name == "/stats":
            self._out(self._stats() + "\n")
        elif name == "/help":
            self._out(HELP + "\n")
        else:
            self._out(f"unknown command {name}; /help lists them\n")
        return True

    def _stats(self) -> str:
        m = self.client.metrics()
        return (f"backs attached (last minute): {m.get('backs_active', 0):.0f} | acceptance: "
                f"{100 * m.get('acceptance_rate', 0):.0f}% | draft length: "
                f"{m.get('draft_len', 0):.0f} | decode: "
                f"{m.get('decode_tokens_per_second', 0):.1f} tok/s | requests: "
                f"{m.get('requests_total', 0):.0f}")


def interactive(repl: Repl) -> int:
    session = _prompt_session()
    repl._out(f"duo chat — lead at {repl.client.base}. /help for commands.\n")
    while True:
        try:
            line = session.prompt("> ").strip()
        except KeyboardInterrupt:
            continue  # Ctrl-C at the prompt clears the line
        except EOFError:
            return 0
        if not line:
            continue
        try:
            if line.startswith("/"):
                if not repl.command(line):
                    return 0
            else:
                repl.reply(line)
        except ChatError as exc:
            repl._out(f"error: {exc}\n")


def _prompt_session():  # type: ignore[no-untyped-def]
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings

    bindings = KeyBindings()

    @bindings.add("enter")
    def _(event) -> None:  # type: ignore[no-untyped-def]
        event.current_buffer.validate_and_handle()

    @bindings.add("escape", "enter")
    def _(event) -> None:  # type: ignore[no-untyped-def]
        event.current_buffer.insert_text("\n")

    return PromptSession(history=FileHistory(str(_history_path())), multiline=True,
                         key_bindings=bindings, enable_history_search=True)


def _history_path() -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    path = base / "duo" / "chat_history"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def read_piped(stream: BinaryIO) -> str:
    """What was piped in, as text; ChatError where it is not UTF-8 (the input's fault,
    said before lead is asked)."""
    data = stream.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChatError(f"standard input is not UTF-8 text (byte {data[exc.start]:#04x} at "
                        f"offset {exc.start})") from None


def piped(repl: Repl, text: str) -> int:
    """`echo question | python chat.py`: print just the reply."""
    if not text.strip():
        print("error: nothing on standard input to ask", file=sys.stderr)
        return 1
    stats = ReplyStats()
    try:
        for piece in repl.client.stream(repl.conv.messages(text.strip()), stats, **repl.params):
            repl._out(piece.text)
    except ChatError as exc:
        repl.end_line(stats)  # the error on a line of its own, the reply's line ended
        print(f"error: {exc}", file=sys.stderr)
        return 1
    repl._out("\n")
    return 0
