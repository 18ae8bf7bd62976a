"""create_app(settings, target=None): the lead's HTTP surface.

OpenAI-compatible chat/completions (lead/apis/openairoutes.py; streamed replies delivered
by lead/apis/streaming.py), the Responses and Messages APIs (lead/apis/agentroutes.py),
/infill (lead/apis/infill.py), embeddings (lead/apis/embeddings.py), the back protocol
under /duo (lead/backs/routes.py), /metrics (lead/server/prometheus.py), /health, and
a web page at / (lead/server/webroutes.py), all behind one gate (lead/server/gate.py: Host
check, body size, keys). Tests inject a fake target; production loads GGUF.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST

from lead.apis.agentroutes import agent_router
from lead.apis.completion import completion_router
from lead.apis.embeddings import embeddings_router, load_embedder
from lead.apis.llamaserver import llama_server_router
from lead.apis.openairoutes import openai_router
from lead.apis.prepare import Defaults
from lead.apis.slotactions import slot_actions_router
from lead.backs.feed import attach
from lead.backs.keys import Keys
from lead.backs.routes import back_router
from lead.decode.engine import Engine
from lead.server.cors import Cors, cors_options
from lead.server.errors import install_error_handlers
from lead.server.gate import Gate
from lead.server.live import LiveNews
from lead.server.llamaflags import CACHE_TYPES
from lead.server.prometheus import exposition
from lead.server.requestlog import RequestLog
from lead.server.settings import LeadSettings, parse_costs
from lead.server.webroutes import mount_web
from shared.embedding import Embedder
from shared.model import Model
from shared.modelthread import Threads
from shared.placement import LeadPlace, Placement, allowed_cpus, choose_lead
from shared.presets import ModelError, require_cached

PREPARE_THREADS = 2  # requests prepared at once (templates, tokens, grammars), off the loop


def lead_placement(settings: LeadSettings, target: Model | None = None) -> Placement:
    """Where lead runs; with every layer offloaded (`-ngl -1`/`all`) one CPU, where there
    is a device to offload to (an --rpc server or a GPU: on a CPU-only build every layer
    stays on the CPU, and lead takes every core as llama-server would)."""
    offloads = settings.device != "none"  # (-dev none: every layer stays here)
    on_gpu = settings.n_gpu_layers < 0 and offloads and \
        (bool(settings.rpc) or (target is None and _has_accelerator()))
    return choose_lead(settings.cpus, settings.threads, allowed_cpus(), on_gpu=on_gpu)


def _has_accelerator() -> bool:
    from shared.llama import ggml  # the llama.cpp edge, imported only when needed

    return any(kind not in (ggml.DEVICE_TYPE_CPU, ggml.DEVICE_TYPE_ACCEL)
               for _, kind, _ in ggml.devices())


def model_card(settings: LeadSettings) -> dict[str, Any]:
    """--alias a,b (llama-server's: several names, the first in order its id) and --tags."""
    aliases = sorted({a.strip() for a in (settings.alias or "").split(",") if a.strip()})
    tags = sorted({t.strip() for t in (settings.tags or "").split(",") if t.strip()})
    return {"id": aliases[0] if aliases else None, "aliases": aliases, "tags": tags}


def create_app(settings: LeadSettings, target: Model | None = None,
               clock: Callable[[], float] = time.perf_counter,
               embedder: Embedder | None = None) -> FastAPI:
    """`clock`: lead's time, by which it prices the target's steps and rates backs' posts
    (tests give a fake target a virtual one); `embedder`: --embeddings' (tests give a fake
    target a scripted one; else made on the target's weights)."""
    placement = lead_placement(settings, target)
    model = target if target is not None else _load_target(settings, placement.threads)
    card = model_card(settings)
    if settings.alias:  # how replies, /v1/models and the page name it
        model.name = card["id"]
    engine = Engine(model, max_draft=settings.max_draft, draft_len=settings.draft_len,
                    max_queue=settings.max_queue, batch=settings.batch_size, clock=clock,
                    grammar_s=settings.max_grammar_s,
                    ngram=settings.ngram_max if settings.ngram else 0,
                    parallel=settings.parallel, cache_bytes=settings.cache_ram << 20,
                    memory=settings.ngram_memory)
    if settings.verify_cost:
        engine.cost.fix_prices(parse_costs(settings.verify_cost))
    elif settings.calibrate and settings.max_draft > 0 and settings.draft_len is None:
        engine.calibrate()
    workers = Threads("lead-prepare", PREPARE_THREADS)
    live = LiveNews()  # the web page's live panel, told by the engine of each change
    engine.on_change, engine.on_end = live.bump, live.add_reply
    feed = attach(engine, on_arrival=live.bump)  # what backs see of the sessions

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        workers.shutdown(wait=False)
        engine.shutdown()
        live.close()

    app = FastAPI(title="duo lead", version="0.1.0", lifespan=lifespan)
    app.state.engine, app.state.settings, app.state.live = engine, settings, live
    app.state.feed = feed
    # For lead/server/serve.py to call as a signal starts the shutdown: uvicorn drains requests
    # before the lifespan ends, and the page's live stream would never end by itself.
    app.state.on_exit = live.close
    install_error_handlers(app)
    keys = Keys(settings.first_api_key, settings.back_key, tuple(settings.api_keys()))
    app.add_middleware(Gate, limit=settings.max_body_kb * 1024, keys=keys)
    # outside the gate: a browser's preflight carries no key
    app.add_middleware(Cors, **cors_options(settings.cors_origins))
    app.add_middleware(RequestLog)
    defaults = Defaults(settings.max_tokens, settings.temp, settings.seed,
                        settings.reasoning_format != "none", settings.verbose,
                        settings.sampler_preset())
    app.include_router(openai_router(engine, defaults, workers, card))
    app.include_router(agent_router(engine, defaults, workers))
    app.include_router(llama_server_router(engine, defaults, workers, settings.slots,
                                       settings.props))
    app.include_router(slot_actions_router(engine, settings.slot_save_path))
    app.include_router(completion_router(engine, defaults, workers))
    app.include_router(embeddings_router(engine, workers, _embedder(settings, model, embedder,
                                                                    placement.threads)))
    place = LeadPlace.of(placement, allowed_cpus())
    app.include_router(back_router(engine, feed, place, settings.max_draft_posts, keys=keys,
                                   clock=clock, max_message=settings.max_body_kb * 1024))
    mount_web(app, engine, live, feed.backs, page=settings.webui)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        # api_key: whether a key is needed, so that the page asks for one before any 401
        return {"status": "ok", "model": model.name, "busy": engine.busy,
                "slots": engine.n_slots, "api_key": keys.api_key is not None}

    if settings.metrics:
        @app.get("/metrics")
        async def metrics() -> Response:
            gauges = {**engine.gauges(), "backs_active": feed.backs.active()}
            text = exposition(engine.metrics, gauges, engine.cost.prices.cost_s,
                              engine.slot_views())
            return Response(text, media_type=CONTENT_TYPE_LATEST)

    return app


def _load_target(settings: LeadSettings, threads: int) -> Model:
    from shared.llama.load import RopeScaling, Tuning, init_numa
    from shared.llama.model import load_model  # the llama.cpp edge, imported only when needed

    if settings.offline:
        require_cached(settings.model)
    kv_types = CACHE_TYPES[settings.cache_type_k], CACHE_TYPES[settings.cache_type_v]
    more = Tuning(settings.threads_batch, settings.ubatch_size, settings.mmap, settings.mlock,
                  kv_types, settings.swa_full, rope=RopeScaling(**settings.rope()),
                  **settings.offload(), **settings.switches())
    if settings.numa:
        init_numa(settings.numa)
    model = load_model(settings.model, threads=threads, n_gpu_layers=settings.n_gpu_layers,
                       n_ctx=settings.slot_ctx, n_batch=settings.batch_size, rpc=settings.rpc,
                       tensor_split=settings.tensor_split, flash_attn=settings.flash_attn,
                       slots=settings.parallel, more=more)
    try:
        # auto: on where the template has a switch, as llama-server passes enable_thinking
        model.use_chat_template(chat_template(settings), settings.jinja,
                                settings.reasoning != "off")
    except ValueError as exc:
        raise ModelError(f"--chat-template: {exc}") from None
    return model


def _embedder(settings: LeadSettings, model: Model, given: Embedder | None,
              threads: int) -> Embedder | None:
    """--embeddings' embedder (None without it: its paths answer 501)."""
    if not settings.embeddings:
        return None
    if given is not None:
        return given
    return load_embedder(model, settings.pooling, settings.ubatch_size or settings.batch_size,
                         threads)


def chat_template(settings: LeadSettings) -> str | None:
    """--chat-template's text, or --chat-template-file's (None: the GGUF's own)."""
    if settings.chat_template_file:
        with open(settings.chat_template_file, encoding="utf-8") as f:
            return f.read()
    return settings.chat_template
