"""OpenAI-compatible request and response shapes (the subset duo serves)."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from shared.protocol import SamplingParams


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
    type: str
    text: Text = ""


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[ContentPart] | None = ""

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content if p.type == "text")
        return self.content or ""


class CommonRequest(BaseModel):
    # Unknown fields are ignored (OpenAI clients send many); known ones are strict.
    model_config = ConfigDict(extra="ignore")
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
    n: int = Field(1, ge=1, le=1, description="only n=1 is served")

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
                              min_p=self.min_p, seed=self.seed)

    def wanted_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ChatRequest(CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(CommonRequest):
    prompt: Text


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int, drafted: int, accepted: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "drafted_tokens": drafted,
            "accepted_tokens": accepted}


def envelope(kind: str, rid: str, model: str) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


def chat_choice(text: str, finish: str | None, delta: bool, first: bool = False) -> dict[str, Any]:
    if not delta:
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "finish_reason": finish}
    body: dict[str, Any] = {"content": text} if text else {}
    if first:
        body["role"] = "assistant"
    return {"index": 0, "delta": body, "finish_reason": finish}


def text_choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


def error_body(message: str, kind: str = "invalid_request_error",
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}
