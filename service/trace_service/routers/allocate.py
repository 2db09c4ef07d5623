from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request

from trace_proto import AllocateRequest, AllocateResponse
from trace_proto.v1 import paths
from trace_service.deps import AllocationDep
from trace_service.parsing.body import documented, validated
from trace_service.routers.responses import ERRORS, STORE_FULL

router = APIRouter(tags=["allocation"])


#: What an allocation's answer leads to (OpenAPI links: clients and stateful fuzzers follow them).
_FIRST_TREE = "$response.body#/trees/0/tree_id"
_LINKS = {
    "GetTree": {"operationId": "get_tree_v1_trees__tree_id__get", "parameters": {"tree_id": _FIRST_TREE}},
    "CloseTree": {
        "operationId": "close_tree_v1_trees__tree_id__close_post",
        "parameters": {"tree_id": _FIRST_TREE},
    },
    "ReportFirstTurn": {
        "operationId": "expand_v1_expand_post",
        "requestBody": {
            "events": [
                {
                    "event_id": "{$response.body#/allocation_id}-first",
                    "tree_id": "{$response.body#/trees/0/tree_id}",
                    "node_id": "first",
                    "done": True,
                    "reward": 1.0,
                }
            ]
        },
    },
    "JobStats": {
        "operationId": "job_stats_v1_jobs__job__stats_get",
        "parameters": {"job": "$response.body#/job"},
    },
    "ClaimInstructions": {
        "operationId": "claim_instructions_v1_instructions_get",
        "parameters": {"job": "$response.body#/job"},
    },
}


@router.post(
    paths.ALLOCATE,
    response_model=AllocateResponse,
    responses={**ERRORS, 503: {**ERRORS[503], "description": STORE_FULL}},
    openapi_extra={**documented(AllocateRequest), "responses": {"200": {"links": _LINKS}}},
)
async def allocate(
    request: Request,
    allocation: AllocationDep,
    idempotency_key: Annotated[str | None, Header(alias=paths.IDEMPOTENCY_KEY_HEADER, max_length=256)] = None,
) -> AllocateResponse:
    """Stage 1: how many bare rollouts each candidate prompt gets (0 = skipped), one tree per active prompt.

    Repeating a request with the same `Idempotency-Key` returns the first answer.  While the tree store
    holds its byte budget, a new allocation is answered 503 (the trees in flight still finish).
    """
    return await allocation.allocate(await validated(request, AllocateRequest, "prompts"), idempotency_key)
