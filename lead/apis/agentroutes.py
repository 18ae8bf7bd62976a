"""The APIs agents and editors speak beside chat completions: OpenAI's Responses
(POST /v1/responses) and Anthropic's Messages (POST /v1/messages), and llama.cpp's server's
fill-in-the-middle (POST /infill). Each turns its request into a chat (or completion)
request, which rides the same engine as every other (drafts verified, a place in line
first), and its reply into its own shapes (lead/apis/responses.py, lead/apis/anthropic.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from lead.apis import anthropic, responses, shapes
from lead.apis.openairoutes import reply
from lead.apis.prepare import Prepared, prepare_chat, prepare_completion
from lead.apis.renames import renaming, validated
from lead.decode.engine import Engine
from lead.decode.session import Emission, Session
from lead.server.delivery import StreamedReply
from shared.modelthread import Threads

# The completion request's fields /infill names otherwise (its prompt: the prefix, then it)
INFILL_NAMES = {"max_tokens": "n_predict", "suffix": "input_suffix", "prompt": "input_prefix"}


class InfillRequest(BaseModel):
    """llama.cpp's server's /infill: the text before and after the cursor."""

    model_config = ConfigDict(extra="allow")  # what else: refused
    input_prefix: shapes.Text = ""
    input_suffix: shapes.Text = ""
    input_extra: list[dict[str, Any]] | None = None
    prompt: shapes.Text = ""  # typed after the prefix
    n_predict: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    stop: shapes.Text | list[shapes.Text] | None = None
    stream: bool = False


def agent_router(engine: Engine, max_tokens: int, workers: Threads) -> APIRouter:
    """`max_tokens`: a request's default; `workers`: where requests are prepared."""
    router = APIRouter()
    model = engine.model

    @router.post("/v1/responses", response_model=None)
    async def create_response(body: responses.ResponsesRequest, request: Request) -> Response:
        if (refused := responses.refusal(body)) is not None:
            raise refused
        chat, names = responses.to_chat(body)
        shape = responses.ResponseShape(body, model.name, responses.new_id("resp"),
                                        model.token_bytes)

        def streamed(gen: AsyncGenerator[Emission, None], first: Emission,
                     prepared: Prepared) -> Response:
            return StreamedReply(gen, first,
                                 lambda emissions: shape.events(emissions, prepared.plan))
        return await reply(engine, workers, request, body.stream,
                           renaming(names, partial(prepare_chat, model, max_tokens, chat)),
                           lambda emissions, plan: JSONResponse(shape.whole(emissions, plan)),
                           streamed)

    @router.post("/v1/messages", response_model=None)
    async def create_message(body: anthropic.MessagesRequest, request: Request) -> Response:
        if (refused := anthropic.refusal(body)) is not None:
            raise refused
        chat, names = anthropic.to_chat(body)
        shape = anthropic.MessageShape(model.name, anthropic.new_id("msg"))
        prepare = renaming(names, partial(prepare_chat, model, max_tokens, chat))

        def streamed(gen: AsyncGenerator[Emission, None], first: Emission,
                     prepared: Prepared) -> Response:
            n_prompt = len(prepared.req.prompt_ids)
            return StreamedReply(gen, first, lambda emissions: shape.events(
                emissions, prepared.plan, n_prompt))
        return await reply(engine, workers, request, body.stream, prepare,
                           lambda emissions, plan: JSONResponse(shape.whole(emissions, plan)),
                           streamed)

    @router.post("/infill", response_model=None)
    async def infill(body: InfillRequest, request: Request) -> Response:
        completion = infill_request(body)

        def streamed(gen: AsyncGenerator[Emission, None], first: Emission,
                     prepared: Prepared) -> Response:
            return StreamedReply(gen, first, partial(infill_events, model.name))
        return await reply(engine, workers, request, body.stream,
                           renaming(INFILL_NAMES, partial(prepare_completion, model,
                                                          max_tokens, completion)),
                           lambda emissions, _: JSONResponse(infill_whole(model.name,
                                                                          emissions)),
                           streamed)

    return router


def infill_request(body: InfillRequest) -> shapes.CompletionRequest:
    """/infill as a completion with a suffix (its `prompt`, typed after the prefix, joins
    it); `input_extra` (other files' text) is not served."""
    for name, value in (body.model_extra or {}).items():
        if value is not None:
            raise shapes.FieldRefused(name, f"{name}: unknown field; lead refuses what it "
                                         "cannot honour")
    if body.input_extra:
        raise shapes.FieldRefused("input_extra", "input_extra: other files' context is not "
                                              "served")
    fields = {"prompt": body.input_prefix + body.prompt, "suffix": body.input_suffix or None,
              "max_tokens": body.n_predict, "temperature": body.temperature,
              "top_p": body.top_p, "top_k": body.top_k, "stop": body.stop,
              "stream": body.stream}
    return validated(shapes.CompletionRequest.model_validate,
                     {k: v for k, v in fields.items() if v is not None}, INFILL_NAMES)


def infill_fields(model: str, session: Session) -> dict[str, Any]:
    """The last object of an /infill reply, as llama.cpp's server ends one."""
    return {"content": "", "stop": True, "model": model, "tokens_predicted": session.n_generated,
            "tokens_evaluated": session.n_prompt, "stop_type": {
                "stop": "eos" if session.stop_sequence is None else "word",
                "length": "limit"}.get(session.finish_reason or "", "none"),
            "stopping_word": session.stop_sequence or "",
            "drafted_tokens": session.drafted, "accepted_tokens": session.accepted}


def infill_whole(model: str, emissions: list[Emission]) -> dict[str, Any]:
    session = emissions[-1].session
    assert session is not None, "the last emission carries the session"
    return {**infill_fields(model, session), "content": "".join(e.text for e in emissions)}


async def infill_events(model: str, emissions: Any) -> Any:
    """llama.cpp's server's stream: `{"content", "stop": false}` per piece of text, then the
    last object, `stop: true`."""
    last = None
    async for e in emissions:
        if e.text:
            yield f"data: {json.dumps({'content': e.text, 'stop': False})}\n\n"
        last = e
    session = last.session if last is not None else None
    assert session is not None, "the last emission carries the session"
    yield f"data: {json.dumps(infill_fields(model, session))}\n\n"
