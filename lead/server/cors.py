"""Which web pages may call lead from a browser (--cors-origins), answered as llama-server
answers: a preflight from a page not allowed gets 200 without Access-Control-Allow-Origin
(the browser then refuses the call), the methods lead serves, any header."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse, Response

LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"
LOCAL_NAMES = {"local", "localhost"}  # lead's name for pages on this machine, llama-server's
METHODS = ["GET", "POST", "DELETE", "OPTIONS"]


def cors_options(origins: str) -> dict[str, Any]:
    """The middleware's options for --cors-origins: 'local', '*', '' or a list."""
    listed = [o.strip().rstrip("/") for o in origins.split(",") if o.strip()]
    local = bool(LOCAL_NAMES & set(listed))
    listed = [o for o in listed if o not in LOCAL_NAMES]
    return {"allow_origins": listed, "allow_origin_regex": LOCAL_ORIGINS if local else None,
            "allow_methods": METHODS, "allow_headers": ["*"], "allow_credentials": True,
            "max_age": 600}


class Cors(CORSMiddleware):
    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if self.allow_all_headers:  # "*", as llama-server says, not the headers echoed
            response.headers["Access-Control-Allow-Headers"] = "*"
        if response.status_code == 400 and not self.is_allowed_origin(request_headers["origin"]):
            return PlainTextResponse("", status_code=200, headers={
                k: v for k, v in response.headers.items()
                if k.lower() not in ("access-control-allow-origin", "content-length",
                                     "content-type", "access-control-allow-credentials")})
        return response

