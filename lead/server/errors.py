"""Errors in the shape of the API asked: OpenAI's, or Anthropic's under /v1/messages."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lead.apis import anthropic, shapes
from lead.apis.renames import field_path, validation_message

ANTHROPIC_PATH = "/v1/messages"
# OpenAI's error types; 501: llama-server's, for an endpoint it was not started to serve
KINDS = {401: "authentication_error", 403: "permission_error", 500: "server_error",
         501: "not_supported_error"}


def error_response(path: str, status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None, code: str | None = None
                   ) -> JSONResponse:
    if path.startswith(ANTHROPIC_PATH):
        return JSONResponse(anthropic.error_body(status, message), status_code=status,
                            headers=headers)
    kind = KINDS.get(status, "invalid_request_error")
    return JSONResponse(shapes.error_body(message, kind, code=code, param=param),
                        status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """A body that fails validation is a 400 naming its first bad field; every HTTP
    error keeps its status and gets the API's shape."""
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        if first.get("type") == "json_invalid":
            at = next((p for p in first.get("loc", ()) if isinstance(p, int)), None)
            reason = (first.get("ctx") or {}).get("error") or first.get("msg")
            return error_response(request.url.path, 400, f"the body is not valid JSON: "
                                  f"{reason}" + (f" (at character {at})" if at is not None else ""))
        if tuple(first.get("loc", ())) == ("body",) and first.get("type") != "value_error":
            return error_response(request.url.path, 400, _not_an_object(request, first))
        where = field_path(first.get("loc", ()))
        said = validation_message(first)
        message = f"{where}: {said}" if where else said
        return error_response(request.url.path, 400, message, where or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if isinstance(exc, shapes.ContextExceeded):
            if request.url.path.startswith(ANTHROPIC_PATH):
                message = exc.anthropic_message()
            else:
                return context_exceeded(exc)
        return error_response(request.url.path, exc.status_code, message,
                              getattr(exc, "param", None), getattr(exc, "headers", None),
                              getattr(exc, "code", None))


def context_exceeded(exc: shapes.ContextExceeded) -> JSONResponse:
    """OpenAI's code (agents compact on it) in llama-server's type, with its counts."""
    body = shapes.error_body(str(exc.detail), "exceed_context_size_error", exc.code, exc.param)
    body["error"].update(n_prompt_tokens=exc.n_prompt, n_ctx=exc.n_ctx)
    return JSONResponse(body, status_code=exc.status_code)


def _not_an_object(request: Request, error: dict) -> str:
    """Why a body is no JSON object: curl's -d sends a form's content type, say so."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind and not kind.endswith("json"):
        return f"the body is sent as {kind}; send JSON, as Content-Type: application/json"
    return f"the body is empty or not a JSON object: {error.get('msg')}"
