"""The error responses every route documents (one body shape: ErrorResponse), and large responses
serialised in parts."""

from __future__ import annotations

from functools import cache
from typing import Any

from fastapi import Response
from pydantic import BaseModel, TypeAdapter

from trace_proto import PROBLEM_MEDIA_TYPE, ErrorResponse
from trace_service.offload import off_loop

_PROBLEM = {"model": ErrorResponse, "content": {PROBLEM_MEDIA_TYPE: {}}}

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {**_PROBLEM, "description": "Missing or invalid bearer token"},
    413: {**_PROBLEM, "description": "Request body too large"},
    422: {**_PROBLEM, "description": "Invalid request"},
    503: {**_PROBLEM, "description": "Tree store unavailable; retry after Retry-After seconds"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {**_PROBLEM, "description": "Unknown tree or job"}}

#: List elements serialised per call: each call holds the interpreter for a few milliseconds at most.
_ELEMENTS_PER_CALL = 2048


@cache
def _list_adapter(model: type[BaseModel], name: str) -> TypeAdapter[Any]:
    return TypeAdapter(model.model_fields[name].annotation or Any)


def dump_in_parts(model: BaseModel, name: str) -> bytes:
    """``model`` as JSON, its list field ``name`` (the last field) serialised a slice at a time: the
    same bytes as ``model_dump_json()``, from many short calls instead of one long one."""
    fields = type(model).model_fields
    if list(fields)[-1] != name:
        raise ValueError(f"{type(model).__name__}.{name} is not its last field")
    adapter = _list_adapter(type(model), name)
    items = getattr(model, name)
    parts = [
        adapter.dump_json(items[start : start + _ELEMENTS_PER_CALL])[1:-1]
        for start in range(0, len(items), _ELEMENTS_PER_CALL)
    ]
    head = model.model_dump_json(exclude={name}).encode()[:-1]
    separator = b"," if len(head) > 1 else b""
    return head + separator + f'"{name}":['.encode() + b",".join(parts) + b"]}"


async def json_in_parts(model: BaseModel, name: str) -> Response:
    """A JSON response of ``model`` serialised by :func:`dump_in_parts`, beside the loop when large."""
    body = await off_loop(len(getattr(model, name)), dump_in_parts, model, name)
    return Response(body, media_type="application/json")
