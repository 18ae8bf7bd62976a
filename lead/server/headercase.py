"""Response header names as llama-server (cpp-httplib) writes them: `Content-Type`, not
Starlette's `content-type`. HTTP's names are case-insensitive, but clients that copy the
headers into a plain dict (as llama.cpp's server tests do) look them up as written."""

from __future__ import annotations

from email.utils import formatdate

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# names whose usual form is not each word capitalised
IRREGULAR = {b"www-authenticate": b"WWW-Authenticate", b"etag": b"ETag", b"te": b"TE"}


def canonical(name: bytes) -> bytes:
    """`content-type` -> `Content-Type`."""
    lower = name.lower()
    return IRREGULAR.get(lower) or b"-".join(w[:1].upper() + w[1:] for w in lower.split(b"-"))


def with_canonical_headers(app: ASGIApp) -> ASGIApp:
    """`app` whose responses' header names are canonical, with a `Date` (uvicorn's own
    default headers, written lower-case after the app, are turned off: serve.py)."""
    async def canonical_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)

        async def send_canonical(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(canonical(k), v) for k, v in message.get("headers", [])]
                if not any(k == b"Date" for k, _ in headers):
                    headers.append((b"Date", formatdate(usegmt=True).encode()))
                message = {**message, "headers": headers}
            await send(message)
        await app(scope, receive, send_canonical)
    return canonical_app
