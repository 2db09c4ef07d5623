"""Issue 13: what a hostile or careless client could do to the service, each case a regression test.

No stuck trees, no 5xx on bad input, bounded work per request, semantics that say what they do.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from support import make_settings, rollout, turn

from trace_proto import AllocateRequest, ExpandEvent, PromptIn
from trace_service.app import create_app
from trace_service.engine import Engine


@contextlib.asynccontextmanager
async def running_engine(store_url: str = "", **settings: object) -> AsyncIterator[Engine]:
    """The app's engine in this test's event loop, its sweeper slowed so that the test drives it."""
    app = create_app(make_settings(store_url, sweep_interval_seconds=3600, **settings))
    async with app.router.lifespan_context(app):
        yield app.state.engine


# --- 1. one event must not freeze a tree -----------------------------------------------------------


async def test_an_event_with_unusable_features_is_refused_and_its_tree_goes_on(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        allocation = await engine.allocate(
            AllocateRequest(
                step=0, budget=4, expansion=1.0, prompts=[PromptIn(prompt_id="a"), PromptIn(prompt_id="b")]
            ),
            None,
        )
        tree_id = allocation.trees[0].tree_id
        first = turn(tree_id, None).model_copy(update={"features": [0.5, 0.25]})
        answer = await engine.expand([first])
        assert answer.accepted == 0
        assert [(r.event_id, r.status) for r in answer.rejected] == [(first.event_id, 422)]
        assert "feature_dim=0" in answer.rejected[0].error
        # The same rollout without features, and the tree's other rollout: Stage 2 runs as usual.
        ends = rollout(tree_id, None, 2, 1.0) + rollout(tree_id, None, 2, 0.0)
        answer = await engine.expand(ends)
        assert answer.accepted == len(ends) and not answer.rejected
        assert sum(i.count for i in answer.instructions) == allocation.trees[0].expansion_budget


async def test_a_stage2_decision_that_fails_falls_back_and_is_counted(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        allocation = await engine.allocate(
            AllocateRequest(step=0, budget=2, expansion=2.0, prompts=[PromptIn(prompt_id="p")]), None
        )
        tree = allocation.trees[0]
        # Stored before validation existed: features the predictor cannot use, on the store directly.
        bad = [
            e.model_copy(update={"features": [0.5, 0.25]})
            for j in range(tree.rollouts)
            for e in rollout(tree.tree_id, None, 2, float(j))
        ]
        (batch,) = await engine.store.apply_events(
            [(tree.tree_id, bad)], now=engine.clock(), success_threshold=0.5, decision_lease=0.0
        )
        assert batch.decision_round == 1
        assert await engine.sweep() == 1  # the lapsed claim is decided, by the fallback
        exported = await engine.tree(tree.tree_id)
        assert exported.status == "expanding"
        meta = (await engine.store.load_metas([tree.tree_id]))[0]
        assert meta is not None
        assert meta.promised == tree.expansion_budget == meta.fallback
        offered = (await engine.claim_instructions("default", 10)).instructions
        assert sum(i.count for i in offered) == tree.expansion_budget


def _event(**fields: object) -> ExpandEvent:
    return ExpandEvent.model_validate({"event_id": "e", "tree_id": "t", "node_id": "n", **fields})


# --- 2. allocations of any allowed size ------------------------------------------------------------


async def test_an_allocation_of_more_than_eight_thousand_trees_is_listed_and_counted(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        prompts = [PromptIn(prompt_id=f"p{i}") for i in range(8_500)]
        request = AllocateRequest(step=3, budget=17_000, min_rollouts=2, max_rollouts=2, prompts=prompts)
        allocation = await engine.allocate(request, "key-1")
        assert len(allocation.trees) == 8_500
        stats = await engine.job_stats("default")
        assert [(s.step, s.active, s.prompts) for s in stats.steps] == [(3, 8_500, 8_500)]
        assert await engine.allocate(request, "key-1") == allocation
