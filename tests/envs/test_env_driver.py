"""Environment rollouts through the driver and a live service: a continuation whose environment does not
replay as recorded, or raises while it replays, ends as a failed rollout of its own, reported to the
service, and every tree still completes."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from env_support import FailingReplay, UnseededGem
from support import make_settings

from trace_client import AsyncTraceClient
from trace_client.driver import DriverConfig, FinishedTree
from trace_client.envs import Environment, EnvironmentWorker, EnvTurn, Episode, GemEnvironment
from trace_lab.local import ThreadedService
from trace_proto import AllocateRequest, Policy, PromptIn

ROLLOUTS = 2  # per tree: uniform allocation of a budget of ROLLOUTS per prompt


@pytest.fixture(scope="module")
def live() -> Iterator[ThreadedService]:
    settings = make_settings(lease_seconds=0.5, train_interval_seconds=60.0, sweep_interval_seconds=60.0)
    with ThreadedService.from_settings(settings) as service:
        yield service


def guess(episode: Episode) -> str:
    """Mastermind guesses that never repeat: the game ends at its turn limit at the latest."""
    first, second = divmod(len(episode.steps), 5)
    return f"\\boxed{{{first + 1} {second + 2}}}"


async def run(url: str, worker: EnvironmentWorker, prompts: list[str]) -> list[FinishedTree]:
    request = AllocateRequest(
        job=f"envs-{uuid.uuid4().hex[:8]}",
        step=0,
        budget=ROLLOUTS * len(prompts),
        expansion=1.0,
        policy=Policy.UNIFORM,
        prompts=[PromptIn(prompt_id=prompt, metadata={"seed": k}) for k, prompt in enumerate(prompts)],
    )
    async with AsyncTraceClient(url) as client:
        result = await worker.driver(client, config=DriverConfig(poll_interval=0.1)).run_step(request)
    assert not result.timed_out
    assert all(tree.tree.status.value == "complete" for tree in result.trees)
    return result.trees


async def test_a_continuation_that_does_not_replay_as_recorded_is_reported_as_failed(
    live: ThreadedService,
) -> None:
    worker = EnvironmentWorker(lambda _: UnseededGem("game:Mastermind-v0-easy"), guess)
    trees = await run(live.url, worker, ["secret-0", "secret-1"])
    for finished in trees:
        leaves = [node for node in finished.tree.nodes if node.reward is not None]
        assert len(leaves) == ROLLOUTS + finished.tree.expansion_budget
        assert finished.failures  # an unseeded secret shows at the reset (its example guess) already
        for node_id, error in finished.failures.items():
            assert error.startswith(
                f"ReplayDivergence: replay diverged in tree {finished.tree.tree_id} at node "
            )
            assert node_id not in finished.turns
        for node_id, turn in finished.turns.items():  # the driver's on_turn named every record's node
            assert isinstance(turn.state, EnvTurn)
            assert turn.state.node_id == node_id
        # the bare rollouts ran to their end: the failures are continuations
        assert len(finished.failures) <= finished.tree.expansion_budget
    assert worker.stats.divergences == sum(len(finished.failures) for finished in trees)


async def test_an_environment_that_raises_while_replaying_fails_only_that_continuation(
    live: ThreadedService,
) -> None:
    made: Counter[str] = Counter()

    def make_env(prompt: PromptIn) -> Environment:
        made[prompt.prompt_id] += 1
        # the bare rollouts' environments come first; of the restores, every other one fails
        restore = made[prompt.prompt_id] - ROLLOUTS
        fails = prompt.prompt_id == "flaky" and restore > 0 and restore % 2 == 1
        return FailingReplay(GemEnvironment("game:Mastermind-v0-easy"), fails=fails)

    worker = EnvironmentWorker(make_env, guess)
    trees = {
        finished.prompt.prompt_id: finished for finished in await run(live.url, worker, ["steady", "flaky"])
    }
    assert not trees["steady"].failures
    flaky = trees["flaky"]
    continuations = flaky.tree.expansion_budget
    assert continuations >= 2
    assert len(flaky.failures) == (continuations + 1) // 2
    assert all(error.startswith("ConnectionError: ") for error in flaky.failures.values())
    leaves = [node for node in flaky.tree.nodes if node.reward is not None]
    assert len(leaves) == ROLLOUTS + continuations  # the other continuations ran to their end
