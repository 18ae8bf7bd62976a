"""OpenAI-compatible request and response shapes (the subset duo serves).

Every request field is honoured (declared below), harmless by definition (HARMLESS,
with the values it may take), or refused with a 400 that names it (`check_served`).
"""

from __future__ import annotations

import codecs
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from fastapi import HTTPException
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from shared.logprobs import MAX_TOP_LOGPROBS, TokenLogprob
from shared.protocol import LogitBias, OpenAIPenalty, RepeatLastN, RepeatPenalty, SamplingParams

TokenBytes = Callable[[int], bytes]


def _encodable(text: str) -> str:
    # JSON admits a lone surrogate ("\ud800"); no tokenizer takes one.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode: {exc.reason} at index {exc.start}") \
            from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]


class ContentPart(BaseModel):
    type: str  # only "text" is served (check_served)
    text: Text = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # what else a message holds: check_served
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[ContentPart] | None = ""
    name: Text | None = None  # passed to the chat template, which may use it
    tool_calls: list[Any] | None = None  # an assistant's calls (checked in lead/apis/tools.py)
    tool_call_id: str | None = None  # a tool result's call

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        # OpenAI's newer name for system; many templates reject roles they do not know.
        role = "system" if self.role == "developer" else self.role
        extra = {k: v for k, v in (("name", self.name), ("tool_calls", self.tool_calls),
                                   ("tool_call_id", self.tool_call_id)) if v}
        return {"role": role, "content": self.text(), **extra}


class JsonSchemaFormat(BaseModel):
    """OpenAI's response_format.json_schema. The schema is always enforced; `strict`:
    false lets through keywords the grammar cannot enforce (ignored), else they are a 400."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field("", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @property
    def structured(self) -> bool:
        return self.type != "text"


class CommonRequest(BaseModel):
    # Fields not declared here are kept in model_extra for check_served to judge.
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int | None = None
    stop: Text | list[Text] | None = None
    stream: bool = False
    frequency_penalty: OpenAIPenalty | None = None
    presence_penalty: OpenAIPenalty | None = None
    repeat_penalty: RepeatPenalty = 1.0
    repeat_last_n: RepeatLastN = 64
    logit_bias: LogitBias | None = None
    response_format: ResponseFormat | None = None
    grammar: str | None = None  # GBNF, as llama.cpp's server takes it; "" is none

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop strings")
        return v

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, default_temperature: float) -> SamplingParams:
        temperature = default_temperature if self.temperature is None else self.temperature
        return SamplingParams(temperature=temperature, top_k=self.top_k, top_p=self.top_p,
                              min_p=self.min_p, seed=self.seed,
                              frequency_penalty=self.frequency_penalty or 0.0,
                              presence_penalty=self.presence_penalty or 0.0,
                              repeat_penalty=self.repeat_penalty,
                              repeat_last_n=self.repeat_last_n,
                              logit_bias=self.logit_bias or {})

    def wanted_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def top_logprobs_wanted(self) -> int | None:
        """None: no logprobs; n: each token's logprob and the n likeliest."""
        return None


