"""Request bodies validated from their bytes, none of them holding the event loop for long.

A small body is validated as a whole, on the loop (a thread hand-off would cost more).  A large one is
validated in a worker thread and in parts: its structure is read in linear time
(:mod:`trace_service.parsing.structure`), then each element of its one large array (the prompts, the
histories, the events) is validated on its own, then the request around them.  Many short calls let
the loop take the interpreter back between them, where one call over the whole body would hold it for
as long as the body takes to parse (a third of a second for 20 MB of numbers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

import pydantic_core
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, TypeAdapter, ValidationError, create_model

from trace_service.parsing.structure import Structure, TooManyElements

Model = TypeVar("Model", bound=BaseModel)
Result = TypeVar("Result")

#: Bodies up to this size are validated on the loop, as a whole: at most a few milliseconds.
INLINE_BODY_BYTES = 1 << 20
#: Bytes of a large body outside its one large array: a request's other members are a few scalars.
MAX_HEAD_BYTES = 64 << 10


class BodyErrors(ValueError):
    """What is wrong with a large body read in parts, as pydantic's error list (``errors()``)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(str(error["msg"]) for error in errors))
        self._errors = errors

    @classmethod
    def one(cls, message: str, loc: tuple[str | int, ...] = (), kind: str = "body_shape") -> BodyErrors:
        return cls([{"type": kind, "loc": loc, "msg": message, "input": None}])

    def errors(self) -> list[dict[str, Any]]:
        return self._errors


class Parts:
    """A large body read in parts: the raw text of each element of its array member ``name``, and the
    other members' raw texts by name."""

    def __init__(self, body: bytes, name: str, limit: int) -> None:
        structure = Structure(body)
        members = structure.object_members()
        if members is None:
            raise BodyErrors.one("body must be one JSON object of distinct members")
        key = f'"{name}"'.encode()
        head = {k: v for k, v in members.items() if k != key}
        if sum(end - start for start, end in head.values()) > MAX_HEAD_BYTES:
            raise BodyErrors.one(f"members other than {name!r} exceed {MAX_HEAD_BYTES} bytes")
        self.head: dict[str, bytes] = {
            pydantic_core.from_json(k): body[start:end] for k, (start, end) in head.items()
        }
        self.elements: list[bytes] | None = None
        if key in members:
            try:
                spans = structure.array_elements(members[key], limit)
            except TooManyElements as error:
                message = f"List should have at most {error.limit} items after validation, not {error.count}"
                raise BodyErrors.one(message, (name,), "too_long") from None
            if spans is None:
                raise BodyErrors.one("Input should be a valid list", (name,), "list_type")
            self.elements = [body[start:end] for start, end in spans]


@cache
def _head_model(model: type[BaseModel], name: str) -> type[BaseModel]:
    """``model`` without its field ``name``: the members around the large array, validated from JSON
    (so that every field is read as the whole model reads it)."""
    fields: dict[str, Any] = {
        field: (info.annotation, info) for field, info in model.model_fields.items() if field != name
    }
    return create_model(f"{model.__name__}Head", __config__=model.model_config, **fields)


@cache
def _element_adapter(model: type[BaseModel], name: str) -> TypeAdapter[Any]:
    """A validator of one element of ``model``'s list field ``name``."""
    (element,) = model.model_fields[name].annotation.__args__  # type: ignore[union-attr]
    return TypeAdapter(element)


def validate_in_parts(body: bytes, model: type[Model], name: str) -> Model:
    """``model`` from a large body whose list field ``name`` holds most of it: element by element,
    then the members around them, then the whole (its own checks across the elements).  Raises a
    ValidationError-like error whose locations match a whole-body validation's."""
    limit = _max_length(model, name)
    parts = Parts(body, name, limit)
    errors: list[dict[str, Any]] = []
    items: list[Any] = []
    adapter = _element_adapter(model, name)
    for index, raw in enumerate(parts.elements or []):
        try:
            items.append(adapter.validate_json(raw))
        except ValidationError as error:
            errors.extend({**e, "loc": (name, index, *e["loc"])} for e in error.errors(include_url=False))
    head_json = b"{" + b",".join(pydantic_core.to_json(k) + b":" + v for k, v in parts.head.items()) + b"}"
    try:
        head = _head_model(model, name).model_validate_json(head_json)
    except ValidationError as error:
        errors.extend(dict(e) for e in error.errors(include_url=False))
        head = None
    if parts.elements is None:
        errors.append({"type": "missing", "loc": (name,), "msg": "Field required", "input": None})
    if errors or head is None:
        raise BodyErrors(errors)
    fields = {field: getattr(head, field) for field in type(head).model_fields}
    return model.model_validate({**fields, name: items})


def _max_length(model: type[BaseModel], name: str) -> int:
    for constraint in model.model_fields[name].metadata:
        if (length := getattr(constraint, "max_length", None)) is not None:
            return int(length)
    raise TypeError(f"{model.__name__}.{name} has no max_length")


async def parsed(body: bytes, parse: Callable[[bytes], Result]) -> Result:
    """``parse(body)``: in a worker thread when the body is over ``INLINE_BODY_BYTES``."""
    if len(body) > INLINE_BODY_BYTES:
        return await asyncio.to_thread(parse, body)
    return parse(body)


async def validated(request: Request, model: type[Model], array: str) -> Model:
    """The body as ``model``, whose list field ``array`` holds most of a large body; a validation
    error is the usual 422 (locations under ``body``)."""
    body = await request.body()
    try:
        if len(body) <= INLINE_BODY_BYTES:
            return model.model_validate_json(body)
        return await asyncio.to_thread(validate_in_parts, body, model, array)
    except (ValidationError, BodyErrors) as error:
        errors = [
            {**item, "loc": ("body", *item["loc"])}
            for item in (
                error.errors(include_url=False) if isinstance(error, ValidationError) else error.errors()
            )
        ]
        raise RequestValidationError(errors) from None


def documented(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route that reads its body with :func:`validated`."""
    reference = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": reference}}}}
