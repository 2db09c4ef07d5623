"""What the client tests' mock service answers with, and the allocation they ask for."""

from collections.abc import Callable
from typing import Any

import httpx
from pydantic import BaseModel

from trace_proto import AllocateRequest, AllocateResponse, PromptIn, SkippedPrompt, TreeAllocation

# The `connect` fixture (conftest.py): connect(handler, **client_options) -> (client, recorder).
Connect = Callable[..., tuple[Any, Any]]

ALLOCATE_REQUEST = AllocateRequest(
    step=1, budget=8, prompts=[PromptIn(prompt_id="p1"), PromptIn(prompt_id="p2")]
)
ALLOCATION = AllocateResponse(
    allocation_id="alloc-1",
    job="default",
    step=1,
    policy=ALLOCATE_REQUEST.policy,
    predictor_version=3,
    trees=[
        TreeAllocation(prompt_id="p1", tree_id="t1", rollouts=8, expansion_budget=16, predicted_success=0.5)
    ],
    skipped=[SkippedPrompt(prompt_id="p2", predicted_success=1.0)],
    expected_mixed=0.99,
    budget=8,
)


def answer(model: BaseModel, status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(status, content=model.model_dump_json(), headers=headers)


def problem(status: int, title: str, detail: str, **extra: Any) -> httpx.Response:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "request_id": "req-42"}
    return httpx.Response(status, json=body | extra, headers={"Content-Type": "application/problem+json"})
