"""A lead process over a scripted model, for the tool round trips a real client makes and
SmolLM2 cannot (tests/test_clients.py): `python -m tests.scripted_lead [lead's flags]`.

The model's reply is the first rule whose `when` its prompt holds: `SCRIPTED_RULES` is a
JSON list of [when, reply] (`when` compared as the fake tokenizer reads text: letters,
digits and a little punctuation; anything else reads as a space). Its template writes
Hermes calls (`<tool_call>{...}</tool_call>`), so a reply may call the client's own tool,
and the client runs it and sends its result back; a later rule, waiting for that result,
answers. Each API request's body is appended to the JSON-lines file `SCRIPTED_RECORD`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bench.fake import EOS, FakeModel
from lead.server.app import create_app
from lead.server.serve import serve
from lead.server.settings import LeadSettings
from shared.cli import parse_settings, setup_logging

HERMES_TEMPLATE = "{% for tool in tools %}<tools>{{ tool }}</tools>{% endfor %}<tool_call>"
NO_RULE = "No rule of the script matched this prompt."


class ScriptedReplies(FakeModel):
    """A fake whose reply, one token a character, is chosen by its prompt: the reply's
    tokens are ids of their own (BASE on), so where the prompt ends is plain."""

    BASE = 128

    def __init__(self, rules: Sequence[tuple[str, str]], **kw: Any) -> None:
        self.replies = [*(reply for _, reply in rules), NO_RULE]
        self.starts = np.cumsum([0, *(len(r) for r in self.replies)]).tolist()
        super().__init__(n_vocab=self.BASE + self.starts[-1], chat_template=HERMES_TEMPLATE,
                         **kw)
        self.whens = [bytes(self.tokenize(when)) for when, _ in rules]
        self._chosen: dict[tuple[int, bytes], int] = {}

    def token_bytes(self, token_id: int) -> bytes:
        if token_id < self.BASE:
            return super().token_bytes(token_id)
        i = next(i for i in range(len(self.replies)) if token_id < self.BASE + self.starts[i + 1])
        return self.replies[i][token_id - self.BASE - self.starts[i]].encode()

    def logits_for(self, context: Sequence[int]) -> np.ndarray:  # type: ignore[override]
        done = next((i for i, t in enumerate(reversed(context)) if t < self.BASE), len(context))
        rule = self._rule(context[:len(context) - done])
        logits = np.full(self.n_vocab, -50.0, dtype=np.float32)  # sampled or not: the script
        at = self.starts[rule] + done
        logits[self.BASE + at if at < self.starts[rule + 1] else EOS] = 50.0
        return logits

    def _rule(self, prompt: Sequence[int]) -> int:
        key = (len(prompt), bytes(prompt[-16:]))
        if key not in self._chosen:
            text = bytes(prompt)  # (prompt ids are under 128)
            self._chosen[key] = next((i for i, when in enumerate(self.whens) if when in text),
                                     len(self.whens))
        return self._chosen[key]


class Recorder:
    """Appends each /v1 request's path and JSON body to a file, as it comes in."""

    def __init__(self, app: ASGIApp, path: str) -> None:
        self.app, self.path = app, path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def recorded() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self._write(scope["path"], b"".join(chunks))
            return message
        await self.app(scope, recorded, send)

    def _write(self, path: str, body: bytes) -> None:
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = body.decode(errors="replace")
        with open(self.path, "a") as out:
            out.write(json.dumps({"path": path, "body": parsed}) + "\n")


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(LeadSettings, "python -m tests.scripted_lead", __doc__ or "",
                              argv)
    setup_logging(settings.log_level)
    rules = [(when, reply) for when, reply in json.loads(os.environ["SCRIPTED_RULES"])]
    app = create_app(settings, ScriptedReplies(rules, n_ctx=settings.slot_ctx))
    if os.environ.get("SCRIPTED_RECORD"):
        app.add_middleware(Recorder, path=os.environ["SCRIPTED_RECORD"])
    serve(app, settings.host, settings.port, settings.log_level)


if __name__ == "__main__":
    main()
