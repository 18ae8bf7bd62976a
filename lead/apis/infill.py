"""llama.cpp's server's fill in the middle (POST /infill), as the editor plugins llama.vim and
llama.vscode send it.

A request is the text before the cursor (`input_prefix`), the cursor's line typed so far
(`prompt`), the text after it (`input_suffix`) and chunks of other files the plugin keeps in a
ring buffer (`input_extra`). Its prompt is laid out as llama.cpp's server lays it out
(`format_prompt_infill`): the chunks first, as files of one repository where the model has
the markers, then the prefix and the line, the suffix, the middle marker. It rides the same
engine as a completion (drafts verified, a place in line first), ended also by the plugins'
own limits (`n_indent`, `t_max_predict_ms`); the reply is llama.cpp's, with its `timings`,
`tokens_cached` and `response_fields`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from lead.apis import fields, llamasampling, shapes
from lead.apis.openairoutes import Generation, reply
from lead.apis.prepare import Defaults, Prepared, gen_request
from lead.apis.renames import validated
from lead.apis.streaming import StreamedReply
from lead.apis.timings import timings
from lead.decode.engine import Engine
from lead.decode.session import Emission, Session
from lead.decode.textstream import TextStream
from shared.logprobs import MAX_TOP_LOGPROBS
from shared.model import Model
from shared.modelthread import Threads

Clock = Callable[[], float]

# The completion request's fields /infill names otherwise (its prompt: the prefix and the
# line, as a model without fill-in-the-middle tokens continues them)
INFILL_NAMES = {"max_tokens": "n_predict", "prompt": "input_prefix"}
# Sampling fields passed on as the completion request has them (it checks them)
SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty",
            "repeat_last_n", "frequency_penalty", "presence_penalty", *llamasampling.FIELDS)
# llama.cpp's sampler names, in its default order: `samplers` orders them, a hint (lead
# applies those it has in its own order; "infill", which favours ending, is not applied)
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                    "temperature")
SAMPLERS = frozenset({*DEFAULT_SAMPLERS, "infill"})
# What a sampler left out of `samplers` leaves off (llama.cpp's server runs only those named)
UNLISTED = {"top_k": {"top_k": 0}, "top_p": {"top_p": 1.0}, "min_p": {"min_p": 0.0},
            "penalties": {"repeat_penalty": 1.0, "frequency_penalty": 0.0,
                          "presence_penalty": 0.0},
            "dry": {"dry_multiplier": 0.0}, "typ_p": {"typical_p": 1.0},
            "xtc": {"xtc_probability": 0.0}}
# llama.cpp's text around the chunks (format_prompt_infill): the project's name and the
# current file's after the repository markers, a chunk's separator where there are none
REPO_NAME, LAST_FILE = "myproject\n", "filename\n"
SNIPPET = "\n\n--- snippet ---\n\n"


class ExtraChunk(BaseModel):
    """Other files' text, from the plugin's ring buffer."""

    model_config = ConfigDict(extra="ignore")  # llama.cpp's server reads no other key
    text: shapes.Text
    filename: shapes.Text = "tmp"  # llama.cpp's name for a chunk that gives none
    time: Any = None  # when the plugin took it (llama.vim: reltime(); llama.vscode: ms)


class InfillRequest(llamasampling.LlamaSamplersAsGiven):
    """llama.cpp's server's /infill: the text around the cursor, other files' chunks, and
    the plugins' limits."""

    model_config = ConfigDict(extra="allow")  # what else: lead/apis/fields.py
    input_prefix: shapes.Text = ""
    input_suffix: shapes.Text = ""
    input_extra: list[ExtraChunk] | None = None
    prompt: shapes.Text = ""  # the cursor's line typed so far, after the prefix
    n_predict: int | None = Field(None, ge=-1)  # -1: lead's default; 0: evaluate only
    n_indent: int = 0  # > 0: the reply ends at a line indented less
    t_max_predict_ms: float = 0  # > 0: the reply ends at a new line once this has passed
    t_max_prompt_ms: float | None = None  # not enforced: llama.cpp's server does not either
    samplers: list[str] | None = None  # the order of llama.cpp's samplers: a hint
    n_cmpl: int = Field(1, ge=1)  # completions asked for: greedy ones are alike, one is served
    id_slot: int | None = None  # the slot it runs in (-1: any; else where its prefix is)
    cache_prompt: bool = True  # lead always caches
    response_fields: list[str] | None = None  # the reply holds only these (a/b: b in a)
    model: str | None = None  # lead serves one model
    stream: bool = False
    return_tokens: bool = False  # the reply's token ids beside its text
    n_probs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)  # each token's and the n likeliest's
    post_sampling_probs: bool = False  # those of the distribution sampled, not logprobs
    temperature: Any = None  # these: as the completion request takes them
    top_k: Any = None
    top_p: Any = None
    min_p: Any = None
    seed: Any = None
    stop: Any = None
    repeat_penalty: Any = None
    repeat_last_n: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None


