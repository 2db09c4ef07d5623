"""Pure-ASGI middleware: request ids, bearer-token auth, body-size limit, HTTP metrics.

Pure ASGI (not BaseHTTPMiddleware) keeps context variables and streaming intact and lets a 413 or 401
leave before the body is read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Sequence
from contextvars import ContextVar
from http import HTTPStatus

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trace_proto import PROBLEM_MEDIA_TYPE, ErrorResponse
from trace_proto.v1 import paths
from trace_service.metrics import UNMATCHED_ROUTE, Metrics, http_method_label

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="-")


def request_id_of(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", REQUEST_ID.get()))


async def _send_problem(
    send: Send, request_id: str, status: int, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    body = ErrorResponse(title=HTTPStatus(status).phrase, status=status, detail=detail, request_id=request_id)
    payload = json.dumps(body.model_dump(mode="json", exclude_none=True)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                (b"content-length", str(len(payload)).encode()),
                (paths.REQUEST_ID_HEADER.lower().encode(), request_id.encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class RequestContextMiddleware:
    """Take the caller's X-Request-ID (or make one), expose it to handlers and logs, echo it back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = paths.REQUEST_ID_HEADER.lower().encode()
        given = dict(scope["headers"]).get(header, b"").decode("latin-1")
        request_id = given if 0 < len(given) <= 128 and given.isprintable() else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        token = REQUEST_ID.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k != header]
                message["headers"] = [*headers, (header, request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)


class AuthMiddleware:
    """With tokens configured, every /v1/ call needs ``Authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, tokens: Sequence[str]) -> None:
        self.app = app
        self.digests = [hashlib.sha256(token.encode()).digest() for token in tokens]

    def _allowed(self, authorization: str) -> bool:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        digest = hashlib.sha256(token.strip().encode()).digest()
        return any(hmac.compare_digest(digest, known) for known in self.digests)  # no early exit on match

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.digests and scope["path"].startswith("/v1/"):
            authorization = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if not self._allowed(authorization):
                request_id = scope.get("state", {}).get("request_id", "-")
                await _send_problem(
                    send,
                    request_id,
                    401,
                    "missing or invalid bearer token",
                    [(b"www-authenticate", b"Bearer")],
                )
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse bodies over ``max_bytes`` with 413, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = scope.get("state", {}).get("request_id", "-")
        detail = f"request body exceeds {self.max_bytes} bytes; send smaller batches"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _send_problem(send, request_id, 413, detail)
            return
        received = 0
        response_started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not response_started:
                await _send_problem(send, request_id, 413, detail)


class _BodyTooLarge(Exception):
    pass


class MetricsMiddleware:
    """Time requests by route template (not raw path: tree ids would explode labels), method and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            self.metrics.http_duration.labels(
                http_request_method=http_method_label(scope["method"]),
                http_route=getattr(scope.get("route"), "path", UNMATCHED_ROUTE),
                http_response_status_code=str(status),
            ).observe(time.perf_counter() - start)
