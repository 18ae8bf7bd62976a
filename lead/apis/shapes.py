"""OpenAI-compatible request and response shapes.

The fields lead serves are declared below; what it does with each other field the API
has is in lead/apis/fields.py (`check_served`).
"""

from __future__ import annotations

import codecs
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, Literal

from fastapi import HTTPException
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from lead.apis import fields
from lead.apis.llamasampling import LlamaSamplers
from shared.logprobs import MAX_TOP_LOGPROBS, TokenLogprob
from shared.wire.protocol import (
    LogitBias,
    OpenAIPenalty,
    RepeatLastN,
    RepeatPenalty,
    SamplingParams,
)

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
    # an earlier turn's thinking, rendered where the template uses it (Qwen3's <think>)
    reasoning_content: Text | None = None

    def text(self, delimiter: str = "\n") -> str:
        if isinstance(self.content, list):
            return joined([p.text for p in self.content], delimiter)
        return self.content or ""

    def for_template(self, last: bool = False) -> dict[str, Any]:
        """The message as templates take it. Text parts joined as llama-server joins them:
        by a newline, but with blank lines in a prefill (`last`: the assistant's message
        that ends the conversation, which the reply continues)."""
        # OpenAI's newer name for system; many templates reject roles they do not know.
        role = "system" if self.role == "developer" else self.role
        extra = {k: v for k, v in (("name", self.name), ("tool_calls", self.tool_calls),
                                   ("tool_call_id", self.tool_call_id),
                                   ("reasoning_content", self.reasoning_content)) if v}
        prefill = last and role == "assistant" and not self.tool_calls
        return {"role": role, "content": self.text("\n\n" if prefill else "\n"), **extra}


def joined(texts: Sequence[str], delimiter: str = "\n") -> str:
    """Text parts as llama.cpp joins them: `delimiter` between, none while the text so far
    is empty."""
    out = ""
    for text in texts:
        out += (delimiter if out else "") + text
    return out


def text_parts(texts: Sequence[str]) -> str | list[dict[str, str]]:
    """Texts as a chat message's content: one as it is, several as text parts (which
    ChatMessage joins as llama-server does)."""
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": text} for text in texts]


class JsonSchemaFormat(BaseModel):
    """OpenAI's response_format.json_schema. The schema is always enforced; `strict`:
    false lets through keywords the grammar cannot enforce (ignored), else they are a 400."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field("", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    # llama-server's json_object with a schema (instructor's JSON_SCHEMA mode sends it):
    # enforced as far as the grammar can, as llama-server does
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    @property
    def structured(self) -> bool:
        return self.type != "text"


def given(body: BaseModel, *names: str) -> dict[str, Any]:
    """The fields the client set, of `names`: a field left out stays out of the chat
    request made of it, so lead's sampling flags fill it as they would the chat's own."""
    return {name: getattr(body, name) for name in names if name in body.model_fields_set}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")  # include_obfuscation ...: nothing to add
    include_usage: bool = False


class CommonRequest(LlamaSamplers):
    # Fields not declared here (or in LlamaSamplers) are kept in model_extra for
    # check_served to judge.
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int | None = None
    verbose: bool = False  # llama-server's: the reply carries __verbose (its prompt, ...)
    id_slot: int | None = None  # llama-server's: the slot the request runs in (-1: any)
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # llama-server's: a streamed reply tells how far its prompt's evaluation is, a batch
    # at a time (prompt_progress)
    return_progress: bool = False
    timings_per_token: bool = False  # llama-server's: a streamed token's chunk with timings
    frequency_penalty: OpenAIPenalty | None = None
    presence_penalty: OpenAIPenalty | None = None
    repeat_penalty: RepeatPenalty = 1.0
    repeat_last_n: RepeatLastN = 64
    logit_bias: LogitBias | None = None
    response_format: ResponseFormat | None = None
    grammar: str | None = None  # GBNF, as llama.cpp's server takes it; "" is none
    json_schema: dict[str, Any] | None = None  # llama-server's: a schema, as json_object's

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop strings")
        return v

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, default_temperature: float,
                 preset: Mapping[str, Any] | None = None) -> SamplingParams:
        """The request's sampling; a field it leaves out takes `preset`'s value where that
        has one (lead's --top-k, --min-p, ...)."""
        temperature = default_temperature if self.temperature is None else self.temperature
        params = SamplingParams(temperature=temperature, top_k=self.top_k, top_p=self.top_p,
                                min_p=self.min_p, seed=self.seed,
                                frequency_penalty=self.frequency_penalty or 0.0,
                                presence_penalty=self.presence_penalty or 0.0,
                                repeat_penalty=self.repeat_penalty,
                                repeat_last_n=self.repeat_last_n,
                                logit_bias=self.logit_bias or {}, **self.llama_sampling())
        unset = {k: v for k, v in (preset or {}).items()
                 if k not in self.model_fields_set or getattr(self, k) is None}
        return params.model_copy(update=unset) if unset else params

    def usage_apart(self) -> bool:
        """OpenAI's include_usage: the usage in a last chunk of its own, with no choices."""
        return bool(self.stream_options and self.stream_options.include_usage)

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
    chat_template_kwargs: dict[str, Any] | None = None  # llama-server's
    reasoning_effort: str | None = None
    # llama-server's and vLLM's: the prompt ends without the assistant's header, or in the
    # last (assistant's) message, which the reply continues (lead does so by default)
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _one_ending(self) -> ChatRequest:
        if self.continue_final_message and "add_generation_prompt" in self.model_fields_set \
                and self.add_generation_prompt:
            raise ValueError("Cannot set both add_generation_prompt and "
                             "continue_final_message to true")
        ends = [m.role for m in self.messages[-2:]]
        if ends == ["assistant", "assistant"] and not self.messages[-1].tool_calls:
            # the last is the reply's start (prefill): the one before it has no place
            raise ValueError("Cannot have 2 or more assistant messages at the end of the "
                             "list.")
        return self

    @property
    def thinking(self) -> bool | None:
        """The template's thinking switch, where the request sets it (None: its default)."""
        switch = (self.chat_template_kwargs or {}).get("enable_thinking")
        if isinstance(switch, bool):
            return switch
        return None if self.reasoning_effort is None else self.reasoning_effort != "none"

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
    """A 400 naming the request field (`param`, as OpenAI's errors do), and OpenAI's
    `code` where it has one that clients look for."""

    code: str | None = None

    def __init__(self, param: str, message: str, code: str | None = None) -> None:
        super().__init__(400, message)
        self.param = param
        if code is not None:
            self.code = code


class ContextExceeded(FieldRefused):
    """A prompt the context cannot hold, in the words each API uses (clients look for
    them: OpenAI's code, Anthropic's "prompt is too long", on which agents compact)."""

    code = "context_length_exceeded"

    def __init__(self, param: str, n_prompt: int, n_ctx: int) -> None:
        super().__init__(param, f"This model's maximum context length is {n_ctx} tokens. "
                                f"However, your {param} resulted in {n_prompt} tokens. Please "
                                "reduce the length of the messages (or start lead with a "
                                "larger --ctx-size).")
        self.n_prompt, self.n_ctx = n_prompt, n_ctx

    def anthropic_message(self) -> str:
        return f"prompt is too long: {self.n_prompt} tokens > {self.n_ctx - 1} maximum"


def check_served(body: CommonRequest) -> None:
    """Raise FieldRefused for the first field whose absence of service would silently
    change the reply (lead/apis/fields.py); fields lead ignores are logged."""
    chat = isinstance(body, ChatRequest)
    try:
        fields.judge(fields.CHAT if chat else fields.COMPLETIONS, body.model_extra or {},
                     "/v1/chat/completions" if chat else "/v1/completions")
    except fields.Unserved as exc:
        raise openai_refusal(exc) from None
    for i, message in enumerate(getattr(body, "messages", [])):
        parts = message.content if isinstance(message.content, list) else []
        for j, part in enumerate(parts):
            if part.type != "text":
                where = f"messages[{i}].content[{j}].type"
                raise FieldRefused(where, f"Unsupported value: '{where}' does not support "
                                          f"{part.type!r} with this model: it reads text "
                                          "only.", "unsupported_value")


def openai_refusal(exc: fields.Unserved) -> FieldRefused:
    """OpenAI's own words for a parameter or a value a model does not support."""
    if exc.rule.harmless is not None:
        return FieldRefused(exc.param, f"Unsupported value: '{exc.param}' does not support "
                                       f"{exc.value!r} with this model ({exc.rule.why}).",
                            "unsupported_value")
    return FieldRefused(exc.param, f"Unsupported parameter: '{exc.param}' is not supported "
                                   f"with this model ({exc.rule.why}).",
                        "unsupported_parameter")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int, drafted: int, accepted: int, cached: int = 0
          ) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "drafted_tokens": drafted, "accepted_tokens": accepted}


