"""A reply of Anthropic's Messages API: a message (whole) or its stream of events, content
blocks opened, filled and closed in order (the request side: lead/apis/anthropic.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from lead.apis.prepare import Prepared
from lead.apis.streaming import chain
from lead.decode.session import Emission, Session


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def stop_reason(session: Session, called: bool) -> str:
    if called:
        return "tool_use"
    if session.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if session.stop_sequence is not None else "end_turn"


def anthropic_usage(s: Session) -> dict[str, int]:
    """Anthropic's convention: `input_tokens` are those not read from the cache (clients
    add the three to know the prompt's size)."""
    return {**prompt_usage(s), "output_tokens": s.n_generated,
            "drafted_tokens": s.drafted, "accepted_tokens": s.accepted}


def prompt_usage(s: Session) -> dict[str, int]:
    return {"input_tokens": s.n_prompt - s.n_cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": s.n_cached}


def tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": new_id("toolu"), "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"] or "{}")}


class MessageShape:
    def __init__(self, model: str, mid: str) -> None:
        self.model, self.mid = model, mid

    def message(self, content: list[dict[str, Any]], session: Session | None,
                called: bool = False) -> dict[str, Any]:
        return {"id": self.mid, "type": "message", "role": "assistant", "model": self.model,
                "content": content,
                "stop_reason": stop_reason(session, called) if session else None,
                "stop_sequence": session.stop_sequence if session else None,
                "usage": anthropic_usage(session) if session else {"input_tokens": 0,
                                                         "output_tokens": 0}}

    def whole(self, emissions: list[Emission], prepared: Prepared) -> dict[str, Any]:
        session = emissions[-1].session
        assert session is not None, "the last emission carries the session"
        parts = prepared.parts("".join(e.text for e in emissions))
        blocks = [thinking_block(parts.reasoning)] if parts.reasoning else []
        blocks += [{"type": "text", "text": parts.content}] if parts.content else []
        blocks += [tool_use(call) for call in parts.calls]
        return self.message(blocks, session, bool(parts.calls))

    async def events(self, emissions: AsyncIterator[Emission], prepared: Prepared
                     ) -> AsyncIterator[str]:
        """message_start (its prompt's usage: the first emission's), each block's start,
        deltas and stop, message_delta, message_stop."""
        writer = BlockWriter()
        first = await anext(aiter(emissions))
        prompt = first.prompt or first.session
        assert prompt is not None, "a generation's first emission carries its session"
        started = {**self.message([], None), "usage": {**prompt_usage(prompt),
                                                        "output_tokens": 0}}
        yield writer.event("message_start", message=started)
        yield writer.event("ping")
        deltas, last, called = prepared.deltas(), None, False
        async for e in chain(first, emissions):
            for part in deltas.push(e.text):
                called = called or "tool_calls" in part
                for text in writer.delta(part):
                    yield text
            last = e
        for part in deltas.finish():
            called = called or "tool_calls" in part
            for text in writer.delta(part):
                yield text
        session = last.session if last is not None else None
        assert session is not None, "the last emission carries the session"
        for text in writer.closing(session, called):
            yield text


def thinking_block(text: str) -> dict[str, Any]:
    """A thinking model's reasoning (unsigned: lead skips thinking blocks sent back)."""
    return {"type": "thinking", "thinking": text, "signature": ""}


# A streamed part's block: its kind, the block that opens it, its delta's type and key
BLOCKS = {"content": ("text", {"type": "text", "text": ""}, "text_delta", "text"),
          "reasoning": ("thinking", thinking_block(""), "thinking_delta", "thinking")}


class BlockWriter:
    """The Messages stream's events: content blocks opened, filled and closed in order."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # the kind of the block being filled (text, thinking)

    @staticmethod
    def event(kind: str, **fields: Any) -> str:
        data = {"type": kind, **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def delta(self, part: dict[str, Any]) -> list[str]:
        key = next((k for k in BLOCKS if k in part), None)
        if key is not None:
            kind, block, delta_type, field = BLOCKS[key]
            out = [] if self.open == kind else self._close() + self._open(block)
            self.open = kind
            return out + [self.event("content_block_delta", index=self.index,
                                     delta={"type": delta_type, field: part[key]})]
        out = self._close()
        for call in part.get("tool_calls", []):
            block = tool_use(call)
            out += self._open({**block, "input": {}})
            out.append(self.event("content_block_delta", index=self.index, delta={
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])}))
            out += self._close(force=True)
        return out

    def _open(self, block: dict[str, Any]) -> list[str]:
        self.index += 1
        return [self.event("content_block_start", index=self.index, content_block=block)]

    def _close(self, force: bool = False) -> list[str]:
        if not (self.open or force):
            return []
        self.open = None
        return [self.event("content_block_stop", index=self.index)]

    def closing(self, session: Session, called: bool) -> list[str]:
        delta = {"stop_reason": stop_reason(session, called),
                 "stop_sequence": session.stop_sequence}
        used = anthropic_usage(session)
        return [*self._close(), self.event("message_delta", delta=delta, usage=used),
                self.event("message_stop")]
