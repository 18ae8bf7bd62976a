"""Embeddings under --embeddings, as llama-server serves them: POST /v1/embeddings in
OpenAI's shape (pooled vectors, L2-normalized by default, floats or base64), and its own
POST /embedding (and /embeddings): [{"index", "embedding": [vector, ...]}], one pooled
vector an input, or with --pooling none one unnormalized vector a token.

The inputs are read and tokenized on a worker thread (lead/apis/embedinput.py); each is
embedded on the engine's model thread, between its steps, in a context of its own
(shared/llama/embed.py), so generations go on as they would. Without --embeddings every
path answers llama-server's 501.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictInt

from lead.apis import shapes
from lead.apis.embedinput import Prompt, prompt_ids, prompts
from lead.decode.engine import Engine
from shared.embedding import EUCLIDEAN, NO_NORM, Embedder, base64_floats, normalize
from shared.model import Model
from shared.modelthread import Threads

NOT_SUPPORTED = "This server does not support embeddings. Start it with `--embeddings`"
NOT_OAI = "Pooling type 'none' is not OAI compatible. Please use a different pooling type"
FORMATS = "The format to return the embeddings in. Can be either float or base64"


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI's `dimensions`, `user`: no change

    input: Any = None  # (embedinput.py reads its shapes)
    content: Any = None  # llama-server's own field: its reply is in llama-server's shape
    encoding_format: Any = "float"
    embd_normalize: StrictInt = EUCLIDEAN  # -1 none, 0 max-abs, 2 L2, p > 0 a p-norm
    model: str | None = None


def embeddings_router(engine: Engine, workers: Threads, embedder: Embedder | None) -> APIRouter:
    """`embedder`: None without --embeddings (every path a 501, out of the schema)."""
    router = APIRouter()
    listed = embedder is not None

    async def answer(body: EmbeddingRequest, oai: bool) -> Any:
        if embedder is None:
            return JSONResponse(shapes.error_body(NOT_SUPPORTED, "not_supported_error"), 501)
        if oai and not embedder.pooled:
            raise HTTPException(400, NOT_OAI)
        field, oai = ("input", oai) if "input" in body.model_fields_set else ("content", False)
        inputs = checked(body, field)
        ids = await workers.run(partial(tokenized, engine.model, inputs, field, embedder.n_ctx))
        rows = [finish(await engine.model_thread.run(embedder.embed, one), embedder.pooled,
                       body.embd_normalize) for one in ids]
        if not oai:
            return [{"index": i, "embedding": r.tolist()} for i, r in enumerate(rows)]
        return oai_reply(rows, ids, body.model or engine.model.name,
                         body.encoding_format == "base64")

    @router.post("/v1/embeddings", include_in_schema=listed, response_model=None)
    async def v1_embeddings(body: EmbeddingRequest) -> Any:
        return await answer(body, oai=True)

    @router.post("/embedding", include_in_schema=listed, response_model=None)
    async def embedding(body: EmbeddingRequest) -> Any:
        return await answer(body, oai=False)

    @router.post("/embeddings", include_in_schema=False, response_model=None)
    async def embeddings(body: EmbeddingRequest) -> Any:
        return await answer(body, oai=False)

    return router


def checked(body: EmbeddingRequest, field: str) -> list[Prompt]:
    """The request's inputs; a 400 for a field llama-server refuses."""
    if field not in body.model_fields_set:
        raise shapes.FieldRefused("input", '"input" or "content" must be provided')
    if body.encoding_format not in ("float", "base64"):
        raise shapes.FieldRefused("encoding_format", FORMATS)
    if body.embd_normalize < NO_NORM:
        raise shapes.FieldRefused("embd_normalize", "embd_normalize: -1 (none), 0 (max "
                                                    "absolute), 2 (euclidean) or p > 0 (p-norm)")
    return prompts(getattr(body, field), field)


def tokenized(model: Model, inputs: list[Prompt], field: str, limit: int) -> list[list[int]]:
    many = len(inputs) > 1
    return [prompt_ids(model, p, f"{field}[{i}]" if many else field, limit)
            for i, p in enumerate(inputs)]


def finish(rows: np.ndarray, pooled: bool, norm: int) -> np.ndarray:
    """A pooled vector normalized as asked; a token's (no pooling) as it is, as
    llama-server leaves them."""
    return np.array([normalize(rows[0], norm)]) if pooled else rows


def oai_reply(rows: list[np.ndarray], ids: list[list[int]], model: str,
              b64: bool) -> dict[str, Any]:
    n_tokens = sum(len(one) for one in ids)
    data = [{"object": "embedding", "index": i,
             "embedding": base64_floats(r[0]) if b64 else r[0].tolist()}
            | ({"encoding_format": "base64"} if b64 else {}) for i, r in enumerate(rows)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def load_embedder(model: Model, pooling: str | None, batch: int, threads: int) -> Embedder:
    """llama.cpp's embeddings of the loaded model; `batch`: the most tokens of one input."""
    from shared.llama.embed import LlamaEmbedder  # the llama.cpp edge, imported only when needed

    return LlamaEmbedder(model, pooling, batch, threads)