class ChatRequest(CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Any = None  # checked in lead/apis/tools.py, which names the field at fault
    tool_choice: Any = None

    def top_logprobs_wanted(self) -> int | None:
        if self.top_logprobs and not self.logprobs:  # 0 alone asks for nothing: harmless
            raise FieldRefused("top_logprobs", "top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(CommonRequest):
    prompt: Text
    suffix: Text | None = None  # text after the insertion: fill in the middle (FIM)
    logprobs: int | None = Field(None, ge=0, le=5)

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs


class FieldRefused(HTTPException):
    """A 400 naming the request field (`param`, as OpenAI's errors do)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(400, message)
        self.param = param


def _any(_: Any) -> bool:
    return True


# Fields that change nothing here by definition, with the values each may take.
HARMLESS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "user": (_any, "any"),
    "metadata": (_any, "any"),
    "store": (_any, "any"),
    "service_tier": (_any, "any"),
    "stream_options": (_any, "any: usage always comes in the last chunk"),
    "parallel_tool_calls": (_any, "any: a reply may hold several calls"),
    "n": (lambda v: v == 1, "1"),
    "best_of": (lambda v: v == 1, "1"),
    "echo": (lambda v: v is False, "false"),
    "modalities": (lambda v: v == ["text"], '["text"]'),
}

# Why fields that clients send are refused (any other unknown field is refused too).
UNSERVED: dict[str, str] = {
    "n": "one choice per request is served (n: 1)",
    "best_of": "one choice per request is served (best_of: 1)",
    "echo": "echoing the prompt is not served",
    "tools": "tools are served by /v1/chat/completions",
    "tool_choice": "tools are served by /v1/chat/completions",
    "functions": "function calling is not served",
    "function_call": "function calling is not served",
    "json_schema": 'give it as response_format: {"type": "json_schema", "json_schema": '
                   '{"name": ..., "schema": ...}}',
    "audio": "audio is not served",
    "modalities": "only text is served",
    "prediction": "predicted outputs are not served",
}


def check_served(body: CommonRequest) -> None:
    """Raise FieldRefused for the first field lead would otherwise have to ignore. A
    field set to null counts as absent: many clients send their unset options so."""
    for name, value in (body.model_extra or {}).items():
        _check_field(name, value)
    for i, message in enumerate(getattr(body, "messages", [])):
        for name, value in (message.model_extra or {}).items():
            if value not in (None, []):  # clients echo a reply back with these empty
                raise _refusal(f"messages[{i}].{name}", name)
        parts = message.content if isinstance(message.content, list) else []
        for j, part in enumerate(parts):
            if part.type != "text":
                where = f"messages[{i}].content[{j}].type"
                raise FieldRefused(where, f"{where}: only text parts are served, not "
                                          f"{part.type!r}")


def _check_field(name: str, value: Any) -> None:
    allowed, _ = HARMLESS.get(name, (None, ""))
    if value is None or (allowed is not None and allowed(value)):
        return
    raise _refusal(name, name)


def _refusal(param: str, name: str) -> FieldRefused:
    if name in UNSERVED:
        return FieldRefused(param, f"{param}: {UNSERVED[name]}")
    return FieldRefused(param, f"{param}: unknown field; lead refuses what it cannot honour")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int, drafted: int, accepted: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "drafted_tokens": drafted,
            "accepted_tokens": accepted}


def envelope(kind: str, rid: str, model: str) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


def chat_choice(text: str, finish: str | None, delta: bool, first: bool = False,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    if not delta:
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": logprobs, "finish_reason": finish}
    body: dict[str, Any] = {"content": text} if text else {}
    if first:
        body["role"] = "assistant"
    return {"index": 0, "delta": body, "logprobs": logprobs, "finish_reason": finish}


def text_choice(text: str, finish: str | None,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}


def chat_logprobs(entries: Sequence[TokenLogprob], token_bytes: TokenBytes) -> dict[str, Any]:
    """Chat's shape: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    return {"content": [{**_token(e.token_id, e.logprob, token_bytes), "top_logprobs": [
        _token(i, lp, token_bytes) for i, lp in e.top]} for e in entries]}


def _token(token_id: int, logprob: float, token_bytes: TokenBytes) -> dict[str, Any]:
    data = token_bytes(token_id)
    return {"token": token_text(data), "logprob": logprob, "bytes": list(data)}


def token_text(data: bytes) -> str:
    """A token's text; bytes of a character split across tokens as \\xNN, as OpenAI does."""
    return data.decode("utf-8", "backslashreplace")


class CompletionLogprobs:
    """Completions' shape: {tokens, token_logprobs, top_logprobs, text_offset}, one
    reply's worth, in pieces as it streams. text_offset counts characters from the start
    of the prompt, as OpenAI's and llama-cpp-python's do."""

    def __init__(self, prompt: str, token_bytes: TokenBytes) -> None:
        self.offset, self.token_bytes = len(prompt), token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def of(self, entries: Sequence[TokenLogprob]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                     "text_offset": []}
        for e in entries:
            data = self.token_bytes(e.token_id)
            top: dict[str, float] = {}
            for token_id, logprob in [*e.top, (e.token_id, e.logprob)]:  # the token's too
                top.setdefault(token_text(self.token_bytes(token_id)), logprob)
            out["tokens"].append(token_text(data))
            out["token_logprobs"].append(e.logprob)
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(self._decoder.decode(data))
        return out


class ReplyShape:
    """One reply's OpenAI shapes: chat or completion, with logprobs if asked."""

    def __init__(self, chat: bool, token_bytes: TokenBytes, logprobs: bool = False,
                 completion: CompletionLogprobs | None = None) -> None:
        self.chat, self.token_bytes = chat, token_bytes
        self.logprobs, self.completion = logprobs or completion is not None, completion
        self.kind = "chat.completion" if chat else "text_completion"

    def choice(self, text: str, finish: str | None, entries: list[TokenLogprob] | None,
               delta: bool = False, opening: bool = False) -> dict[str, Any]:
        logprobs = self._logprobs(entries)
        if self.chat:
            return chat_choice(text, finish, delta, opening, logprobs)
        return text_choice(text, finish, logprobs)

    def _logprobs(self, entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if entries is None or not self.logprobs:
            return None
        if self.completion is not None:
            return self.completion.of(entries)
        return chat_logprobs(entries, self.token_bytes)


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
