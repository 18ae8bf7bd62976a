"""python chat.py [--lead HOST:PORT] ...: talk to a duo lead."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable

from chat.client import ChatClient, ChatError
from chat.repl import Conversation, Repl, interactive, piped, read_piped
from shared.cli import check_api_key
from shared.wire.httpclient import check_lead


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python chat.py", description="Chat with a duo lead; "
                                "tokens from accepted drafts are shown in colour.")
    p.add_argument("--lead", default=os.environ.get("DUO_LEAD", "127.0.0.1:5555"),
                   help="lead's address, host[:port] (port 5555 where none is given) or "
                   "http(s)://host:port (default: %(default)s) [env DUO_LEAD]")
    p.add_argument("--api-key", default=os.environ.get("DUO_API_KEY"),
                   help="lead's API key [env DUO_API_KEY]")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--max-tokens", type=int, help="most tokens per reply (default: lead's)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: greedy)")
    p.add_argument("--no-color", action="store_true", help="no colours (also: NO_COLOR=1)")
    args = p.parse_args(argv)
    _check(p, "--lead (or DUO_LEAD)", check_lead, args.lead)
    _check(p, "--api-key (or DUO_API_KEY)", check_api_key, args.api_key)
    _check(p, "--system", _utf8, args.system)
    if args.max_tokens is not None and args.max_tokens < 1:
        p.error("--max-tokens must be at least 1")
    if args.temperature is not None and not 0 <= args.temperature <= 2:
        p.error("--temperature must be between 0 and 2")
    return args


def _check(parser: argparse.ArgumentParser, flag: str, check: Callable[[str], object],
           value: str | None) -> None:
    """A value no request could carry or send: a one-line usage error, before any."""
    try:
        if value is not None:
            check(value)
    except ValueError as exc:
        parser.error(f"{flag}: {exc}")


def _utf8(text: str) -> str:
    """Text as it was given, where it is UTF-8 (a non-UTF-8 argument comes with surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not UTF-8 text") from None
    return text


def _piped(repl: Repl) -> int:
    try:
        text = read_piped(sys.stdin.buffer)
    except ChatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return piped(repl, text)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    interactive_mode = sys.stdin.isatty()
    if interactive_mode:
        # Ctrl-C stops a reply. A process started in the background by a script inherits
        # SIGINT ignored, and Python then installs no handler: take it back explicitly.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    colour = (not args.no_color and not os.environ.get("NO_COLOR") and interactive_mode
              and sys.stdout.isatty())
    client = ChatClient(args.lead, args.api_key)
    params = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    repl = Repl(client, Conversation(system=args.system), colour, params)
    try:
        code = interactive(repl) if interactive_mode else _piped(repl)
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
        code = 141  # 128 + SIGPIPE, as a shell reports it
    finally:
        client.close()
    raise SystemExit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