async def native_reply(engine: Engine, workers: Threads, request: Request,
                       shape: InfillShape, prepare: Callable[[], Prepared]) -> Response:
    """A reply in llama-server's native shape (/infill's, /completion's), whole or streamed."""
    def streamed(gen: Generation, _: Prepared, release: Callable[[], None]) -> Response:
        return StreamedReply(gen, shape.events, release)
    return await reply(engine, workers, request, shape.body.stream, prepare,
                       lambda emissions, _: JSONResponse(shape.whole(emissions)), streamed)


# --- the request ---
def infill_request(body: InfillRequest) -> shapes.CompletionRequest:
    """The completion /infill is decoded as (its prompt is infill_ids'), or a 400 naming the
    field that would change the completion unseen."""
    try:
        fields.judge(fields.INFILL, body.model_extra or {}, "/infill")
    except fields.Unserved as exc:
        raise shapes.FieldRefused(exc.param, f"{exc.param}: {exc.rule.why}") from None
    for i, name in enumerate(body.samplers or []):
        if name not in SAMPLERS:
            known = ", ".join(sorted(SAMPLERS))
            raise shapes.FieldRefused(f"samplers[{i}]", f"samplers[{i}]: {name!r} is no "
                                      f"sampler llama.cpp's server knows ({known})")
    completion = validated(shapes.CompletionRequest.model_validate, completion_fields(body),
                           INFILL_NAMES)
    if body.n_cmpl > 1 and (completion.temperature or 0.0) > 0.0:
        raise shapes.FieldRefused("n_cmpl", "n_cmpl: one completion is served; sampled ones "
                                            "would differ (greedy ones are alike: ask without "
                                            "a temperature)")
    return completion


def completion_fields(body: InfillRequest) -> dict[str, Any]:
    fields = {name: getattr(body, name) for name in SAMPLING if getattr(body, name) is not None}
    for sampler, off in UNLISTED.items():
        if body.samplers is not None and sampler not in body.samplers:
            fields.update(off)
    wanted = body.n_predict if body.n_predict is not None and body.n_predict > 0 else None
    return {**fields, "prompt": body.input_prefix + body.prompt, "max_tokens": wanted,
            "stream": body.stream, "id_slot": body.id_slot}


def prepare_infill(model: Model, defaults: Defaults, n_batch: int, clock: Clock,
                   body: InfillRequest, completion: shapes.CompletionRequest) -> Prepared:
    """The generation: llama.cpp's prompt, the completion's checks and sampling, the
    plugins' limits on its text; `n_predict` 0 evaluates the prompt and says nothing.
    Chunks are kept as llama.cpp's server keeps them, up to the context less a batch and
    twice the default reply (its own n_predict): a warm-up caches what the next request
    reads."""
    n_extra = max(0, model.n_ctx - n_batch - 2 * defaults.max_tokens)
    req = gen_request(model, defaults, completion,
                      infill_ids(model, body, n_batch, n_extra), None)
    text = partial(InfillText, req.stop, body.n_indent, body.t_max_predict_ms, clock)
    return Prepared(replace(req, max_tokens=0 if body.n_predict == 0 else req.max_tokens,
                            text=text, top_logprobs=body.n_probs or None,
                            post_sampling=body.post_sampling_probs))


