from __future__ import annotations

from typing import Annotated

import pydantic_core
from fastapi import APIRouter, HTTPException, Query, Request
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
from trace_service.parsing.body import INLINE_BODY_BYTES, BodyErrors, Parts, documented, parsed
from trace_service.routers.responses import ERRORS

router = APIRouter(tags=["expansion"])

_SHAPE = 'body must be a JSON object {"events": [event, ...]} and nothing else'
_COUNT = f"events must hold between 1 and {limits.MAX_EVENTS_PER_REQUEST} events"


def event_elements(body: bytes) -> list[bytes]:
    """The raw text of each element of ``events`` in a body shaped ``{"events": [...]}``; a 422 for any
    other shape.  Only the structure around the elements is read, in linear time: whatever one element
    holds, however deep or malformed, it is that element's problem alone."""
    try:
        parts = Parts(body, "events", limits.MAX_EVENTS_PER_REQUEST)
    except BodyErrors as error:  # located at the events array: too many of them
        raise HTTPException(422, _COUNT if error.errors()[0]["loc"] else _SHAPE) from None
    if parts.head or parts.elements is None:
        raise HTTPException(422, _SHAPE)
    if not parts.elements:
        raise HTTPException(422, _COUNT)
    return parts.elements


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
    A small body that is valid as a whole (nearly every one) is validated in one pass from its bytes;
    a large one always event by event (:mod:`trace_service.parsing.body`)."""
    if len(body) <= INLINE_BODY_BYTES:
        try:
            return ExpandRequest.model_validate_json(body).events, []
        except ValidationError:
            pass
    raw_events = event_elements(body)
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
    instructions: InstructionsDep,
    job: JobName = "default",
    max: Annotated[int, Query(ge=1, le=limits.MAX_CLAIM, description="Most instructions to claim.")] = (
        limits.DEFAULT_CLAIM
    ),
) -> InstructionsResponse:
    """Lease instructions nobody has started; unstarted ones are offered again after `lease_seconds`."""
    return await instructions.claim(job, max)
