"""llama-server's native completion (POST /completion, and /completions's llama-server
shape is OpenAI's: lead/apis/openairoutes.py): the prompt as text, token ids or both
mixed, `n_predict`, the sampler fields, and llama-server's reply (`content`, `tokens`,
`stop`, `stop_type`, `timings`, `generation_settings`, ...), whole or streamed as
`{"content", "tokens", "stop": false}` objects and the whole one last; with `n_probs`, each
token's probabilities (lead/apis/tokenprobs.py), streamed an object a token.

It is /infill without the editor's layout (lead/apis/infill.py): the same fields, checks,
limits and reply, the prompt given as is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, replace
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from lead.apis import shapes
from lead.apis.embedinput import piece_ids, prompts
from lead.apis.infill import (
    INFILL_NAMES,
    InfillRequest,
    InfillShape,
    InfillText,
    native_reply,
    picked,
    prepare_infill,
    sse,
)
from lead.apis.infill import infill_request as checked_request
from lead.apis.prepare import Defaults, Prepared, gen_request
from lead.apis.renames import renaming
from lead.apis.tokenprobs import probabilities, token_objects
from lead.decode.engine import Engine
from lead.decode.session import Emission, Session
from shared.model import Model
from shared.modelthread import Threads

MAX_PROMPT_IDS = 1 << 20  # token ids and text pieces in one prompt
NAMES = {"max_tokens": "n_predict"}  # the completion request's fields named otherwise
Piece = int | shapes.Text


class CompletionRequest(InfillRequest):
    """llama-server's /completion: /infill's fields but the editor's; the prompt as is."""

    # text, ids, both mixed, {"prompt_string": ...}, or a list of those: several prompts
    prompt: shapes.Text | list[Any] | dict[str, Any] = Field(  # type: ignore[assignment]
        "", max_length=MAX_PROMPT_IDS)
    return_progress: bool = False  # streamed: how far the prompt's evaluation is, a batch a time


def completion_router(engine: Engine, defaults: Defaults, workers: Threads) -> APIRouter:
    """llama-server's native /completion and /infill. `defaults`: what a request leaves
    out gets; `workers`: where requests are prepared."""
    router = APIRouter()
    model = engine.model

    @router.post("/infill", response_model=None)
    async def infill(body: InfillRequest, request: Request) -> Response:
        completion = checked_request(body)
        shape = CompletionShape(model, engine.clock, body, defaults.max_tokens)
        prepare = renaming(INFILL_NAMES, partial(prepare_infill, model, defaults,
                                                 engine.batch, engine.clock, body, completion))
        return await native_reply(engine, workers, request, shape, prepare)

    @router.post("/completions", include_in_schema=False, response_model=None)
    @router.post("/completion", response_model=None)  # (both llama-server's native API)
    async def completion(body: CompletionRequest, request: Request) -> Response:
        checked = checked_request(body.model_copy(update={"prompt": "", "input_prefix": "",
                                                          "input_suffix": "",
                                                          "input_extra": None}))

        async def one(pieces: list[Piece]) -> Response:
            shape = CompletionShape(model, engine.clock, body, defaults.max_tokens)
            prepare = renaming(NAMES, partial(prepare_completion, model, defaults,
                                              engine.clock, body, pieces, checked))
            return await native_reply(engine, workers, request, shape, prepare)
        several = prompts(body.prompt, "prompt")
        if len(several) == 1:
            return await one(several[0])
        if body.stream:
            raise shapes.FieldRefused("prompt", "prompt: several prompts are answered whole "
                                                "(stream: false), or one a request")
        return gathered(await asyncio.gather(*(one(p) for p in several)))

    return router


def gathered(replies: list[Response]) -> Response:
    """Several prompts' replies as llama-server gives them: a list, each with its index
    (the first that failed instead, as it is)."""
    failed = next((r for r in replies if r.status_code != 200), None)
    if failed is not None:
        return failed
    return JSONResponse([{**json.loads(bytes(r.body)), "index": i}
                         for i, r in enumerate(replies)])


def prompt_ids(model: Model, pieces: list[Piece]) -> list[int]:
    """The prompt's text and ids as llama-server makes them (embedinput.piece_ids)."""
    return piece_ids(model, pieces, lambda i: f"prompt[{i}]")


def prepare_completion(model: Model, defaults: Defaults, clock: Callable[[], float],
                       body: CompletionRequest, pieces: list[Piece],
                       checked: shapes.CompletionRequest) -> Prepared:
    """The generation: the prompt as given, /infill's checks, sampling and limits."""
    req = gen_request(model, defaults, checked, prompt_ids(model, pieces), None)
    text = partial(InfillText, req.stop, body.n_indent, body.t_max_predict_ms, clock)
    return Prepared(replace(req, max_tokens=0 if body.n_predict == 0 else req.max_tokens,
                            text=text, top_logprobs=body.n_probs or None,
                            post_sampling=body.post_sampling_probs,
                            progress=body.return_progress and body.stream))


class CompletionShape(InfillShape):
    """/infill's reply, with each streamed object's token ids, the reply's where
    `return_tokens` asks, and each token's probabilities where `n_probs` asks (on /infill
    too, as llama-server)."""

    def whole(self, emissions: list[Emission]) -> dict[str, Any]:
        out = super().whole(emissions)
        session = emissions[-1].session
        if self.body.return_tokens and session is not None and "tokens" in out:
            out["tokens"] = session.tokens[session.n_prompt:]
        if self.body.n_probs:  # a field as any other: response_fields may pick it
            entries = [lp for e in emissions for lp in e.logprobs]
            out.update(picked({"completion_probabilities": probabilities(
                entries, self.model.token_bytes, self.body.post_sampling_probs)},
                self.body.response_fields))
        return out

    def settings(self, session: Session) -> dict[str, Any]:
        return {**super().settings(session), "n_probs": self.body.n_probs,
                "post_sampling_probs": self.body.post_sampling_probs}

    async def events(self, emissions: AsyncIterator[Emission]) -> AsyncIterator[str]:
        session: Session | None = None
        content, sent = "", 0  # the reply's text so far, and its tokens sent
        last = None
        async for e in emissions:
            session = e.prompt or session
            if e.progress is not None:  # llama-server's: an empty piece with it
                yield sse({"index": 0, "content": "", "tokens": [], "stop": False,
                           "prompt_progress": asdict(e.progress)})
                continue
            ids = session.tokens[session.n_prompt + sent:][:e.n_tokens] if session else []
            sent += e.n_tokens
            if e.text or ids:
                content += e.text
                for obj in self.objects(ids, e):
                    yield sse(obj)
            last = e
        assert last is not None and last.session is not None, "the last carries the session"
        yield sse(self.last(last.session, content, streamed=True))

    def objects(self, ids: list[int], e: Emission) -> list[dict[str, Any]]:
        """A piece's streamed objects (`ids`: its tokens): one, or with n_probs one a token,
        as llama-server streams them."""
        if not self.body.n_probs:
            return [{"index": 0, "content": e.text, "tokens": ids, "stop": False}]
        return token_objects(e.text, ids, e.logprobs, self.model.token_bytes,
                             self.body.post_sampling_probs)

