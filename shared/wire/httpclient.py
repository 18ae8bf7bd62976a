"""What every client of lead does with HTTP: address it, read its errors, read its streams.

Used by the back, chat, the benchmark and the tests, so that each reads lead the same way.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from httpx_sse import EventSource

LEAD_PORT = 5555  # lead's default --port: where a bare host is looked for


def lead_url(address: str) -> str:
    """`host[:port]` (port 5555 where none is given), `http://host:port/` or `https://...`
    -> a base URL without a trailing /. Whether any request can reach it: check_lead."""
    address = address.strip().rstrip("/")
    if "://" in address:
        return address  # a URL means what URLs mean: no port is the scheme's
    return f"http://{address}:{LEAD_PORT}" if _host_alone(address) else f"http://{address}"


def _host_alone(address: str) -> bool:
    """A host with no port, path, query or fragment (what lead's port is added to), read
    from the text: httpx reads "host:80" as no port at all (80 is http's own)."""
    if any(c in address for c in "/?#"):
        return False
    if address.startswith("["):  # an IPv6 address, [::1] or [::1]:port
        return address.endswith("]")
    return ":" not in address


def check_lead(address: str) -> str:
    """lead_url(address), or ValueError naming the address where no request could reach
    lead there: not http(s), no host, a bad port, a path, query or fragment."""
    url = lead_url(address)
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except httpx.InvalidURL as exc:
        raise ValueError(f"not a lead address: {address!r} ({exc})") from None
    if (parsed.scheme not in ("http", "https") or not parsed.host or len(address.split()) != 1
            or (port is not None and not 0 < port < 65536)):
        raise ValueError(f"not a lead address: {address!r} (expected host:port or "
                         "http(s)://host:port)")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise ValueError(f"not a lead address: {address!r} (lead's address has no path, "
                         "query or fragment: host:port or http(s)://host:port)")
    return url


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
