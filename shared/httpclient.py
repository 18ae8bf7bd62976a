"""What every client of lead does with HTTP: address it, read its errors, read its streams.

Used by the back, chat, the benchmark and the tests, so that each reads lead the same way.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from httpx_sse import EventSource


def lead_url(address: str) -> str:
    """`host:port`, `http://host:port/` or `https://...` -> a base URL without a trailing /."""
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def error_message(response: httpx.Response) -> str:
    """The message of lead's `{"error": {"message": ...}}` body, or the start of the text."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def retry_after(response: httpx.Response, default: float = 1.0) -> float:
    value = response.headers.get("retry-after", "")
    return float(value) if value.isdigit() else default


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON events of an OpenAI-style stream, up to `data: [DONE]` (httpx_sse.SSEError
    where the response is no event stream, ValueError where an event is no JSON)."""
    for event in EventSource(response).iter_sse():
        if event.data == "[DONE]":
            return
        yield json.loads(event.data)


async def asse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """sse_events for an async client's response."""
    async for event in EventSource(response).aiter_sse():
        if event.data == "[DONE]":
            return
        yield json.loads(event.data)
