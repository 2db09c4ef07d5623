"""Request bodies validated from their bytes; a large one beside the event loop, not on it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)
Result = TypeVar("Result")

#: Bodies up to this size are validated on the loop: the thread hand-off would cost more than they do.
INLINE_BODY_BYTES = 1 << 20


async def parsed(body: bytes, parse: Callable[[bytes], Result]) -> Result:
    """``parse(body)``: in a worker thread when the body is over ``INLINE_BODY_BYTES``."""
    if len(body) > INLINE_BODY_BYTES:
        return await asyncio.to_thread(parse, body)
    return parse(body)


async def validated(request: Request, model: type[Model]) -> Model:
    """The body as ``model``; a validation error is the usual 422 (locations under ``body``)."""
    try:
        return await parsed(await request.body(), model.model_validate_json)
    except ValidationError as error:
        errors = [{**item, "loc": ("body", *item["loc"])} for item in error.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def documented(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route that reads its body with :func:`validated`."""
    reference = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": reference}}}}
