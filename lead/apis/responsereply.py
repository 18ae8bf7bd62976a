"""A reply of OpenAI's Responses API: a response object (whole) or its stream of events,
each item opened, filled and closed in order (the request side: lead/apis/responses.py)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from typing import Any

from lead.apis import shapes
from lead.apis.prepare import Prepared
from lead.apis.responses import LOGPROBS, ResponsesRequest, Tools, new_id
from lead.apis.timings import timings
from lead.decode.session import Emission, Session


class ResponseShape:
    """One reply as a response object (whole) or events (streamed)."""

    def __init__(self, body: ResponsesRequest, model: str, rid: str,
                 token_bytes: shapes.TokenBytes, tools: Tools | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """`clock`: the engine's, which stamps its sessions (llama-server's timings)."""
        self.body, self.model, self.rid = body, model, rid
        self.token_bytes, self.tools, self.clock = token_bytes, tools or Tools(), clock
        self.created = int(time.time())

    def response(self, status: str, output: list[dict[str, Any]],
                 session: Session | None = None) -> dict[str, Any]:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.rid, "object": "response", "created_at": self.created,
                "status": status, "error": None, "incomplete_details": incomplete,
                "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
                "model": self.model, "output": output, "parallel_tool_calls": True,
                "temperature": body.temperature, "top_p": body.top_p,
                "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
                "text": body.text or {"format": {"type": "text"}}, "truncation": "disabled",
                "metadata": (body.model_extra or {}).get("metadata") or {},
                "usage": responses_usage(session) if session is not None else None}

    def whole(self, emissions: list[Emission], prepared: Prepared) -> dict[str, Any]:
        session = emissions[-1].session
        assert session is not None, "the last emission carries the session"
        parts = prepared.parts("".join(e.text for e in emissions))
        entries = [lp for e in emissions for lp in e.logprobs]
        output = [reasoning_item(new_id("rs"), parts.reasoning)] if parts.reasoning else []
        output += [self.message(new_id("msg"), parts.content, self._logprobs(entries))] \
            if parts.content else []
        output += [self.tools.item(call, "completed") for call in parts.calls]
        return self.response(status_of(session), output, session)

    def message(self, item_id: str, text: str, logprobs: list[Any] | None = None,
                status: str = "completed") -> dict[str, Any]:
        return {"type": "message", "id": item_id, "status": status, "role": "assistant",
                "content": [] if text is None else [self.part(text, logprobs)]}

    @staticmethod
    def part(text: str, logprobs: list[Any] | None = None) -> dict[str, Any]:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        if logprobs is not None:
            part["logprobs"] = logprobs
        return part

    def _logprobs(self, entries: list[Any]) -> list[Any] | None:
        if self.body.top_logprobs is None and LOGPROBS not in (self.body.include or []):
            return None
        return shapes.chat_logprobs(entries, self.token_bytes)["content"]

    async def events(self, emissions: AsyncIterator[Emission], prepared: Prepared
                     ) -> AsyncIterator[str]:
        """The stream: created, each item opened, its deltas, closed, then completed."""
        writer = EventWriter(self)
        for text in writer.opening():
            yield text
        deltas, last, started = prepared.deltas(), None, None
        async for e in emissions:
            started = e.prompt or started
            if e.progress is not None:  # llama-server's: in_progress with how far
                yield writer.event("response.in_progress", response=writer.started,
                                   prompt_progress=asdict(e.progress))
                continue
            so_far = {"timings": timings(started, self.clock())} \
                if self.body.timings_per_token and started is not None else {}
            for part in deltas.push(e.text):
                for text in writer.delta(part, e.logprobs if "content" in part else [],
                                         so_far):
                    yield text
            last = e
        for part in deltas.finish():
            for text in writer.delta(part, []):
                yield text
        session = last.session if last is not None else None
        assert session is not None, "the last emission carries the session"
        for text in writer.closing(session, timings(session, self.clock())):
            yield text


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """A thinking model's reasoning, as its text (nothing is encrypted here)."""
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def status_of(session: Session) -> str:
    return "incomplete" if session.finish_reason == "length" else "completed"


def responses_usage(s: Session) -> dict[str, Any]:
    return {"input_tokens": s.n_prompt, "output_tokens": s.n_generated,
            "total_tokens": s.n_prompt + s.n_generated,
            "input_tokens_details": {"cached_tokens": s.n_cached},
            "output_tokens_details": {"reasoning_tokens": 0},
            "drafted_tokens": s.drafted, "accepted_tokens": s.accepted}


