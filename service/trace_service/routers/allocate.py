from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header

from trace_proto import AllocateRequest, AllocateResponse
from trace_proto.v1 import paths
from trace_service.deps import EngineDep
from trace_service.routers.responses import ERRORS

router = APIRouter(tags=["allocation"])


@router.post(paths.ALLOCATE, response_model=AllocateResponse, responses=ERRORS)
async def allocate(
    request: AllocateRequest,
    engine: EngineDep,
    idempotency_key: Annotated[str | None, Header(alias=paths.IDEMPOTENCY_KEY_HEADER, max_length=256)] = None,
) -> AllocateResponse:
    """Stage 1: how many bare rollouts each candidate prompt gets (0 = skipped), one tree per active prompt.

    Repeating a request with the same `Idempotency-Key` returns the first answer.
    """
    return await engine.allocate(request, idempotency_key)