def _fingerprint() -> str:
    """OpenAI's `system_fingerprint`: what serves the reply (lead's and llama.cpp's builds),
    "b" first as llama-server's ("b<build>-<commit>")."""
    try:
        return f"b{version('llama-cpp-python')}-duo-{version('duo')}"
    except PackageNotFoundError:  # run from a tree not installed
        return "b-duo"


FINGERPRINT = _fingerprint()


def envelope(kind: str, rid: str, model: str) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model,
            "system_fingerprint": FINGERPRINT}


def chat_choice(text: str, finish: str | None, delta: bool, first: bool = False,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    if not delta:
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": logprobs, "finish_reason": finish}
    if first:  # llama-server's first chunk (OpenAI's has "content": "")
        body: dict[str, Any] = {"role": "assistant", "content": None}
    else:
        body = {"content": text} if text else {}
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
    """One reply's OpenAI shapes: chat or completion, with logprobs if asked; a choice's
    shapes by its index (`n`). `prompt`: a completion's, whose logprobs are asked for."""

    def __init__(self, chat: bool, token_bytes: TokenBytes, logprobs: bool = False,
                 prompt: str | None = None) -> None:
        self.chat, self.token_bytes, self.prompt = chat, token_bytes, prompt
        self.logprobs = logprobs or prompt is not None
        self.kind = "chat.completion" if chat else "text_completion"
        self._completions: dict[int, CompletionLogprobs] = {}  # each choice's offsets

    def choice(self, text: str, finish: str | None, entries: list[TokenLogprob] | None,
               delta: bool = False, opening: bool = False, index: int = 0) -> dict[str, Any]:
        logprobs = self._logprobs(entries, index)
        if self.chat:
            return {**chat_choice(text, finish, delta, opening, logprobs), "index": index}
        return {**text_choice(text, finish, logprobs), "index": index}

    def _logprobs(self, entries: list[TokenLogprob] | None, index: int
                  ) -> dict[str, Any] | None:
        if entries is None or not self.logprobs:
            return None
        if self.prompt is not None:
            if index not in self._completions:
                self._completions[index] = CompletionLogprobs(self.prompt, self.token_bytes)
            return self._completions[index].of(entries)
        return chat_logprobs(entries, self.token_bytes)


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
