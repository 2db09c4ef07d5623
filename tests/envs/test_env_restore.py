"""Restoring a node's environment state before a continuation, against the real packages (GEM's games,
Gymnasium's toy-text environments): every depth reproduces the recorded observations, a snapshot
environment is never replayed, a non-deterministic one is caught, and the live-state cache keeps its
bound."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from env_support import (
    Counting,
    FailingReplay,
    Tally,
    UnseededGem,
    mastermind_guesses,
    minesweeper_moves,
    prompt,
    rollout,
    scripted,
    turn,
)

from trace_client.driver import History, TurnTokens
from trace_client.envs import (
    DeepCopySnapshots,
    Environment,
    EnvironmentWorker,
    EnvTurn,
    Episode,
    GemEnvironment,
    GymnasiumEnvironment,
    Move,
    ReplayDivergence,
)
from trace_proto import PromptIn

#: Environments whose episodes run several turns, with the actions a scripted policy plays in them.
GAMES: dict[str, tuple[Callable[[PromptIn], Environment], list[object]]] = {
    "gem-mastermind": (lambda _: GemEnvironment("game:Mastermind-v0-easy"), mastermind_guesses(10, 1)),
    "gem-minesweeper": (lambda _: GemEnvironment("game:Minesweeper-v0-easy"), minesweeper_moves(25, 2)),
    "gymnasium-frozenlake": (
        lambda _: GymnasiumEnvironment("FrozenLake-v1", is_slippery=True),
        [random.Random(3).randrange(4) for _ in range(100)],
    ),
}


def observations(history: History) -> list[object]:
    return [turn.state.observation for turn in history.turns if isinstance(turn.state, EnvTurn)]


@pytest.mark.parametrize("game", GAMES)
async def test_a_continuation_from_every_depth_reproduces_the_recorded_observations(game: str) -> None:
    make_env, actions = GAMES[game]
    worker = EnvironmentWorker(make_env, scripted(actions))
    tree = "tree-a"
    recorded = await rollout(worker, History(prompt(), tree))
    assert recorded.depth >= 2
    for depth in range(1, recorded.depth):
        random.seed(depth)  # whatever the rest of the process draws meanwhile
        start = History(recorded.prompt, tree, recorded.turns[:depth])
        continued = await rollout(worker, start)  # the cache holds nothing at a branch: a replay
        assert observations(continued) == observations(recorded)
    assert worker.stats.restored_by_replay == recorded.depth - 1
    assert worker.stats.divergences == 0
    total = worker.stats.total
    assert total.replayed == sum(range(1, recorded.depth))
    assert total.steps == total.depths  # every turn stepped once: the replayed prefix and the new turns


@pytest.mark.parametrize("game", GAMES)
async def test_a_snapshot_environment_is_never_replayed(game: str) -> None:
    make_env, actions = GAMES[game]
    counts = Tally()
    worker = EnvironmentWorker(
        lambda prompt: DeepCopySnapshots(Counting(make_env(prompt), counts)),
        scripted(actions),
        cache_size=0,  # not even a rollout's next turn finds its environment: every turn restores
    )
    recorded = await rollout(worker, History(prompt(), "tree-s"))
    for depth in range(1, recorded.depth):
        continued = await rollout(worker, History(recorded.prompt, "tree-s", recorded.turns[:depth]))
        assert observations(continued) == observations(recorded)
    assert counts["resets"] == 1  # the bare rollout's: no restore reset anything
    assert worker.stats.restored_by_replay == 0
    assert worker.stats.restored_by_snapshot >= recorded.depth
    assert worker.stats.total.replayed == 0


async def test_an_environment_that_is_not_deterministic_is_named_with_its_tree_node_and_turn() -> None:
    worker = EnvironmentWorker(
        lambda _: UnseededGem("game:Mastermind-v0-easy"), scripted(mastermind_guesses(10, 4))
    )
    recorded = await rollout(worker, History(prompt(), "tree-n"))
    start = History(recorded.prompt, "tree-n", recorded.turns[: recorded.depth - 1])
    errors = []
    for _ in range(20):  # two secrets drawn apart may still answer alike
        try:
            await turn(worker, start)
        except ReplayDivergence as caught:
            errors.append(caught)
    assert errors
    error = errors[0]
    assert error.tree_id == "tree-n"
    node = recorded.turns[max(error.turn, 1) - 1].state  # the first turn's node recorded the reset too
    assert isinstance(node, EnvTurn)
    assert error.node == node.node_id
    assert f"tree tree-n at node {node.node_id} (" in str(error)
    assert worker.stats.divergences == len(errors)


async def test_an_environment_that_raises_during_replay_fails_only_that_continuation() -> None:
    made = iter([False, True, False])  # the bare rollout's environment, then two restores: one fails

    def make_env(_: PromptIn) -> Environment:
        return FailingReplay(GemEnvironment("game:Mastermind-v0-easy"), fails=next(made))

    worker = EnvironmentWorker(make_env, scripted(mastermind_guesses(10, 1)))
    recorded = await rollout(worker, History(prompt(), "tree-f"))
    start = History(recorded.prompt, "tree-f", recorded.turns[:1])
    with pytest.raises(ConnectionError):
        await turn(worker, start)
    continued = await rollout(worker, start)
    assert observations(continued) == observations(recorded)


async def test_the_live_state_cache_keeps_its_bound_and_a_dropped_state_is_restored() -> None:
    worker = EnvironmentWorker(
        lambda _: GemEnvironment("game:Mastermind-v0-easy"), scripted(mastermind_guesses(10, 5)), cache_size=2
    )
    histories = [History(prompt(f"task-{k}", seed=k), f"tree-{k}") for k in range(5)]
    for _ in range(3):  # five rollouts turn by turn: each turn stores one, three more than the bound
        histories = [await turn(worker, history) for history in histories]
        assert len(worker._cache) <= 2
    stats = worker.cache_stats
    assert stats.size <= 2
    assert stats.evictions >= 3
    assert worker.stats.restored_by_replay > 0  # the rollouts whose environments were dropped
    for history in histories:
        await rollout(worker, history)
    assert worker.stats.total.count == 0  # restored, they are still bare rollouts, not continuations
    assert worker.stats.divergences == 0


async def test_a_turn_leaves_the_callers_global_random_state_alone() -> None:
    worker = EnvironmentWorker(
        lambda _: GemEnvironment("game:Minesweeper-v0-easy"), scripted(minesweeper_moves(25, 2))
    )
    random.seed(123)
    before = random.getstate()
    await rollout(worker, History(prompt(), "tree-r"))
    assert random.getstate() == before


async def test_with_observation_ids_the_turns_tokens_hold_the_whole_episode() -> None:
    def policy(episode: Episode) -> Move:
        return Move(
            scripted(mastermind_guesses(10, 1))(episode), tokens=TurnTokens((7, 8), logprobs=(-1.0, -2.0))
        )

    worker = EnvironmentWorker(
        lambda _: GemEnvironment("game:Mastermind-v0-easy"),
        policy,
        observation_ids=lambda observation: [len(str(observation))],
    )
    first = await turn(worker, History(prompt(), "tree-t"))
    second = await turn(worker, first)
    record = first.turns[0].state
    assert isinstance(record, EnvTurn)
    tokens = first.turns[0].tokens
    assert tokens is not None
    assert tokens.ids == (len(str(record.start)), 7, 8, len(str(record.observation)))
    assert tokens.mask == (0, 1, 1, 0)
    assert tokens.logprobs == (0.0, -1.0, -2.0, 0.0)
    later = second.turns[1].tokens
    assert later is not None
    assert later.mask == (1, 1, 0)
