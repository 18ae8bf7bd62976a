"""What every client of lead does with HTTP: address it, read its errors, read its streams.

Used by the back, chat, the benchmark and the tests, so that each reads lead the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import httpx


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


def sse_events(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON events of an OpenAI-style stream (`data: {...}` lines, up to `data: [DONE]`)."""
    for line in lines:
        if line == "data: [DONE]":
            return
        if line.startswith("data: "):
            yield json.loads(line[6:])
