from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import ValidationError

from trace_proto import ExpandEvent, ExpandRequest, ExpandResponse, InstructionsResponse, RejectedEvent
from trace_proto.v1 import limits, paths
from trace_proto.v1.common import JobName
from trace_service.deps import EngineDep
from trace_service.routers.responses import ERRORS

router = APIRouter(tags=["expansion"])


def _event_label(raw: Any, index: int) -> str:
    event_id = raw.get("event_id") if isinstance(raw, dict) else None
    return (
        event_id
        if isinstance(event_id, str) and 0 < len(event_id) <= limits.MAX_ID_LENGTH
        else f"events[{index}]"
    )


def parse_events(body: bytes) -> tuple[list[ExpandEvent], list[RejectedEvent]]:
    """Validate each event on its own: one bad event is rejected with its reason, the others proceed.
    A body that is valid as a whole (nearly every one) is validated in one pass from its bytes."""
    try:
        return ExpandRequest.model_validate_json(body).events, []
    except ValidationError:
        pass
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise HTTPException(422, f"body is not valid JSON: {error}") from None
    if not isinstance(payload, dict) or set(payload) != {"events"} or not isinstance(payload["events"], list):
        raise HTTPException(422, 'body must be a JSON object {"events": [event, ...]} and nothing else')
    raw_events = payload["events"]
    if not 1 <= len(raw_events) <= limits.MAX_EVENTS_PER_REQUEST:
        raise HTTPException(422, f"events must hold between 1 and {limits.MAX_EVENTS_PER_REQUEST} events")
    events, rejected = [], []
    for index, raw in enumerate(raw_events):
        try:
            events.append(ExpandEvent.model_validate(raw))
        except ValidationError as error:
            reason = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'event'}: {e['msg']}" for e in error.errors()
            )
            rejected.append(RejectedEvent(event_id=_event_label(raw, index), status=422, error=reason))
    return events, rejected


@router.post(
    paths.EXPAND,
    response_model=ExpandResponse,
    responses=ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExpandRequest"}}},
        }
    },
)
async def expand(request: Request, engine: EngineDep) -> ExpandResponse:
    """Report finished turns; get the branching instructions they trigger.

    Events are validated and applied one by one (a tree's events in order): a bad event is listed in
    `rejected` with its reason and never stops the others. Duplicated event ids are acknowledged.
    """
    events, rejected = parse_events(await request.body())
    response = await engine.expand(events) if events else ExpandResponse(accepted=0, duplicates=0)
    if not rejected:
        return response
    return response.model_copy(update={"rejected": [*rejected, *response.rejected]})


@router.get(paths.INSTRUCTIONS, response_model=InstructionsResponse, responses=ERRORS)
async def claim_instructions(
    engine: EngineDep, job: JobName = "default", max: int = limits.DEFAULT_CLAIM
) -> InstructionsResponse:
    """Lease instructions nobody has started; unstarted ones are offered again after `lease_seconds`."""
    if not 1 <= max <= limits.MAX_CLAIM:
        raise HTTPException(422, f"max must be between 1 and {limits.MAX_CLAIM}")
    return await engine.claim_instructions(job, max)
