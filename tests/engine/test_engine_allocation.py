"""Allocation on the components directly: Stage 1's answer, the trees it creates, idempotency."""

from __future__ import annotations

import pytest
from engine_support import Wired

from trace_proto import AllocateRequest, Policy, PromptIn
from trace_service.engine import IdempotencyConflictError


def uniform(budget: int = 12, prompts: int = 3, **fields: object) -> AllocateRequest:
    return AllocateRequest.model_validate(
        {
            "step": 0,
            "budget": budget,
            "expansion": 1.0,
            "policy": Policy.UNIFORM,
            "prompts": [PromptIn(prompt_id=f"p{i}", text=f"task {i}") for i in range(prompts)],
            **fields,
        }
    )


async def test_uniform_stage1_gives_every_prompt_its_share_and_creates_its_tree(wired: Wired) -> None:
    answer = await wired.engine.allocation.allocate(uniform(), None)
    assert [(t.prompt_id, t.rollouts, t.expansion_budget) for t in answer.trees] == [
        ("p0", 4, 4),
        ("p1", 4, 4),
        ("p2", 4, 4),
    ]
    assert answer.skipped == [] and answer.budget == 12
    metas = await wired.store.load_metas([t.tree_id for t in answer.trees])
    assert [(m.prompt_id, m.rollouts, m.expansion_budget, m.status) for m in metas if m] == [
        ("p0", 4, 4, "collecting"),
        ("p1", 4, 4, "collecting"),
        ("p2", 4, 4, "collecting"),
    ]
    labels = {"training_job": "default", "decision": "active"}
    assert wired.sample("trace_allocate_prompts_total", labels) == 3


async def test_a_prompt_beyond_the_budget_is_skipped(wired: Wired) -> None:
    answer = await wired.engine.allocation.allocate(uniform(budget=4, min_rollouts=2, max_rollouts=2), None)
    assert [t.rollouts for t in answer.trees] == [2, 2]
    assert len(answer.skipped) == 1


async def test_a_repeated_key_returns_the_first_answer_and_a_reused_one_is_refused(wired: Wired) -> None:
    allocation = wired.engine.allocation
    first = await allocation.allocate(uniform(), "key-1")
    assert await allocation.allocate(uniform(), "key-1") == first
    with pytest.raises(IdempotencyConflictError, match="key-1"):
        await allocation.allocate(uniform(budget=6), "key-1")
    # The repeat created no trees: the step counts one allocation's prompts.
    (step,) = (await wired.engine.stats.job_stats("default")).steps
    assert (step.prompts, step.active, step.budget_promised) == (3, 3, 12)
