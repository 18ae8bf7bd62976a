"""llama-server's native completion (POST /completion, and /completions's llama-server
shape is OpenAI's: lead/apis/openairoutes.py): the prompt as text, token ids or both
mixed, `n_predict`, the sampler fields, and llama-server's reply (`content`, `tokens`,
`stop`, `stop_type`, `timings`, `generation_settings`, ...), whole or streamed as
`{"content", "tokens", "stop": false}` objects and the whole one last.

It is /infill without the editor's layout (lead/apis/infill.py): the same fields, checks,
limits and reply, the prompt given as is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from lead.apis import shapes
from lead.apis.infill import InfillRequest, InfillShape, InfillText, native_reply, sse
from lead.apis.infill import infill_request as checked_request
from lead.apis.prepare import Defaults, Prepared, gen_request
from lead.apis.renames import renaming
from lead.decode.engine import Engine
from lead.decode.session import Emission, Session
from shared.model import Model
from shared.modelthread import Threads

MAX_PROMPT_IDS = 1 << 20  # token ids and text pieces in one prompt
NAMES = {"max_tokens": "n_predict"}  # the completion request's fields named otherwise
Piece = int | shapes.Text


class CompletionRequest(InfillRequest):
    """llama-server's /completion: /infill's fields but the editor's; the prompt as is."""

    prompt: shapes.Text | list[Piece] = Field("", max_length=MAX_PROMPT_IDS)  # type: ignore[assignment]
    return_tokens: bool = False  # the reply's token ids beside its text


def completion_router(engine: Engine, defaults: Defaults, workers: Threads) -> APIRouter:
    """`defaults`: what a request leaves out gets; `workers`: where requests are prepared."""
    router = APIRouter()
    model = engine.model

    @router.post("/completion", response_model=None)
    async def completion(body: CompletionRequest, request: Request) -> Response:
        pieces = prompt_pieces(body.prompt)
        checked = checked_request(body.model_copy(update={"prompt": "", "input_prefix": "",
                                                          "input_suffix": "",
                                                          "input_extra": None}))
        shape = CompletionShape(model, engine.clock, body, defaults.max_tokens)
        prepare = renaming(NAMES, partial(prepare_completion, model, defaults,
                                          engine.clock, body, pieces, checked))
        return await native_reply(engine, workers, request, shape, prepare)

    return router


def prompt_pieces(prompt: str | list[Piece]) -> list[Piece]:
    """The prompt as text and token ids in order; several prompts (a list of texts only)
    are a 400: one prompt a request."""
    if isinstance(prompt, str):
        return [prompt]
    if len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise shapes.FieldRefused("prompt", "prompt: several prompts in one request are not "
                                            "served; send one a request (text, token ids, "
                                            "or both in one list)")
    return list(prompt)


def prompt_ids(model: Model, pieces: list[Piece]) -> list[int]:
    """Text tokenized as llama-server does (special tokens parsed; the model's BOS before
    text that opens the prompt), ids as given (each the model's, else a 400)."""
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if isinstance(piece, str):
            ids += model.tokenize(piece, special=True, add_bos=i == 0)
        elif 0 <= piece < model.n_vocab:
            ids.append(piece)
        else:
            raise shapes.FieldRefused(f"prompt[{i}]", f"prompt[{i}]: {piece} is no token id "
                                                     f"of {model.name} (0-{model.n_vocab - 1})")
    return ids


def prepare_completion(model: Model, defaults: Defaults, clock: Callable[[], float],
                       body: CompletionRequest, pieces: list[Piece],
                       checked: shapes.CompletionRequest) -> Prepared:
    """The generation: the prompt as given, /infill's checks, sampling and limits."""
    req = gen_request(model, defaults, checked, prompt_ids(model, pieces), None)
    text = partial(InfillText, req.stop, body.n_indent, body.t_max_predict_ms, clock)
    return Prepared(replace(req, max_tokens=0 if body.n_predict == 0 else req.max_tokens,
                            text=text))


class CompletionShape(InfillShape):
    """/infill's reply, with each streamed object's token ids, and the reply's where
    `return_tokens` asks."""

    body: CompletionRequest

    def whole(self, emissions: list[Emission]) -> dict[str, Any]:
        out = super().whole(emissions)
        session = emissions[-1].session
        if self.body.return_tokens and session is not None and "tokens" in out:
            out["tokens"] = session.tokens[session.n_prompt:]
        return out

    async def events(self, emissions: AsyncIterator[Emission]) -> AsyncIterator[str]:
        session: Session | None = None
        content, sent = "", 0  # the reply's text so far, and its tokens sent
        last = None
        async for e in emissions:
            session = e.prompt or session
            ids = session.tokens[session.n_prompt + sent:][:e.n_tokens] if session else []
            sent += e.n_tokens
            if e.text or ids:
                content += e.text
                yield sse({"index": 0, "content": e.text, "tokens": ids, "stop": False})
            last = e
        assert last is not None and last.session is not None, "the last carries the session"
        yield sse(self.last(last.session, content, streamed=True))

