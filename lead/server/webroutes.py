"""The web page (GET /, static files under /web/) and its live feed (GET /duo/live).

The page and its files are open, so that a browser can load them and then ask for the
key; /duo/live, like every data endpoint, is behind the key. The feed is server-sent
events: a snapshot (live.py) whenever something it shows changes, a comment
otherwise every HEARTBEAT_S, so that proxies and the page see a live connection.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles

from lead.backs.registry import BackRegistry
from lead.decode.engine import Engine
from lead.server.live import LiveNews, snapshot

WEB_DIR = Path(__file__).with_name("web")
STATIC_PREFIX = "/web/"
HEARTBEAT_S = 15.0
# Everything the page loads is its own: no inline script or style, no other origin.
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                "frame-ancestors 'none'", "Cache-Control": "no-cache"}


def mount_web(app: FastAPI, engine: Engine, live: LiveNews, backs: BackRegistry,
              page: bool = True) -> None:
    """The live stream (`live`: what wakes it, the replies it shows; `backs`: those the
    panel lists), and the page at / unless `page` is False (--no-webui)."""
    if page:
        app.mount(STATIC_PREFIX.rstrip("/"), StaticFiles(directory=WEB_DIR), name="web")
    app.include_router(_router(engine, live, backs, page))


def _router(engine: Engine, live: LiveNews, backs: BackRegistry, page: bool) -> APIRouter:
    router = APIRouter(include_in_schema=False)  # an endless stream is no case for a fuzzer

    if page:
        @router.api_route("/", methods=["GET", "HEAD"])  # HEAD: clients' preconnect
        async def index() -> FileResponse:
            return FileResponse(WEB_DIR / "index.html", headers=PAGE_HEADERS)

    @router.get("/duo/live")
    async def live_stream() -> StreamingResponse:
        return StreamingResponse(live_events(engine, live, backs),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    return router


def live_snapshot(engine: Engine, live: LiveNews, backs: BackRegistry) -> dict[str, Any]:
    return snapshot(model=engine.model.name, busy=engine.busy, slots=engine.slot_views(),
                    waiting=engine.admission.waiting,
                    cost=engine.cost, metrics=engine.metrics,
                    backs=backs.connected(), replies=live.replies,
                    now=time.monotonic(), version=live.version)


async def live_events(engine: Engine, live: LiveNews, backs: BackRegistry,
                      heartbeat_s: float = HEARTBEAT_S
                      ) -> AsyncIterator[str]:
    """A snapshot now and after every change; a back falling silent is a change noticed at
    the next heartbeat. Ends when lead shuts down (or, by cancellation, when the client
    leaves)."""
    shown = None
    while not live.closed:
        version = live.version
        seen = (version, sorted(backs.connected()))
        if seen != shown:
            shown = seen
            yield f"data: {json.dumps(live_snapshot(engine, live, backs))}\n\n"
        else:
            yield ": nothing new\n\n"
        await live.wait(version, heartbeat_s)
