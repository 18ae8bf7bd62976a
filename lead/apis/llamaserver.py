"""llama-server's own endpoints beside the OpenAI ones, as its clients and scripts call
them: /tokenize, /detokenize, /apply-template, GET /props, GET /slots,
/chat/completions/input_tokens. (The OpenAI paths without
their /v1 prefix, which llama-server also serves, are beside theirs, out of the schema.)
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from lead.apis import shapes
from lead.apis.prepare import Defaults, chat_ids, chat_prompt
from lead.decode.engine import Engine
from shared.model import Model
from shared.modelthread import Threads

MAX_DETOKENIZE = 1 << 20  # token ids in one /detokenize request


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # llama-server's other fields change nothing

    content: shapes.Text
    add_special: bool = False  # the BOS token first, where the model adds one
    parse_special: bool = True  # "<|im_start|>" as its special token, not as text
    with_pieces: bool = False  # each id with its text


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    tokens: list[int] = Field(default_factory=list, max_length=MAX_DETOKENIZE)


def llama_server_router(engine: Engine, defaults: Defaults, workers: Threads,
                        slots: bool = True, props_change: bool = False) -> APIRouter:
    """`slots`: GET /slots answers (llama-server's --slots; else its 501)."""
    router = APIRouter()
    model = engine.model

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        ids = await workers.run(partial(model.tokenize, body.content, body.parse_special,
                                        body.add_special))
        if not body.with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": piece(model.token_bytes(t))} for t in ids]}

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        bad = [t for t in body.tokens if not 0 <= t < model.n_vocab]
        if bad:
            raise shapes.FieldRefused("tokens", f"tokens: {bad[0]} is no token id of "
                                                f"{model.name} (0-{model.n_vocab - 1})")
        text = b"".join(model.token_bytes(t) for t in body.tokens)
        return {"content": text.decode("utf-8", "replace")}

    @router.post("/apply-template")
    async def apply_template(body: shapes.ChatRequest) -> dict[str, Any]:
        return {"prompt": await workers.run(partial(template_prompt, model, body))}

    @router.get("/props")
    async def props() -> dict[str, Any]:
        return properties(engine, defaults)

    @router.post("/props")
    async def change_props() -> dict[str, Any]:
        if not props_change:  # llama-server's words
            raise NotServed("This server does not support changing global properties. "
                            "Start it with `--props`")
        return {"success": True}  # as llama-server's: no property changes there either

    @router.get("/slots")
    async def slot_list() -> list[dict[str, Any]]:
        if not slots:
            raise NotServed("This server does not support slots endpoint. Start it with "
                            "`--slots`")
        return [slot_state(engine.model.n_ctx, view) for view in engine.slot_views()]

    @router.post("/chat/completions/input_tokens")
    async def input_tokens(body: shapes.ChatRequest) -> dict[str, int]:
        shapes.check_served(body)
        ids = await workers.run(partial(chat_ids, model, body))
        return {"input_tokens": len(ids[2])}

    return router


class NotServed(HTTPException):
    """llama-server's 501: an endpoint this server was not started to serve."""

    def __init__(self, message: str) -> None:
        super().__init__(501, message)


def slot_state(n_ctx: int, view: dict[str, Any]) -> dict[str, Any]:
    """A slot as llama-server's GET /slots gives it (its id, context, whether busy), and
    lead's own view of it beside."""
    return {"id": view["slot"], "n_ctx": n_ctx, "is_processing": view["state"] != "idle",
            "speculative": True, **{k: v for k, v in view.items() if k != "slot"}}


def piece(raw: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not UTF-8 alone (part of a character),
    as llama-server gives them."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def template_prompt(model: Model, body: shapes.ChatRequest) -> str:
    shapes.check_served(body)
    return chat_prompt(model, body)[1]


def properties(engine: Engine, defaults: Defaults) -> dict[str, Any]:
    """What GET /props says, in llama-server's shape, of what lead has: a request that
    leaves a field out gets `params` (-1: a new seed a request; no reply's end)."""
    model = engine.model
    params = {"seed": -1 if defaults.seed is None else defaults.seed,
              "temperature": defaults.temperature, "n_predict": defaults.max_tokens or -1,
              **defaults.samplers}
    return {"default_generation_settings": {"n_ctx": model.n_ctx, "params": params},
            "total_slots": engine.n_slots, "model_alias": model.name,
            "model_path": str(getattr(model, "path", model.name)),
            "chat_template": model.chat_template or "",
            "modalities": {"vision": False, "audio": False},
            "build_info": "duo lead", "is_sleeping": False}
