"""Operational safeguards around the routes, as plain ASGI middleware (no per-request task, so a
streamed response and the route share one task and its context).

Outermost first: RequestContext (X-Request-Id, the access log line, 503 while draining, a JSON
500 for an exception nobody handled), CORS when origins are configured, then Guard (/debug/* only
when enabled, the API key, the body-size limit). Drainer holds the shutdown state that the
SIGTERM handler (shutdown.py) drives.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deepinfer.server.errors import error_response

log = logging.getLogger("deepinfer.server")

# The current request's id, for log lines written anywhere below the middleware.
REQUEST_ID: ContextVar[str] = ContextVar("deepinfer_request_id", default="-")


def _client_request_id(value: str | None) -> str | None:
    """A client's X-Request-Id when it is safe to echo and to log (short, visible ASCII)."""
    if value and len(value) <= 128 and all(33 <= ord(c) < 127 for c in value):
        return value
    return None


class Drainer:
    """Shutdown state: how many requests are in flight and whether new ones are turned away."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.draining = False
        self.in_flight = 0

    async def _wait_idle(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def drain(self, abort_all: Callable[[], int]) -> None:
        """New requests get 503 from now on; in-flight ones get `timeout` seconds to finish, then
        their engine requests are aborted, which ends each with its finish (reason "abort")."""
        self.draining = True
        log.info("draining: %d requests in flight, %.1f s to finish", self.in_flight, self.timeout)
        await self._wait_idle(self.timeout)
        if self.in_flight:
            aborted = abort_all()
            log.warning("drain timeout: aborted %d engine requests", aborted)
            # An aborted request finishes at the engine's next step; let its response end.
            await self._wait_idle(5.0)


class RequestContext:
    def __init__(self, app: ASGIApp, drainer: Drainer) -> None:
        self.app = app
        self.drainer = drainer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        rid = _client_request_id(headers.get("x-request-id")) or uuid.uuid4().hex
        token = REQUEST_ID.set(rid)
        path = scope["path"]
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                kept = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                message["headers"] = [*kept, (b"x-request-id", rid.encode())]
            await send(message)

        started = time.perf_counter()
        try:
            if self.drainer.draining:
                response = error_response(path, 503, "the server is shutting down")
                response.headers["connection"] = "close"
                await response(scope, receive, send_with_id)
                return
            self.drainer.in_flight += 1
            try:
                await self.app(scope, receive, send_with_id)
            except Exception:
                log.exception("request %s %s %s failed", rid, scope["method"], path)
                if status == 0:  # nothing sent yet: the client still gets a parseable error
                    response = error_response(path, 500, f"internal server error (request {rid})")
                    await response(scope, receive, send_with_id)
            finally:
                self.drainer.in_flight -= 1
        finally:
            ms = 1000 * (time.perf_counter() - started)
            log.info("%s %s %s %d %.1f ms", rid, scope["method"], path, status, ms)
            REQUEST_ID.reset(token)


class Guard:
    """/debug/* only when enabled, the API key, and the body-size limit."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        public_metrics: bool,
        debug_endpoints: bool,
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.open_paths = {"/health"} | ({"/metrics"} if public_metrics else set())
        self.debug_endpoints = debug_endpoints
        self.max_body_bytes = max_body_bytes

    def _authorized(self, headers: Headers) -> bool:
        assert self.api_key is not None
        bearer = headers.get("authorization", "")
        offered = bearer[7:] if bearer[:7].lower() == "bearer " else headers.get("x-api-key", "")
        # Constant time: how much of a guess matches must not show in the response time.
        return hmac.compare_digest(offered.strip().encode(), self.api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        headers = Headers(scope=scope)
        rejection = None
        if not self.debug_endpoints and (path == "/debug" or path.startswith("/debug/")):
            rejection = error_response(path, 404, f"no route {scope['method']} {path}")
        elif (
            self.api_key is not None
            and path not in self.open_paths
            and not self._authorized(headers)
        ):
            rejection = error_response(
                path, 401, "invalid or missing API key", {"www-authenticate": "Bearer"}
            )
        if rejection is None and "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                length = -1
            if length < 0:
                rejection = error_response(path, 400, "invalid Content-Length")
            elif length > self.max_body_bytes:
                rejection = self._too_large(path)
        if rejection is not None:
            # The body is never read: uvicorn closes the connection rather than drain it.
            await rejection(scope, receive, send)
            return
        await self.app(scope, self._limited(receive), send)

    def _too_large(self, path: str) -> Any:
        return error_response(path, 413, f"request body over {self.max_body_bytes} bytes")

    def _limited(self, receive: Receive) -> Receive:
        """A chunked body (no Content-Length) is counted as it arrives and cut off at the limit."""
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise HTTPException(413, f"request body over {self.max_body_bytes} bytes")
            return message

        return limited


def install_safeguards(app: FastAPI, config: Any) -> Drainer:
    """Adds the middleware (the last added runs first) and returns the drain state."""
    drainer = Drainer(config.shutdown_timeout)
    app.add_middleware(
        Guard,
        api_key=config.api_key,
        public_metrics=config.public_metrics,
        debug_endpoints=config.enable_debug_endpoints,
        max_body_bytes=config.max_body_bytes,
    )
    if config.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.allowed_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["x-request-id"],
        )
    app.add_middleware(RequestContext, drainer=drainer)
    return drainer
