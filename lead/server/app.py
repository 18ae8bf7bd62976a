"""create_app(settings, target=None): the lead's HTTP surface.

OpenAI-compatible chat/completions (lead/apis/openairoutes.py; streamed replies delivered
by lead/server/delivery.py), the Responses and Messages APIs (lead/apis/agentroutes.py),
/infill (lead/apis/infill.py), the back protocol under /duo (lead/server/backroutes.py),
/metrics (lead/server/prometheus.py), /health, and a web page at /
(lead/server/webroutes.py), all behind one gate (lead/server/gate.py: Host check, body
size, keys). Tests inject a fake target; production loads GGUF.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Response
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import CONTENT_TYPE_LATEST

from lead.apis.agentroutes import agent_router
from lead.apis.completion import completion_router
from lead.apis.infill import infill_router
from lead.apis.llamaserver import llama_server_router
from lead.apis.openairoutes import openai_router
from lead.apis.prepare import Defaults
from lead.decode.engine import Engine
from lead.server.backroutes import back_router
from lead.server.errors import install_error_handlers
from lead.server.gate import Gate
from lead.server.keys import Keys
from lead.server.prometheus import exposition
from lead.server.requestlog import RequestLog
from lead.server.settings import LeadSettings, parse_costs
from lead.server.webroutes import mount_web
from shared.model import Model
from shared.modelthread import Threads
from shared.placement import LeadPlace, Placement, allowed_cpus, choose_lead

PREPARE_THREADS = 2  # requests prepared at once (templates, tokens, grammars), off the loop


def lead_placement(settings: LeadSettings, target: Model | None = None) -> Placement:
    """Where lead runs; with every layer offloaded (`-ngl -1`/`all`) one CPU, where there
    is a device to offload to (an --rpc server or a GPU: on a CPU-only build every layer
    stays on the CPU, and lead takes every core as llama-server would)."""
    on_gpu = settings.n_gpu_layers < 0 and (bool(settings.rpc) or
                                            (target is None and _has_accelerator()))
    return choose_lead(settings.cpus, settings.threads, allowed_cpus(), on_gpu=on_gpu)


def _has_accelerator() -> bool:
    from shared import ggml  # the llama.cpp edge, imported only when needed

    return any(kind not in (ggml.DEVICE_TYPE_CPU, ggml.DEVICE_TYPE_ACCEL)
               for _, kind, _ in ggml.devices())


LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


def cors_options(origins: str) -> dict[str, Any]:
    """CORSMiddleware's options for --cors-origins: 'local', '*', '' or a list."""
    listed = [o.strip().rstrip("/") for o in origins.split(",") if o.strip()]
    local = "local" in listed
    listed = [o for o in listed if o != "local"]
    return {"allow_origins": listed, "allow_origin_regex": LOCAL_ORIGINS if local else None,
            "allow_methods": ["*"], "allow_headers": ["*"], "max_age": 600}


def create_app(settings: LeadSettings, target: Model | None = None,
               clock: Callable[[], float] = time.perf_counter) -> FastAPI:
    """`clock`: lead's time, by which it prices the target's steps and rates backs' posts
    (tests give a fake target a virtual one)."""
    placement = lead_placement(settings, target)
    model = target if target is not None else _load_target(settings, placement.threads)
    if settings.alias:
        model.name = settings.alias  # how replies, /v1/models and the page name it
    engine = Engine(model, max_draft=settings.max_draft, draft_len=settings.draft_len,
                    max_queue=settings.max_queue, batch=settings.batch_size, clock=clock,
                    tree=settings.tree, grammar_s=settings.max_grammar_s,
                    ngram=settings.ngram_max if settings.ngram else 0,
                    parallel=settings.parallel, cache_bytes=settings.cache_ram << 20,
                    memory=settings.ngram_memory)
    if settings.verify_cost:
        engine.cost.fix_prices(parse_costs(settings.verify_cost))
    elif settings.calibrate and settings.max_draft > 0 and settings.draft_len is None:
        engine.calibrate()
    workers = Threads("lead-prepare", PREPARE_THREADS)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        workers.shutdown(wait=False)
        engine.shutdown()

    app = FastAPI(title="duo lead", version="0.1.0", lifespan=lifespan)
    app.state.engine, app.state.settings = engine, settings
    # For lead/server/serve.py to call as a signal starts the shutdown: uvicorn drains requests
    # before the lifespan ends, and the page's live stream would never end by itself.
    app.state.on_exit = lambda: (engine.live.close(), engine.feed.close())
    install_error_handlers(app)
    keys = Keys(settings.api_key, settings.back_key)
    app.add_middleware(Gate, limit=settings.max_body_kb * 1024, keys=keys)
    # outside the gate: a browser's preflight carries no key
    app.add_middleware(CORSMiddleware, **cors_options(settings.cors_origins))
    app.add_middleware(RequestLog)
    defaults = Defaults(settings.max_tokens, settings.temp, settings.seed)
    app.include_router(openai_router(engine, defaults, workers))
    app.include_router(agent_router(engine, defaults, workers))
    app.include_router(infill_router(engine, defaults, workers))
    app.include_router(llama_server_router(engine, workers))
    app.include_router(completion_router(engine, defaults, workers))
    place = LeadPlace.of(placement, allowed_cpus())
    app.include_router(back_router(engine, place, settings.max_draft_posts, settings.max_poll_s,
                                   keys=keys, clock=clock,
                                   max_message=settings.max_body_kb * 1024))
    mount_web(app, engine, page=settings.webui)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        # api_key: whether a key is needed, so that the page asks for one before any 401
        return {"status": "ok", "model": model.name, "busy": engine.busy,
                "slots": engine.n_slots, "api_key": settings.api_key is not None}

    if settings.metrics:
        @app.get("/metrics")
        async def metrics() -> Response:
            text = exposition(engine.metrics, engine.gauges(), engine.cost.prices.cost_s,
                              engine.slot_views())
            return Response(text, media_type=CONTENT_TYPE_LATEST)

    return app


def _load_target(settings: LeadSettings, threads: int) -> Model:
    from shared.llm import load_model  # the llama.cpp edge, imported only when needed
    from shared.llm_load import Tuning

    more = Tuning(settings.threads_batch, settings.ubatch_size, settings.mmap, settings.mlock)
    return load_model(settings.model, threads=threads, n_gpu_layers=settings.n_gpu_layers,
                      n_ctx=settings.ctx_size, n_batch=settings.batch_size, rpc=settings.rpc,
                      tensor_split=settings.tensor_split, branches=settings.tree,
                      flash_attn=settings.flash_attn, slots=settings.parallel, more=more)
