from __future__ import annotations

import re

import pydantic_core
from fastapi import APIRouter, HTTPException, Request
from pydantic import ValidationError

from trace_proto import (
    EventStatus,
    ExpandEvent,
    ExpandRequest,
    ExpandResponse,
    InstructionsResponse,
    RejectedEvent,
)
from trace_proto.v1 import limits, paths
from trace_proto.v1.common import JobName
from trace_service.deps import InstructionsDep, IntakeDep
from trace_service.routers.body import documented, parsed
from trace_service.routers.responses import ERRORS

router = APIRouter(tags=["expansion"])

#: A JSON string, or one of the structural characters outside strings.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]', re.DOTALL)
_SHAPE = 'body must be a JSON object {"events": [event, ...]} and nothing else'


def event_elements(body: bytes) -> list[bytes] | None:
    """The raw text of each element of ``events`` in a body shaped ``{"events": [...]}``, or None for
    any other shape.  Only the structure around the elements is read (iteratively, strings skipped
    whole): whatever one element holds, however deep, it is that element's problem alone."""
    tokens = iter(_TOKEN.finditer(body))
    position = 0

    def next_token(expected: bytes) -> bool:
        nonlocal position
        token = next(tokens, None)
        if token is None or token.group() != expected or body[position : token.start()].strip():
            return False
        position = token.end()
        return True

    if not (next_token(b"{") and next_token(b'"events"') and next_token(b":") and next_token(b"[")):
        return None
    elements: list[bytes] = []
    depth, start = 0, position
    for token in tokens:
        mark = token.group()
        if mark in (b"{", b"["):
            depth += 1
        elif mark in (b"}", b"]") and depth:
            depth -= 1
        elif mark == b"," and not depth:
            elements.append(body[start : token.start()])
            start = token.end()
        elif mark == b"]":  # the end of the events array
            last = body[start : token.start()]
            if last.strip() or elements:
                elements.append(last)
            position = token.end()
            return elements if next_token(b"}") and not body[position:].strip() else None
    return None


def _event_label(raw: bytes, index: int) -> str:
    """The element's event_id when it is a readable one, else its position."""
    try:
        event_id = pydantic_core.from_json(raw).get("event_id")
    except (ValueError, AttributeError):
        event_id = None
    if isinstance(event_id, str) and 0 < len(event_id) <= limits.MAX_ID_LENGTH and event_id.isprintable():
        return event_id
    return f"events[{index}]"


def _readable(text: str) -> str:
    """``text`` as valid UTF-8 (a lone surrogate from the input must not break the response)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def parse_events(body: bytes) -> tuple[list[ExpandEvent], list[RejectedEvent]]:
    """Validate each event on its own: one bad event is rejected with its reason, the others proceed.
    A body that is valid as a whole (nearly every one) is validated in one pass from its bytes."""
    try:
        return ExpandRequest.model_validate_json(body).events, []
    except ValidationError:
        pass
    raw_events = event_elements(body)
    if raw_events is None:
        raise HTTPException(422, _SHAPE)
    if not 1 <= len(raw_events) <= limits.MAX_EVENTS_PER_REQUEST:
        raise HTTPException(422, f"events must hold between 1 and {limits.MAX_EVENTS_PER_REQUEST} events")
    events, rejected = [], []
    for index, raw in enumerate(raw_events):
        try:
            events.append(ExpandEvent.model_validate_json(raw))
        except ValidationError as error:
            reason = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'event'}: {e['msg']}" for e in error.errors()
            )
            rejected.append(
                RejectedEvent(
                    event_id=_event_label(raw, index), status=EventStatus.INVALID, error=_readable(reason)
                )
            )
    return events, rejected


@router.post(
    paths.EXPAND,
    response_model=ExpandResponse,
    responses=ERRORS,
    openapi_extra=documented(ExpandRequest),
)
async def expand(request: Request, intake: IntakeDep) -> ExpandResponse:
    """Report finished turns; get the branching instructions they trigger.

    Events are validated and applied one by one (a tree's events in order): a bad event is listed in
    `rejected` with its reason and never stops the others. Duplicated event ids are acknowledged.
    """
    # Validating a large body (and, if it fails as a whole, each of its events) takes tens of
    # milliseconds: beside the event loop, not on it.
    events, rejected = await parsed(await request.body(), parse_events)
    response = await intake.expand(events) if events else ExpandResponse(accepted=0, duplicates=0)
    if not rejected:
        return response
    return response.model_copy(update={"rejected": [*rejected, *response.rejected]})


@router.get(paths.INSTRUCTIONS, response_model=InstructionsResponse, responses=ERRORS)
async def claim_instructions(
    instructions: InstructionsDep, job: JobName = "default", max: int = limits.DEFAULT_CLAIM
) -> InstructionsResponse:
    """Lease instructions nobody has started; unstarted ones are offered again after `lease_seconds`."""
    if not 1 <= max <= limits.MAX_CLAIM:
        raise HTTPException(422, f"max must be between 1 and {limits.MAX_CLAIM}")
    return await instructions.claim(job, max)
