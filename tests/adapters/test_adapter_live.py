"""Token rows of a real step: a tokenising agent on the simulated workload, driven against the service."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from support import make_settings

from trace_client import AsyncTraceClient
from trace_client.adapters import token_trajectories
from trace_client.driver import History, RolloutDriver, TurnResult, TurnTokens
from trace_lab.local import ThreadedService
from trace_lab.sim import SimConfig, SimWorkload
from trace_lab.sim.workers import SimAgent, prompt_in
from trace_proto import AllocateRequest


def word_tokens(text: str) -> TurnTokens:
    """One token per word (its length); the observation's words are the environment's (mask 0)."""
    thought_and_action, _, observation = text.partition("\nObservation:")
    policy, environment = thought_and_action.split(), observation.split()
    return TurnTokens(
        tuple(len(word) for word in [*policy, *environment]),
        mask=(1,) * len(policy) + (0,) * len(environment),
    )


async def test_every_policy_token_of_a_step_is_trained_once_with_its_turns_advantage() -> None:
    workload = SimWorkload(SimConfig(prompts=32), seed=5)
    agent = SimAgent(workload, np.random.default_rng(2))

    async def next_turn(history: History) -> TurnResult:
        turn = await agent.next_turn(history)
        return replace(turn, tokens=word_tokens(turn.text or ""))

    prompts = [prompt_in(p) for p in workload.sample_pool(8, np.random.default_rng(3))]
    request = AllocateRequest(job="adapters", step=0, budget=24, expansion=1.0, prompts=prompts)
    with ThreadedService.from_settings(
        make_settings(train_interval_seconds=60.0, sweep_interval_seconds=60.0)
    ) as live:
        async with AsyncTraceClient(live.url) as client:
            result = await RolloutDriver(client, next_turn).run_step(request)
    rows = token_trajectories(result.trees, lambda prompt: [len(prompt.text or "")])
    leaves = [node for finished in result.trees for node in finished.tree.nodes if node.reward is not None]
    assert len(rows) == len(leaves)
    policy_tokens = sum(
        sum(turn.tokens.loss_mask)
        for finished in result.trees
        for turn in finished.turns.values()
        if turn.tokens
    )
    assert sum(sum(row.loss_mask) for row in rows) == policy_tokens
    advantage = {
        (finished.tree.tree_id, node.node_id): node.advantage
        for finished in result.trees
        for node in finished.tree.nodes
    }
    for row in rows:
        assert row.advantages[-1] == advantage[(row.group, row.leaf_id)]
        assert set(row.advantages) <= {value for (tree, _), value in advantage.items() if tree == row.group}
