"""`EnvironmentWorker`: a policy acting on a stateful environment, as the driver's `next_turn`, with each
node's environment state restored before a continuation's first turn (`trace_client.envs`)."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trace_client.client import AsyncTraceClient
from trace_client.driver import (
    DriverConfig,
    History,
    ProgressCallback,
    RolloutDriver,
    Score,
    TurnResult,
    TurnTokens,
)
from trace_client.envs._live import CacheStats, GlobalRandom, Live, LiveCache, Snapshot
from trace_client.envs.types import (
    Environment,
    EnvTurn,
    Episode,
    Move,
    Outcome,
    Policy,
    ReplayDivergence,
    stable_seed,
)
from trace_proto import PromptIn

#: Characters of an observation kept in a turn's default text.
_TEXT_CHARS = 2_000


@dataclass
class ContinuationCost:
    """What the continuations that branched at one depth cost: how many ended, their environment steps
    (replayed ones included), the replayed steps alone, and the turns of their finished histories."""

    count: int = 0
    steps: int = 0
    replayed: int = 0
    depths: int = 0
    #: what a worker that rebuilt the environment from the history before every turn would have stepped
    uncached_steps: int = 0


@dataclass
class ReplayStats:
    """What restoring cost. A continuation counts once its rollout ends, by the depth it branched at,
    with every step it took (those that restored an environment the cache bound dropped included)."""

    steps: int = 0  # every environment step, bare rollouts' and replayed ones included
    restored_by_snapshot: int = 0
    restored_by_replay: int = 0
    divergences: int = 0
    by_branch_depth: dict[int, ContinuationCost] = field(default_factory=dict)

    @property
    def total(self) -> ContinuationCost:
        total = ContinuationCost()
        for cost in self.by_branch_depth.values():
            for name in ("count", "steps", "replayed", "depths", "uncached_steps"):
                setattr(total, name, getattr(total, name) + getattr(cost, name))
        return total

    @property
    def steps_per_depth(self) -> float | None:
        """Environment steps per continuation over its depth: 1.0 when nothing is stepped twice."""
        total = self.total
        return total.steps / total.depths if total.depths else None


class EnvironmentWorker:
    """Runs `policy` against environments made by `make_env(prompt)`, as the `next_turn` of a
    `RolloutDriver` (pass `on_turn=worker.turn_recorded` too, or build the driver with `driver()`).

    Each turn asks the policy for an action on the `Episode` so far, steps the environment and records
    the turn (`EnvTurn` in `TurnResult.state`). The rollout ends when the environment says done (or
    after `max_steps`), with `outcome(episode)` as its reward (default: the sum of the step rewards).

    Between turns a rollout's environment waits in a bounded cache (`cache_size` environments, least
    recently stored dropped first). A turn that finds none there (a continuation's first turn, or an
    environment the bound dropped) restores the node's state: from the snapshot its turn recorded when
    the environment is a `SnapshotEnvironment` (never replaying), else by a fresh `reset(seed)` and the
    history's actions, each replayed step checked against the recorded one; a mismatch raises
    `ReplayDivergence` naming the tree, node and turn, which fails that rollout only (the driver
    reports it as a failed rollout). `isolate_random` gives every environment its own state of the
    process-global random generators (some environments draw from them).

    For a trainer, the policy returns a `Move` with the tokens it generated; with `observation_ids`
    (an observation's token ids, e.g. the tokenizer's) each turn's `TurnTokens` go on with the
    observation's tokens, masked 0 (the first turn's start with the first observation's), so the
    context of the next turn is the prompt and the turns' tokens.
    """

    def __init__(
        self,
        make_env: Callable[[PromptIn], Environment],
        policy: Policy,
        *,
        outcome: Outcome | None = None,
        seed: Callable[[PromptIn], int] = stable_seed,
        cache_size: int = 1024,
        max_steps: int | None = None,
        isolate_random: bool = True,
        observation_ids: Callable[[object], Sequence[int]] | None = None,
    ) -> None:
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be at least 1 or None, got {max_steps}")
        self._make_env = make_env
        self._policy = policy
        self._outcome = outcome or (lambda episode: episode.total_reward)
        self._seed = seed
        self._max_steps = max_steps
        self._isolate_random = isolate_random
        self._observation_ids = observation_ids
        self._cache = LiveCache(cache_size)
        self.stats = ReplayStats()

    @property
    def cache_stats(self) -> CacheStats:
        return self._cache.stats

    def driver(
        self,
        client: AsyncTraceClient,
        *,
        score: Score | None = None,
        config: DriverConfig | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> RolloutDriver:
        """A driver that runs this worker's rollouts."""
        return RolloutDriver(
            client,
            self.next_turn,
            score=score,
            config=config,
            on_progress=on_progress,
            on_turn=self.turn_recorded,
        )

    def turn_recorded(self, _tree_id: str, node_id: str, turn: TurnResult) -> None:
        """The driver's `on_turn`: remembers each turn's node id, so that errors name the node."""
        if isinstance(turn.state, EnvTurn):
            turn.state.node_id = node_id

    def forget_tree(self, tree_id: str) -> None:
        """Close the cached environments of a tree that is finished."""
        self._cache.drop_tree(tree_id)

    def close(self) -> None:
        """Close every cached environment."""
        self._cache.clear()

    async def next_turn(self, history: History) -> TurnResult:
        """The driver's `next_turn`: one action of the policy on the environment at `history`'s end."""
        live, episode = self._environment_at(history)
        try:
            move = self._policy(episode)
            if inspect.isawaitable(move):
                move = await move
            if not isinstance(move, Move):
                move = Move(move)
            step = live.step(move.action)
            self.stats.steps += 1
            before = episode
            steps = (*episode.steps, (move.action, step.observation, step.reward))
            episode = Episode(episode.prompt, episode.start, steps, history)
            done = step.done or (self._max_steps is not None and len(episode.steps) >= self._max_steps)
            record = EnvTurn(
                key=uuid.uuid4().hex,
                seed=self._seed_of(history),
                action=move.action,
                observation=step.observation,
                reward=float(step.reward),
                done=step.done,
                start=episode.start if history.depth == 0 else None,
                snapshot=None if done else live.snapshot(),
                branch_depth=live.start_depth,
                rollout_steps=live.steps,
                rollout_replayed=live.replayed,
            )
            reward = float(self._outcome(episode)) if done else None
        except BaseException:
            live.close()  # the rollout fails here: its environment has no node to wait at
            raise
        if done:
            self._count(live, len(episode.steps))
            live.close()
        else:
            self._cache.put((history.tree_id, record.key), live)
        text = move.text if move.text is not None else f"{move.action}\n{step.observation}"[:_TEXT_CHARS]
        tokens = self._tokens(move, before, step.observation)
        return TurnResult(
            text=text, done=done, reward=reward, features=move.features, tokens=tokens, state=record
        )

    def _tokens(self, move: Move, before: Episode, observation: object) -> TurnTokens | None:
        """The move's tokens followed by the observation's (masked 0) when `observation_ids` is given;
        a first turn starts with the first observation's, so the turns' tokens hold the whole episode."""
        if move.tokens is None or self._observation_ids is None:
            return move.tokens
        lead = list(self._observation_ids(before.start)) if not before.steps else []
        tail = list(self._observation_ids(observation))
        logprobs = move.tokens.logprobs
        return TurnTokens(
            (*lead, *move.tokens.ids, *tail),
            mask=(*[0] * len(lead), *move.tokens.loss_mask, *[0] * len(tail)),
            logprobs=None if logprobs is None else (*[0.0] * len(lead), *logprobs, *[0.0] * len(tail)),
        )

    def _seed_of(self, history: History) -> int:
        first = history.turns[0].state if history.turns else None
        return first.seed if isinstance(first, EnvTurn) else self._seed(history.prompt)

    def _environment_at(self, history: History) -> tuple[Live, Episode]:
        """The environment at the end of `history` (taken out of the cache, restored, or fresh) and the
        episode so far."""
        if history.depth == 0:
            seed = self._seed(history.prompt)
            live = self._fresh(history.prompt, seed, start_depth=0)
            try:
                start = live.reset(seed)
            except BaseException:
                live.close()
                raise
            return live, Episode(history.prompt, start, history=history)
        episode = Episode.of(history)
        last = history.turns[-1].state
        assert isinstance(last, EnvTurn)  # Episode.of checked every turn's record
        continuation, last.followed = last.followed, True
        cached = self._cache.take((history.tree_id, last.key))
        if cached is not None:
            return cached, episode
        if continuation:
            live = self._fresh(history.prompt, last.seed, start_depth=history.depth)
        else:  # the rollout's own next turn, its environment dropped from the cache: its costs go on
            live = self._fresh(history.prompt, last.seed, start_depth=last.branch_depth)
            live.steps, live.replayed = last.rollout_steps, last.rollout_replayed
        try:
            if isinstance(last.snapshot, Snapshot):
                live.restore(last.snapshot)
                self.stats.restored_by_snapshot += 1
            else:
                self._replay(live, history, last.seed)
                self.stats.restored_by_replay += 1
        except BaseException:
            live.close()
            raise
        return live, episode

    def _fresh(self, prompt: PromptIn, seed: int, *, start_depth: int) -> Live:
        if not self._isolate_random:
            return Live(self._make_env(prompt), None, start_depth)
        rng = GlobalRandom(seed)  # some environments draw from the global generators as they are made
        return Live(rng.run(self._make_env, prompt), rng, start_depth)

    def _replay(self, live: Live, history: History, seed: int) -> None:
        """Reset from `seed` and replay the history's actions, checking each outcome against the record."""
        records = [turn.state for turn in history.turns if isinstance(turn.state, EnvTurn)]
        start = live.reset(seed)
        if start != records[0].start:
            self.stats.divergences += 1
            raise ReplayDivergence(history.tree_id, _node(records[0]), 0, records[0].start, start)
        for turn, record in enumerate(records, start=1):
            replayed = live.step(record.action)
            self.stats.steps += 1
            live.replayed += 1
            if replayed != record.step():
                self.stats.divergences += 1
                raise ReplayDivergence(history.tree_id, _node(record), turn, record.step(), replayed)

    def _count(self, live: Live, depth: int) -> None:
        """A finished rollout's cost, when it is a continuation (it started past the prompt)."""
        if live.start_depth == 0:
            return
        cost = self.stats.by_branch_depth.setdefault(live.start_depth, ContinuationCost())
        cost.count += 1
        cost.steps += live.steps
        cost.replayed += live.replayed
        cost.depths += depth
        cost.uncached_steps += sum(range(live.start_depth + 1, depth + 1))


def _node(record: EnvTurn) -> str:
    return record.node_id or f"(turn key {record.key})"