def infill_ids(model: Model, body: InfillRequest, n_batch: int, n_extra: int) -> list[int]:
    """llama.cpp's server's infill prompt: the chunks (their last `n_extra` tokens), [BOS],
    FIM_PRE, the prefix's end (3/4 of a batch) and the line typed, FIM_SUF, the suffix's
    start (what the line leaves of a quarter batch), FIM_MID. A model without the markers
    continues the prefix and the line, where nothing follows them."""
    if model.fim_tokens is None:
        return plain_ids(model, body)
    pre, suf, mid = model.fim_tokens
    prefix, suffix, typed = (text_ids(model, t)
                             for t in (body.input_prefix, body.input_suffix, body.prompt))
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(typed))))
    extra = extra_ids(model, body.input_extra or [])
    kept = extra[len(extra) - min(n_extra, len(extra)):]
    return [*kept, *model.tokenize("", add_bos=True), pre, *prefix[len(prefix) - n_prefix:],
            *typed, suf, *suffix[:n_suffix], mid]


def plain_ids(model: Model, body: InfillRequest) -> list[int]:
    for name, value in (("input_suffix", body.input_suffix), ("input_extra", body.input_extra)):
        if value:
            raise shapes.FieldRefused(name, f"{name}: {model.name} has no fill-in-the-middle "
                                            "tokens (Qwen2.5-Coder, the default target, has)")
    return model.tokenize(body.input_prefix + body.prompt, special=False, add_bos=True)


def extra_ids(model: Model, chunks: Sequence[ExtraChunk]) -> list[int]:
    """The chunks as files of one repository ([FIM_REP]project, [FIM_SEP]name and text each,
    [FIM_SEP] the current file's name), or as snippets where the model has no markers."""
    rep, sep = model.fim_repo_tokens
    ids = [rep, *text_ids(model, REPO_NAME)] if rep is not None else []
    for chunk in chunks:
        ids += [sep, *text_ids(model, chunk.filename + "\n")] if sep is not None else \
            text_ids(model, SNIPPET)
        ids += text_ids(model, chunk.text)
    return [*ids, sep, *text_ids(model, LAST_FILE)] if sep is not None else ids


def text_ids(model: Model, text: str) -> list[int]:
    return model.tokenize(text, special=False, add_bos=False)


# --- the plugins' limits ---
class InfillText(TextStream):
    """The reply's text, ended as llama.cpp's server ends an infill: at a line (after the
    first) indented by less than `n_indent`, cut after that indentation; at a new line once
    `t_max_ms` have passed since the first token (0: neither)."""

    def __init__(self, stop: Sequence[str], n_indent: int, t_max_ms: float, clock: Clock
                 ) -> None:
        super().__init__(stop)
        self.n_indent, self.t_max_ms, self.clock = n_indent, t_max_ms, clock
        self.reply = ""
        self._since: float | None = None

    def push(self, data: bytes) -> str:
        out = super().push(data)
        if self.stopped:
            return out
        now = self.clock()
        self._since = now if self._since is None else self._since
        start = len(self.reply)
        self.reply += out
        cut = indent_cut(self.reply, self.n_indent, start)
        if cut is not None:
            self.reply, self.stopped = self.reply[:cut], True
            return out[:cut - start]
        if "\n" in out and 0 < self.t_max_ms < (now - self._since) * 1000:
            self.stopped = True
        return out


def indent_cut(text: str, n_indent: int, start: int = 0) -> int | None:
    """Where a reply whose lines must be indented by `n_indent` ends: after the indentation
    of the first line past the first with anything after its indentation (its new line
    counts: an empty line ends it) and fewer spaces or tabs; None while there is none.
    Lines whose indentation ended before `start` were judged already."""
    first = text.find("\n") + 1
    if n_indent <= 0 or first == 0:
        return None
    line = max(first, text.rfind("\n", 0, start) + 1)
    while True:
        rest = text[line:]
        indent = len(rest) - len(rest.lstrip(" \t"))
        if indent < len(rest) and indent < n_indent:
            return line + indent
        end = text.find("\n", line)
        if end < 0:
            return None
        line = end + 1


