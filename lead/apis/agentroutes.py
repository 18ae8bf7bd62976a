"""The APIs agents and editors speak beside chat completions: OpenAI's Responses
(POST /v1/responses) and Anthropic's Messages (POST /v1/messages); llama.cpp's server's
fill in the middle (POST /infill) is lead/apis/infill.py. Each turns its request into a chat
request, which rides the same engine as every other (drafts verified, a place in line
first), and its reply into its own shapes (lead/apis/responsereply.py,
lead/apis/anthropicreply.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lead.apis import anthropic, anthropicreply, responsereply, responses
from lead.apis.openairoutes import Generation, reply
from lead.apis.prepare import Defaults, Prepared, chat_ids, prepare_chat
from lead.apis.renames import renaming
from lead.apis.streaming import StreamedReply
from lead.decode.engine import Engine
from shared.modelthread import Threads


def agent_router(engine: Engine, defaults: Defaults, workers: Threads) -> APIRouter:
    """`defaults`: what a request leaves out gets; `workers`: where requests are prepared."""
    router = APIRouter()
    model = engine.model

    @router.post("/responses", include_in_schema=False, response_model=None)
    @router.post("/v1/responses", response_model=None)
    async def create_response(body: responses.ResponsesRequest, request: Request) -> Response:
        if (refused := responses.refusal(body)) is not None:
            raise refused
        chat, names, tools = responses.to_chat(body)
        shape = responsereply.ResponseShape(body, model.name, responses.new_id("resp"),
                                            model.token_bytes, tools, engine.clock)

        def streamed(gen: Generation, prepared: Prepared, release: Callable[[], None]
                     ) -> Response:
            return StreamedReply(gen, lambda emissions: shape.events(emissions, prepared),
                                 release)
        return await reply(engine, workers, request, body.stream,
                           renaming(names, partial(prepare_chat, model, defaults, chat)),
                           lambda emissions, prepared: JSONResponse(shape.whole(emissions,
                                                                                prepared)),
                           streamed)

    @router.post("/v1/messages", response_model=None)
    async def create_message(body: anthropic.MessagesRequest, request: Request) -> Response:
        if (refused := anthropic.refusal(body)) is not None:
            raise refused
        chat, names = anthropic.to_chat(body)
        shape = anthropicreply.MessageShape(model.name, anthropicreply.new_id("msg"))
        prepare = renaming(names, partial(prepare_chat, model, defaults, chat))

        def streamed(gen: Generation, prepared: Prepared, release: Callable[[], None]
                     ) -> Response:
            return StreamedReply(gen, lambda emissions: shape.events(emissions, prepared),
                                 release)
        return await reply(engine, workers, request, body.stream, prepare,
                           lambda emissions, prepared: JSONResponse(shape.whole(emissions,
                                                                                prepared)),
                           streamed)

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(body: anthropic.CountRequest) -> dict[str, int]:
        """The prompt's tokens, as the model's template and tokenizer make them (agents
        ask before a turn, to know when to compact)."""
        if (refused := anthropic.refusal(body)) is not None:
            raise refused
        chat, names = anthropic.to_chat(body)
        _, _, ids = await workers.run(renaming(names, partial(chat_ids, model, chat)))
        return {"input_tokens": len(ids)}

    return router

