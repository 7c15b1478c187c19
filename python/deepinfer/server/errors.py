"""Errors in the calling protocol's own shape, whatever produced them: unknown routes (404), wrong
methods (405), oversized bodies (413), bodies nested too deeply to parse (400), unexpected
exceptions (500). Clients built on the official SDKs parse these bodies, so a plain-text error
would surface to them as an opaque failure."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deepinfer.server.protocols import CHAT, MESSAGES, RESPONSES, Protocol

log = logging.getLogger("deepinfer.server")

# Anthropic names each error status (https://docs.anthropic.com/en/api/errors).
ANTHROPIC_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
OPENAI_KINDS = {401: "invalid_api_key", 404: "not_found_error", 503: "server_overloaded"}


def protocol_for_path(path: str) -> Protocol:
    if path.startswith("/v1/messages"):
        return MESSAGES
    if path.startswith("/v1/responses"):
        return RESPONSES
    return CHAT  # OpenAI's shape for everything else


def error_body(path: str, status: int, message: str) -> dict:
    protocol = protocol_for_path(path)
    kinds = ANTHROPIC_KINDS if protocol.anthropic_errors else OPENAI_KINDS
    return protocol.error_body(status, message, kinds.get(status))


def error_response(
    path: str, status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(path, status, message), status_code=status, headers=headers)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    return error_response(request.url.path, exc.status_code, message, exc.headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(request.url.path, 400, f"invalid request: {exc.errors()}")


async def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
    # json.loads raises RecursionError on deeply nested arrays/objects: the client's fault.
    return error_response(request.url.path, 400, "invalid request body: JSON nested too deeply")


def install_error_handlers(app: FastAPI) -> None:
    """Protocol-shaped bodies for errors raised inside routes. Exceptions no handler claims are
    turned into a JSON 500 by RequestContext (safeguards.py), outside every other middleware."""
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(RecursionError, _too_deep)