# --- the reply ---
class InfillShape:
    """One reply in llama.cpp's server's shape: the whole object, or a stream of
    `{"content", "stop": false}` objects and the whole one (its content streamed) last."""

    def __init__(self, model: Model, clock: Clock, body: InfillRequest, max_tokens: int) -> None:
        self.model, self.clock, self.body, self.max_tokens = model, clock, body, max_tokens

    def whole(self, emissions: list[Emission]) -> dict[str, Any]:
        session = emissions[-1].session
        assert session is not None, "the last emission carries the session"
        return self.last(session, "".join(e.text for e in emissions))

    async def events(self, emissions: AsyncIterator[Emission]) -> AsyncIterator[str]:
        last, content = None, ""
        async for e in emissions:
            if e.text:
                content += e.text
                yield sse({"content": e.text, "stop": False})
            last = e
        session = last.session if last is not None else None
        assert session is not None, "the last emission carries the session"
        yield sse(self.last(session, content, streamed=True))

    def last(self, session: Session, content: str, streamed: bool = False) -> dict[str, Any]:
        """The reply's last object (llama.cpp's fields, then lead's), as `response_fields`
        asks; a streamed reply's content went before it."""
        fields = {"index": 0, "content": "" if streamed else content, "tokens": [],
                  "stop": True, "model": self.model.name,
                  "tokens_predicted": session.n_generated, "tokens_evaluated": session.n_prompt,
                  "generation_settings": self.settings(session),
                  "prompt": self.prompt_text(session) if self.wants("prompt") else "",
                  "has_new_line": "\n" in content,
                  "truncated": len(session.tokens) >= self.model.n_ctx,
                  "stop_type": self.stop_type(session),
                  "stopping_word": session.stop_sequence or "",
                  "tokens_cached": session.n_prompt + max(session.n_generated - 1, 0),
                  "timings": timings(session, self.clock()),
                  "drafted_tokens": session.drafted, "accepted_tokens": session.accepted}
        return picked(fields, self.body.response_fields)

    def wants(self, field: str) -> bool:
        paths = self.body.response_fields
        return not paths or any(p.split("/")[0] == field for p in paths)

    def stop_type(self, session: Session) -> str:
        """llama.cpp's: eos, word (a stop string), limit (n_predict, n_indent, time), none."""
        if session.stop_sequence is not None:
            return "word"
        ended_eos = session.n_generated > 0 and session.tokens[-1] in self.model.eos_token_ids
        if session.finish_reason == "stop":
            return "eos" if ended_eos else "limit"
        return "limit" if session.finish_reason == "length" else "none"

    def settings(self, session: Session) -> dict[str, Any]:
        p, body = session.params, self.body
        n_predict = body.n_predict if body.n_predict is not None and body.n_predict >= 0 \
            else self.max_tokens
        return {"n_ctx": self.model.n_ctx, "n_predict": n_predict, "temperature": p.temperature,
                "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p, "seed": p.seed,
                **{name: getattr(p, name) for name in llamasampling.FIELDS},
                "stream": body.stream, "n_indent": body.n_indent,
                "t_max_predict_ms": body.t_max_predict_ms,
                "samplers": body.samplers if body.samplers is not None else
                list(DEFAULT_SAMPLERS)}

    def prompt_text(self, session: Session) -> str:
        data = b"".join(self.model.token_bytes(t) for t in session.tokens[:session.n_prompt])
        return data.decode("utf-8", "replace")


def picked(fields: dict[str, Any], paths: list[str] | None) -> dict[str, Any]:
    """Only the fields `paths` name, each under its path as written ("timings/prompt_n" at
    the top), as llama.cpp's server answers `response_fields`; a path that names nothing
    is left out. None or none at all: every field."""
    if not paths:
        return fields
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = fields
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
