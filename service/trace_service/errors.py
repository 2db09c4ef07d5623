"""One error shape for every failure (RFC 9457 problem details plus the request id)."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from trace_proto import PROBLEM_MEDIA_TYPE, ErrorItem, ErrorResponse
from trace_service.engine import NotFoundError, StoreFullError
from trace_service.middleware import request_id_of

logger = logging.getLogger(__name__)

#: Seconds a client should wait before retrying while the store is unreachable.
STORE_RETRY_AFTER = 2
#: Seconds a client should wait before allocating again while the store is full.
STORE_FULL_RETRY_AFTER = 60


def problem(
    request_id: str,
    status: int,
    detail: str,
    *,
    errors: list[ErrorItem] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(
        title=HTTPStatus(status).phrase, status=status, detail=detail, request_id=request_id, errors=errors
    )
    return JSONResponse(
        body.model_dump(mode="json", exclude_none=True),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


def validation_items(raw_errors: Any) -> list[ErrorItem]:
    """Pydantic's error list as ErrorItems (locations as strings and indices, messages as written)."""
    return [
        ErrorItem(
            loc=[part if isinstance(part, int) else str(part) for part in error["loc"]],
            msg=error["msg"],
            type=error["type"],
        )
        for error in raw_errors
    ]


def install_error_handlers(app: FastAPI) -> None:
    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers) if exc.headers else None
        return problem(request_id_of(request), exc.status_code, str(exc.detail), headers=headers)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        items = validation_items(exc.errors())
        detail = "; ".join(f"{'.'.join(map(str, item.loc))}: {item.msg}" for item in items[:5])
        return problem(request_id_of(request), 422, detail or "invalid request", errors=items)

    async def on_not_found(request: Request, exc: Exception) -> JSONResponse:
        return problem(request_id_of(request), 404, str(exc))

    async def on_value_error(request: Request, exc: Exception) -> JSONResponse:
        return problem(request_id_of(request), 422, str(exc))

    async def on_store_error(request: Request, exc: Exception) -> JSONResponse:
        route = getattr(request.scope.get("route"), "path", "unmatched")
        request.app.state.metrics.store_errors.labels(route).inc()
        logger.warning("store unavailable: %s", exc)
        return problem(
            request_id_of(request),
            503,
            f"the tree store is unavailable; retry in {STORE_RETRY_AFTER} s",
            headers={"Retry-After": str(STORE_RETRY_AFTER)},
        )

    async def on_store_full(request: Request, exc: Exception) -> JSONResponse:
        logger.warning("new work refused: %s", exc)
        return problem(
            request_id_of(request), 503, str(exc), headers={"Retry-After": str(STORE_FULL_RETRY_AFTER)}
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=exc)
        return problem(request_id_of(request), 500, "internal error; quote the request id when reporting it")

    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(NotFoundError, on_not_found)
    app.add_exception_handler(ValueError, on_value_error)
    app.add_exception_handler(RedisError, on_store_error)
    app.add_exception_handler(StoreFullError, on_store_full)
    app.add_exception_handler(Exception, on_unexpected)