class EventWriter:
    """The Responses stream's events, in order, each with its sequence number."""

    def __init__(self, shape: ResponseShape) -> None:
        self.shape, self.seq = shape, 0
        self.output: list[dict[str, Any]] = []  # items closed so far
        self.open: dict[str, Any] | None = None  # the message item being written
        self.text = ""
        self.logprobs: list[Any] = []
        self.thought: dict[str, Any] | None = None  # the reasoning item being written
        self.started: dict[str, Any] = {}  # the response as it began

    def event(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        data = {"type": kind, "sequence_number": self.seq, **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def opening(self) -> list[str]:
        self.started = self.shape.response("in_progress", [])
        return [self.event("response.created", response=self.started),
                self.event("response.in_progress", response=self.started)]

    def delta(self, part: dict[str, Any], logprobs: list[Any],
              extra: dict[str, Any] | None = None) -> list[str]:
        """A part's events; `extra`: more fields for a text delta (llama-server's timings)."""
        if "reasoning" in part:
            return self._reason(part["reasoning"])
        out = self._close_reasoning()
        if "content" in part:
            return out + self._text(part["content"], logprobs, extra or {})
        out += self._close_message()
        for call in part.get("tool_calls", []):
            out += self._call(call)
        return out

    def _reason(self, text: str) -> list[str]:
        out: list[str] = []
        if self.thought is None:
            out += self._close_message()
            self.thought = reasoning_item(new_id("rs"), "", "in_progress")
            out.append(self.event("response.output_item.added", output_index=len(self.output),
                                  item=self.thought))
        self.thought["content"] = [{"type": "reasoning_text", "text": (
            self.thought["content"][0]["text"] if self.thought["content"] else "") + text}]
        out.append(self.event("response.reasoning_text.delta", item_id=self.thought["id"],
                              output_index=len(self.output), content_index=0, delta=text))
        return out

    def _close_reasoning(self) -> list[str]:
        if self.thought is None:
            return []
        done, index = {**self.thought, "status": "completed"}, len(self.output)
        self.output.append(done)
        self.thought = None
        text = done["content"][0]["text"] if done["content"] else ""
        return [self.event("response.reasoning_text.done", item_id=done["id"],
                           output_index=index, content_index=0, text=text),
                self.event("response.output_item.done", output_index=index, item=done)]

    def _text(self, text: str, logprobs: list[Any], extra: dict[str, Any]) -> list[str]:
        out = [] if self.open is not None else self._open_message()
        self.text += text
        entries = self.shape._logprobs(logprobs) or []
        self.logprobs += entries
        out.append(self.event("response.output_text.delta", item_id=self.open["id"],
                              output_index=len(self.output), content_index=0, delta=text,
                              logprobs=entries, **extra))
        return out

    def _open_message(self) -> list[str]:
        self.open = self.shape.message(new_id("msg"), None, status="in_progress")
        self.text, self.logprobs = "", []
        index = len(self.output)
        return [self.event("response.output_item.added", output_index=index, item=self.open),
                self.event("response.content_part.added", item_id=self.open["id"],
                           output_index=index, content_index=0, part=self.shape.part(""))]

    def _close_message(self) -> list[str]:
        if self.open is None:
            return []
        item_id, index = self.open["id"], len(self.output)
        logprobs = self.logprobs if self.shape._logprobs([]) is not None else None
        part = self.shape.part(self.text, logprobs)
        done = {**self.open, "status": "completed", "content": [part]}
        self.output.append(done)
        self.open = None
        return [self.event("response.output_text.done", item_id=item_id, output_index=index,
                           content_index=0, text=self.text, logprobs=logprobs or []),
                self.event("response.content_part.done", item_id=item_id, output_index=index,
                           content_index=0, part=part),
                self.event("response.output_item.done", output_index=index, item=done)]

    def _call(self, call: dict[str, Any]) -> list[str]:
        index, item = len(self.output), self.shape.tools.item(call, "completed")
        key, events = ("input", "response.custom_tool_call_input") \
            if item["type"] == "custom_tool_call" else \
            ("arguments", "response.function_call_arguments")
        opened = {**item, key: "", "status": "in_progress"}
        self.output.append(item)
        return [self.event("response.output_item.added", output_index=index, item=opened),
                self.event(f"{events}.delta", item_id=item["id"], output_index=index,
                           delta=item[key]),
                self.event(f"{events}.done", item_id=item["id"], output_index=index,
                           **{key: item[key]}),
                self.event("response.output_item.done", output_index=index, item=item)]

    def closing(self, session: Session, timed: dict[str, Any]) -> list[str]:
        """The open items closed, then completed (or incomplete), with llama-server's
        `timings` beside the response."""
        out = self._close_reasoning() + self._close_message()
        status = status_of(session)
        done = self.shape.response(status, self.output, session)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*out, self.event(kind, response=done, timings=timed)]
