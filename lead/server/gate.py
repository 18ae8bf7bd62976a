"""What every request passes before routing: the Host check, the body size limit and the keys.

A plain ASGI middleware, the cheapest kind: a back polls and posts several times per token
to a lead whose cores llama.cpp may be using.

The Host check: a lead with no API key trusts whoever reaches it, and on loopback that is
meant to be this machine only. A web page elsewhere can still reach it through the
browser here by DNS rebinding (its own name made to resolve to 127.0.0.1); such requests
arrive on loopback with the page's name as Host. So a keyless lead answers a request that
arrived on a loopback address only if its Host names loopback. The check looks at where
the connection arrived (the ASGI scope's `server`, the socket's own address), not at
--host: a lead on 0.0.0.0 is checked on its loopback side too, and an in-process
transport (tests) has no socket and nothing to check.
"""

from __future__ import annotations

import ipaddress

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lead.backs.keys import Keys
from lead.server.errors import error_response
from lead.server.webroutes import STATIC_PREFIX

LOOPBACK_NAMES = ("localhost",)
BACK_PREFIX = "/duo/"  # the back protocol's routes: the back key is good there too


class Gate:
    OPEN = ("/health", "/docs", "/redoc", "/openapi.json", "/")  # and the page's files

    def __init__(self, app: ASGIApp, limit: int, keys: Keys) -> None:
        self.app, self.limit, self.keys = app, limit, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] in ("http", "websocket") else None
        if refusal is not None and scope["type"] == "websocket":
            await _refuse_socket(receive, send, refusal)
            return
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if scope["type"] == "http" and not header(scope, b"content-length"):
            receive = self._counted(receive)  # a chunked body: no length to check up front
        await self.app(as_json(scope), receive, send)

    def _counted(self, receive: Receive) -> Receive:
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:  # FastAPI lets an HTTPException from its body read through
                raise StarletteHTTPException(413, f"request body over {self.limit} bytes")
            return message
        return counted

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        path = scope["path"]
        if self.keys.api_key is None and arrived_on_loopback(scope) and \
                not names_loopback(header(scope, b"host")):
            return _host_refusal(path, header(scope, b"host"))
        length = header(scope, b"content-length") or b"0"  # chunked: counted as read
        if not length.isdigit() or int(length) > self.limit:
            return error_response(path, 413, f"request body over {self.limit} bytes")
        if path in self.OPEN or path.startswith(STATIC_PREFIX) or \
                self.keys.admits(authorization(scope), back_route=path.startswith(BACK_PREFIX)):
            return None
        message = "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)"
        return error_response(path, 401, message)


async def _refuse_socket(receive: Receive, send: Send, refusal: JSONResponse) -> None:
    """Refuse a WebSocket before it opens: the handshake is answered 403 (a close before
    accepting), the reason in the close frame where the server sends one."""
    await receive()  # websocket.connect
    reason = refusal.body.decode("utf-8", "replace")[:120]  # a close reason holds 123 bytes
    await send({"type": "websocket.close", "code": 1008, "reason": reason})


def _host_refusal(path: str, host: bytes | None) -> JSONResponse:
    shown = host.decode("latin-1") if host else "(none)"
    message = (f"lead has no API key, so it answers only requests addressed to this machine "
               f"(Host 127.0.0.1, localhost or [::1]); this one's Host is {shown}, which a "
               "web page could use to reach lead through your browser (DNS rebinding). "
               "Address lead as 127.0.0.1, or start it with --api-key KEY (then any Host is "
               "answered; to serve other machines add --host 0.0.0.0)")
    return error_response(path, 403, message)


def header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k == name), None)


def authorization(scope: Scope) -> bytes:
    """The request's key as an Authorization value: its own, or `x-api-key` (Anthropic's
    clients send the key so) as a bearer token."""
    given = header(scope, b"authorization")
    if given:
        return given
    key = header(scope, b"x-api-key")
    return b"Bearer " + key if key else b""


def as_json(scope: Scope) -> Scope:
    """A POST whose body curl sent with -d alone (form-typed, or no type) read as JSON, as
    llama-server reads every body; from a browser (an Origin) not: a page may send a form
    to any address without asking first, JSON only after a preflight that CORS governs."""
    if scope["type"] != "http" or scope.get("method") != "POST" or header(scope, b"origin") \
            or header(scope, b"content-type") not in (None, b"application/x-www-form-urlencoded"):
        return scope
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


def arrived_on_loopback(scope: Scope) -> bool:
    """Whether the connection came in on a loopback address of this machine."""
    server = scope.get("server")
    return server is not None and is_loopback(str(server[0]))


def is_loopback(address: str) -> bool:
    """An IP address (IPv4 mapped into IPv6 too) of loopback, or "localhost"."""
    if address.lower().rstrip(".") in LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def names_loopback(host: bytes | None) -> bool:
    """Whether a Host header (with or without a port) names loopback."""
    if not host:
        return False
    name = host.decode("latin-1").strip()
    if name.startswith("["):  # [::1] or [::1]:5555
        return is_loopback(name[1:name.find("]")]) if "]" in name else False
    return is_loopback(name.rsplit(":", 1)[0] if name.count(":") == 1 else name)


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A line to log at startup where lead listens beyond loopback with no key."""
    if api_key or is_loopback(host):
        return None
    return (f"WARNING: listening on {host} with no API key: anyone who reaches this port "
            "can use lead, and a web page can reach it through a browser that can. Give "
            "--api-key KEY (LEAD_API_KEY), or listen on 127.0.0.1 (the default).")
