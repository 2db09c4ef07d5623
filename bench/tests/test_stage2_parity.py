"""The benchmarks' Stage 2 is the service's: the same trees, decided by the service's engine and planned by
the harness, get the same continuations at the same prefixes (Ṽ at each prefix read from what the
engine recorded, so both sides see one predictor)."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from support import rollout, running_engine

from bench import harness
from bench.branching import plan_round, shared_draws
from bench.estimators import Query
from bench.forest import Forest, Ledger
from trace_lab.sim import Prompt, RolloutState
from trace_lab.sim.state import Turn
from trace_proto import AllocateRequest, ExpandEvent, Policy, PromptIn
from trace_service.allocation import POLICIES, bare_mixed_chance
from trace_service.allocation.tree import ROOT

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")

PROMPTS = 8


def outcome(tree: int, rollout_index: int) -> float:
    """Trees whose bare rollouts all succeed, all fail, or disagree, in turn."""
    kind = tree % 3
    return 1.0 if kind == 0 else 0.0 if kind == 1 else float(rollout_index % 2)


def trajectory(prompt_id: str, events: Sequence[ExpandEvent]) -> list[RolloutState]:
    """The simulator's states after each turn of a rollout sent as ``events``."""
    turns = [Turn(text=event.text, done=event.done, reward=event.reward) for event in events]
    return [
        RolloutState(prompt_id, p=0.5 if turn.reward is None else turn.reward, history=tuple(turns[: k + 1]))
        for k, turn in enumerate(turns)
    ]


@pytest.mark.parametrize(
    "policy",
    [Policy.TRACE, Policy.TRACE_JOINT, Policy.TRACE_SHARED, Policy.TRACE_PREFIX, Policy.DAPO, Policy.UNIFORM],
    ids=str,
)
async def test_the_harness_places_continuations_where_the_service_does(policy: Policy) -> None:
    rules = POLICIES[policy]
    async with running_engine() as engine:
        prompts = [PromptIn(prompt_id=f"p{i}", text=f"question {i}") for i in range(PROMPTS)]
        request = AllocateRequest(
            step=0,
            budget=3 * PROMPTS,
            min_rollouts=2,
            expansion=1.0,
            policy=policy,
            control_share=0.0,
            prompts=prompts,
        )
        allocation = await engine.allocation.allocate(request, None)
        trees = allocation.trees
        forest = Forest([Prompt(t.prompt_id, "") for t in trees], [t.rollouts for t in trees], rules)
        node_of: dict[RolloutState, str] = {}
        service: dict[str, Counter[str]] = {}
        for index, tree in enumerate(trees):  # one tree at a time: the reserve's draws in pool order
            events = []
            for j in range(tree.rollouts):
                chain = rollout(tree.tree_id, None, turns=2 + (index + j) % 3, reward=outcome(index, j))
                # Ids that sort as sent: the service orders a batch's nodes of one depth by id.
                chain = [
                    event.model_copy(
                        update={
                            "node_id": f"{tree.tree_id}-{j:02d}-{t}",
                            "parent_id": None if t == 0 else f"{tree.tree_id}-{j:02d}-{t - 1}",
                        }
                    )
                    for t, event in enumerate(chain)
                ]
                states = trajectory(tree.prompt_id, chain)
                forest.add(index, ROOT, states, bare=True)
                node_of.update(zip(states, (event.node_id for event in chain), strict=True))
                events.extend(chain)
            answer = await engine.intake.expand(events)
            assert not answer.rejected
            service[tree.tree_id] = Counter({i.node_id: i.count for i in answer.instructions})
        predicted: dict[str, float] = {}
        for tree in trees:
            stored = await engine.store.load_tree(tree.tree_id)
            assert stored is not None
            predicted.update(stored.predictions)

    def recorded(queries: Sequence[Query]) -> np.ndarray:
        # The service asks the predictor only for trees with continuations to place; the harness asks
        # for every tree (one batched call), and a tree with none places nothing whatever Ṽ says.
        return np.array([predicted.get(node_of[query.state], 0.5) for query in queries])

    shares = [tree.expansion_budget for tree in trees]
    if rules.sharing is not None:
        chances = bare_mixed_chance([t.predicted_success for t in trees], [t.rollouts for t in trees])
        shares = shared_draws(forest, shares, chances, rules.sharing)
    planned = plan_round(
        rules,
        recorded,
        forest,
        {},
        [True] * len(trees),
        shares,
        None,  # type: ignore[arg-type]  # read only when counting turns
        np.random.default_rng(0),
        Ledger(None),
    )
    bench: dict[str, Counter[str]] = {tree.tree_id: Counter() for tree in trees}
    for index, node in planned:
        bench[trees[index].tree_id][node_of[forest.states[node]]] += 1
    assert bench == service
    assert sum(sum(counts.values()) for counts in service.values()) > 0


SHARES = [(m, n) for m in (1, 2, 3, 7, 16, 45, 64) for n in (0.0, 0.1, 1 / 3, 0.5, 1.0, 1.4, 2.0, 2.7)]


async def test_the_harness_promises_every_share_the_service_does() -> None:
    """⌊m·N⌋ at every (m, N), m = 45 and N = 1.4 among them (63: a float floor gives 62): the
    service's allocation and the harness's step (`StepConfig`, a tree's share) agree."""
    async with running_engine() as engine:
        for step, (bare, expansion) in enumerate(SHARES):
            request = AllocateRequest(
                step=step,
                budget=bare,
                min_rollouts=2,
                max_rollouts=64,
                expansion=expansion,
                policy=Policy.UNIFORM,
                control_share=0.0,
                prompts=[PromptIn(prompt_id="p")],
            )
            trees = (await engine.allocation.allocate(request, None)).trees
            config = harness.StepConfig(bare_rollouts=bare, expansion=expansion)
            assert config.total_rollouts - bare == (
                trees[0].expansion_budget if trees else config.total_rollouts - bare
            )
            for tree in trees:
                forest_share = harness.continuation_budget(tree.rollouts, expansion)
                assert tree.expansion_budget == forest_share, (bare, expansion)
        assert harness.continuation_budget(45, 1.4) == 63
