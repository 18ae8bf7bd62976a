"""An OpenAI reply's stream and usage: server-sent events of chat.completion.chunk (or
text_completion) objects, each choice parsed on its own, and the usage the last carries.
Beside Anthropic's (anthropicreply.py) and the Responses API's (responsereply.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from typing import Any

from lead.apis import shapes, toolreply
from lead.apis.prepare import Prepared
from lead.apis.timings import timings
from lead.apis.toolparse import Delta
from lead.decode.session import Emission, Session


async def sse(model: str, emissions: AsyncIterator[Emission], rid: str,
              shape: shapes.ReplyShape, prepared: Prepared | None = None, n: int = 1,
              usage_apart: bool = False, clock: Callable[[], float] = time.perf_counter,
              per_token: bool = False) -> AsyncIterator[str]:
    """An OpenAI reply's events: a chunk per emission, each choice's finish, the usage
    and llama-server's timings with the last (`usage_apart`: in a chunk of their own
    after it, with no choices, as OpenAI's include_usage asks), then [DONE]. `n`: the
    choices, each parsed (tool calls, reasoning) on its own; `clock`: the engine's;
    `per_token`: each token's chunk with the timings so far (llama-server's
    timings_per_token)."""
    head = shapes.envelope(f"{shape.kind}.chunk" if shape.chat else shape.kind, rid, model)
    deltas = [prepared.deltas() if prepared else toolreply.Deltas(None) for _ in range(n)]
    sessions: dict[int, Session] = {}

    def event(i: int, e: Emission | None, part: Delta | None = None,
              finish: str | None = None, opening: bool = False, **extra: Any) -> str:
        part = part or {}
        choice = shape.choice(part.get("content", ""), finish, e.logprobs if e else None,
                              delta=True, opening=opening, index=i)
        if "tool_calls" in part:
            choice["delta"]["tool_calls"] = part["tool_calls"]
        if "reasoning" in part:  # a thinking model's, as llama-server sends it
            choice["delta"]["reasoning_content"] = part["reasoning"]
        duo: dict[str, Any] = {"tokens": e.n_tokens if e else 0,
                               "accepted": e.n_from_draft if e else 0}
        if e and e.n_from_draft:
            duo["back"] = e.back  # which back drafted them (the page shows it on hover)
        payload = {**head, "choices": [choice], "duo": duo, **extra}
        return f"data: {json.dumps(payload)}\n\n"

    if shape.chat:
        for i in range(n):
            yield event(i, None, opening=True)
    started: dict[int, Session] = {}  # each choice's session, from its first emission
    async for e in emissions:
        i = e.choice
        if e.progress is not None:  # as llama-server tells it: a chunk like the opening one
            yield event(i, None, opening=True, prompt_progress=asdict(e.progress))
            continue
        if e.prompt is not None:
            started[i] = e.prompt
        if e.text or e.n_tokens:  # a token with no text yet still counts: EOS, held text
            parts = deltas[i].push(e.text)
            so_far = {"timings": timings(started[i], clock())} \
                if per_token and i in started else {}
            yield event(i, e, parts[0] if parts else None, **so_far)
            for part in parts[1:]:
                yield event(i, None, part)
        if e.session is None:
            continue
        for part in deltas[i].finish():
            yield event(i, None, part)
        sessions[i] = e.session
        last = _last(sessions, n, e.session, clock())
        finish = deltas[i].finish_reason(e.session.finish_reason)
        yield event(i, None, finish=finish, **({} if usage_apart else last))
        if usage_apart and last:
            yield f"data: {json.dumps({**head, 'choices': [], **last})}\n\n"
    assert len(sessions) == n, "each choice's last emission carries its session"
    yield "data: [DONE]\n\n"




def _last(sessions: dict[int, Session], n: int, session: Session, now: float
          ) -> dict[str, Any]:
    """What the last chunk adds once every choice has ended: the usage, and llama-server's
    timings (of the choice that ended last)."""
    if len(sessions) < n:
        return {}
    return {"usage": sessions_usage(*sessions.values()), "timings": timings(session, now)}


def sessions_usage(*sessions: Session) -> dict[str, Any]:
    """A reply's usage: its prompt once, every choice's tokens."""
    first = sessions[0]
    return shapes.usage(first.n_prompt, sum(s.n_generated for s in sessions),
                        sum(s.drafted for s in sessions), sum(s.accepted for s in sessions),
                        first.n_cached)
