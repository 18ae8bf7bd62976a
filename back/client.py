"""The back's HTTP client for lead's /duo protocol (transport injectable for tests).

Whatever lead answers becomes the protocol's model or a LeadError: an HTTP error, a body
that is not JSON, or JSON that is not the model (`BadAnswer`), never another exception.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx
from httpx_ws import (
    HTTPXWSException,
    WebSocketDisconnect,
    WebSocketNetworkError,
    WebSocketUpgradeError,
    aconnect_ws,
)
from pydantic import BaseModel, ValidationError

from shared.wire.httpclient import auth_headers, error_message, lead_url
from shared.wire.protocol import Grammar, Info

M = TypeVar("M", bound=BaseModel)


class LeadError(Exception):
    """Lead answered, but not with what the protocol promises (4xx/5xx)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class BadAnswer(LeadError):
    """A success whose body is not the protocol's: not JSON, or not the model expected."""


class LinkClosed(HTTPXWSException):
    """The link ended: lead closed it (`code`, e.g. 1013: too many links from this address
    for now), or it was closing as the back sent (`code` 0). Retried, as any outage."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


NOT_UPGRADED = (404, 405, 426)  # a plain GET reaching the link's route answers so
LINK_MESSAGE_BYTES = 16 << 20  # an update can carry several sessions' prompts


class LeadClient:
    def __init__(self, address: str, api_key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 kind: str = "") -> None:
        """`kind`: the drafter (model, ngram), told to lead for its page."""
        self.kind = kind
        self._http = httpx.AsyncClient(base_url=lead_url(address), headers=auth_headers(api_key),
                                       transport=transport, timeout=httpx.Timeout(5.0, read=20.0))

    @property
    def base_url(self) -> str:
        return str(self._http.base_url)

    async def close(self) -> None:
        await self._http.aclose()

    async def info(self) -> Info:
        return _model(Info, await self._http.get("/duo/info"))

    async def grammar(self, session_id: str) -> Grammar:
        """The session's grammar text (asked once per session: states carry its id)."""
        return _model(Grammar, await self._http.get("/duo/grammar",
                                                    params={"session": session_id}))

    @contextlib.asynccontextmanager
    async def link(self) -> AsyncIterator[Any]:
        """The link (GET /duo/link): an open WebSocket. LeadError where lead refuses it (or
        a proxy answers for a lead restarting), LinkClosed where it ends (lead closed it, or
        the connection broke)."""
        url = str(self._http.base_url).rstrip("/") + "/duo/link"
        try:
            async with aconnect_ws(url, self._http, max_message_size_bytes=LINK_MESSAGE_BYTES,
                                   keepalive_ping_interval_seconds=None) as ws:
                yield ws
        except BaseException as exc:  # (httpx-ws's task group wraps what ends it in a group)
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # the group may hold the closing's
                raise asyncio.CancelledError from None  # errors first: cancelled, not failed
            raise _link_error(exc) from None


def _model(model: type[M], response: httpx.Response) -> M:
    if response.status_code >= 400:
        raise LeadError(f"lead answered {response.status_code}: {error_message(response)}",
                        response.status_code)
    path = response.request.url.path
    try:
        return model.model_validate(response.json())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise BadAnswer(f"{path} answered {response.status_code} with no {model.__name__} "
                        f"({where or 'body'}: {first.get('msg')})", response.status_code) \
            from None
    except ValueError:  # not JSON
        raise BadAnswer(f"{path} answered {response.status_code} with no JSON "
                        f"({response.headers.get('content-type', 'no content type')})",
                        response.status_code) from None


def _link_error(exc: BaseException) -> BaseException:
    """What ended the link (the first of a group's, nested groups looked into), said
    briefly: lead's close (logged as "lead closed the link (1013: too many links ...)"), its
    connection lost (whose own message is its class's name), or lead refusing it."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    if isinstance(exc, WebSocketNetworkError):
        return LinkClosed("the link's connection broke")
    if isinstance(exc, WebSocketDisconnect):
        return LinkClosed(f"{exc.code}: {exc.reason}" if exc.reason else str(exc.code), exc.code)
    if not isinstance(exc, WebSocketUpgradeError):
        return exc
    status = exc.response.status_code
    hint = ": a proxy between may not pass WebSockets on" if status in NOT_UPGRADED else ""
    return LeadError(f"lead refused the link ({status}){hint}", status)
