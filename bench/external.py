"""Mixed groups on environments nobody on the team wrote: Gymnasium's FrozenLake (random maps) and
Taxi, each prompt one task of the package's own, driven through the service by a scripted stochastic
agent on the product's environment layer (`trace_client.envs`), every arm its own job of one service.

    python bench/external.py                                   # both environments, 3 seeds, see --help
    python bench/external.py --env taxi --seeds 1 --steps 3     # a smoke run

The tasks.  `frozen_lake`: prompt k is the 6×6 map `generate_random_map(size=6, p=0.8, seed=k)` of
Gymnasium; the rollout ends in a hole, at the goal (success) or after 20 turns.  `taxi`: prompt k is
Taxi's start `reset(seed=k)` (taxi, passenger and destination); the rollout ends at the drop-off
(success) or after 25 turns.  Both are deterministic given the actions, as a tool environment is given
an LLM's calls, so every branch's diversity is the agent's.  The prompt's text is what a model would
be shown: the map's rows, or Taxi's ANSI rendering of the start.

The agent's skill rule, fixed once before the first run and never tuned: with probability `SKILL`
(0.7 on FrozenLake, 0.6 on Taxi) it takes the action of a shortest path to success from where it
stands (breadth-first over the package's own transitions), else an action drawn uniformly.  It stands
for an LLM policy of middling skill; the tasks' difficulty comes from the package (the map's holes,
the distances to the passenger and the destination), not from us.

Each turn is one action through `EnvironmentWorker`; a continuation restores its node's environment by
the worker's checked replay of the prefix from the task's seed, as a user's worker would.

Reported per environment: every arm's mixed groups per generated turn and per rollout over GRPO's flat
groups (`uniform`: M(1+N) bare rollouts dealt evenly), its mean policy share, the environment steps
each continuation cost over its depth, and the service's gain estimate against the real uniform arm
(`uniform_tree`), as `bench/learning.py` reports it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gain import checks, print_report
from bench.learning import SERVICE_SETTINGS, chosen_arms, fresh_job
from bench.learning_arms import PILOT_SUFFIX, UNIFORM, Arm
from bench.protocol import comma_list, mean_spread
from trace_client import AsyncTraceClient
from trace_client.driver import DriverConfig, RolloutDriver
from trace_client.envs import Environment, EnvironmentWorker, Episode, GymnasiumEnvironment, ReplayStats
from trace_lab.local import RedisServer, ServiceProcess
from trace_proto import GainEstimate, PromptIn
from trace_service.allocation.gain import ArmSums

FROZEN_LAKE_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # FrozenLake's actions: left, down, right, up
TAXI_ACTIONS = 6


def _distances_to(goal_states: Sequence[int], predecessors: dict[int, list[int]]) -> dict[int, int]:
    """Breadth-first distances from every state that reaches one of the goal states."""
    distance = dict.fromkeys(goal_states, 0)
    queue = deque(goal_states)
    while queue:
        state = queue.popleft()
        for before in predecessors.get(state, []):
            if before not in distance:
                distance[before] = distance[state] + 1
                queue.append(before)
    return distance


class Task:
    """A Gymnasium toy-text task family: prompts, their environments and the skill rule's best action."""

    name: str
    actions: int
    max_turns: int
    skill: float

    def text(self, prompt: int) -> str:
        raise NotImplementedError

    def make_env(self, prompt: int) -> Environment:
        raise NotImplementedError

    def best_action(self, prompt: int, state: int) -> int:
        raise NotImplementedError


class FrozenLake(Task):
    name, actions, max_turns, skill = "frozen_lake", 4, 20, 0.7

    def __init__(self) -> None:
        self._layouts: dict[int, list[str]] = {}
        self._distances: dict[int, dict[int, int]] = {}

    def layout(self, prompt: int) -> list[str]:
        if prompt not in self._layouts:
            from gymnasium.envs.toy_text.frozen_lake import generate_random_map

            self._layouts[prompt] = generate_random_map(size=6, p=0.8, seed=prompt)
        return self._layouts[prompt]

    def text(self, prompt: int) -> str:
        return "frozen lake, reach G from S avoiding holes H: " + " / ".join(self.layout(prompt))

    def make_env(self, prompt: int) -> Environment:
        return GymnasiumEnvironment("FrozenLake-v1", desc=self.layout(prompt), is_slippery=False)

    def best_action(self, prompt: int, state: int) -> int:
        rows = self.layout(prompt)
        if prompt not in self._distances:
            cells = "".join(rows)
            intended: dict[int, list[int]] = {}
            for s, cell in enumerate(cells):
                if cell not in "HG":
                    for action in range(self.actions):
                        intended.setdefault(self._moved(rows, s, action), []).append(s)
            self._distances[prompt] = _distances_to([cells.index("G")], intended)
        distance = self._distances[prompt]
        return min(range(self.actions), key=lambda a: distance.get(self._moved(rows, state, a), 10**6))

    @staticmethod
    def _moved(rows: list[str], state: int, action: int) -> int:
        """Where the action leads (FrozenLake's move rule: a move into the edge stays put)."""
        size = len(rows)
        row, col = divmod(state, size)
        d_row, d_col = FROZEN_LAKE_MOVES[action]
        return min(max(row + d_row, 0), size - 1) * size + min(max(col + d_col, 0), size - 1)


class Taxi(Task):
    name, actions, max_turns, skill = "taxi", TAXI_ACTIONS, 25, 0.6

    def __init__(self) -> None:
        import gymnasium as gym

        self._renderer = gym.make("Taxi-v4", render_mode="ansi")
        self._table = self._renderer.unwrapped.P
        predecessors: dict[int, list[int]] = {}
        for s, moves in self._table.items():
            for transitions in moves.values():
                _, after, _, terminated = transitions[0]
                # -1 stands for the episode's end: the drop-off at the destination.
                predecessors.setdefault(-1 if terminated else after, []).append(s)
        self._distance = _distances_to([-1], predecessors)

    def text(self, prompt: int) -> str:
        self._renderer.reset(seed=prompt)
        return "taxi: pick up the passenger and drop them at the destination\n" + str(self._renderer.render())

    def make_env(self, _prompt: int) -> Environment:
        return GymnasiumEnvironment("Taxi-v4")

    def best_action(self, _prompt: int, state: int) -> int:
        def to_go(action: int) -> int:
            _, after, _, terminated = self._table[state][action][0]
            return 0 if terminated else self._distance.get(after, 10**6) + 1

        return min(range(self.actions), key=to_go)


TASKS = {"frozen_lake": FrozenLake, "taxi": Taxi}


def task_of(prompt: PromptIn) -> int:
    return int(prompt.prompt_id.rsplit("-", 1)[1])


def scripted_worker(task: Task, rng: np.random.Generator) -> EnvironmentWorker:
    """The skill rule as the policy of an `EnvironmentWorker`: success is a last step that paid."""

    def policy(episode: Episode) -> int:
        if rng.random() < task.skill:
            observation = episode.observation
            assert isinstance(observation, int)
            return task.best_action(task_of(episode.prompt), observation)
        return int(rng.integers(task.actions))

    def success(episode: Episode) -> float:
        return float(bool(episode.steps) and episode.steps[-1][2] > 0)

    return EnvironmentWorker(
        lambda prompt: task.make_env(task_of(prompt)),
        policy,
        outcome=success,
        seed=task_of,
        max_steps=task.max_turns,
    )


@dataclass
class Tally:
    """One arm's run: what `bench.gain` reads, and its cost and mixed groups."""

    mixed: int = 0
    turns: int = 0
    rollouts: int = 0
    shares: list[float] = field(default_factory=list)
    replay: ReplayStats | None = None
    policy_trees: ArmSums = field(default_factory=ArmSums)
    control_trees: ArmSums = field(default_factory=ArmSums)
    estimate: GainEstimate | None = None
    trust: float | None = None


async def run_arm_step(
    arm: Arm, job: str, driver: RolloutDriver, task: Task, step: int, pool: Sequence[int], tally: Tally
) -> None:
    request = arm.request(
        job=job,
        step=step,
        budget=arm.budget,
        prompts=[
            PromptIn(prompt_id=f"{task.name}-{k}", text=task.text(k), metadata={"seed": k}) for k in pool
        ],
    )
    result = await driver.run_step(request)
    split = result.allocation.split
    tally.shares.append(1.0 if split is None else split.policy_share)
    for finished in result.trees:
        tree = finished.tree
        leaves = sum(node.reward is not None for node in tree.nodes)
        tally.mixed += tree.mixed
        tally.turns += len(tree.nodes)
        tally.rollouts += leaves
        sums = ArmSums.of_tree(mixed=tree.mixed, bare=tree.rollouts, turns=len(tree.nodes))
        if tree.control:
            tally.control_trees += sums
        else:
            tally.policy_trees += sums


async def run_seed(
    task: Task, seed: int, arms: Sequence[Arm], args: argparse.Namespace, url: str
) -> dict[str, Tally]:
    client = AsyncTraceClient(url, timeout=120.0)
    tallies = {arm.name: Tally() for arm in arms}
    jobs = {arm.name: fresh_job("external", task.name, f"s{seed}", arm.name) for arm in arms}
    workers = {
        arm.name: scripted_worker(task, np.random.default_rng([seed, *arm.name.encode()])) for arm in arms
    }
    drivers = {
        arm.name: workers[arm.name].driver(
            client, config=DriverConfig(concurrency=4 * arm.budget + 64, step_timeout=args.step_timeout)
        )
        for arm in arms
    }
    order = np.random.default_rng(seed).permutation(args.prompts)
    started = time.perf_counter()
    try:
        for step in range(args.steps):
            start = step * args.pool % args.prompts
            pool = [int(k) + seed * args.prompts for k in np.roll(order, -start)[: args.pool]]
            await asyncio.gather(
                *(
                    run_arm_step(arm, jobs[arm.name], drivers[arm.name], task, step, pool, tallies[arm.name])
                    for arm in arms
                )
            )
            print(
                f"[{time.perf_counter() - started:6.1f}s] {task.name} seed {seed} step {step + 1}",
                file=sys.stderr,
            )
        for arm in arms:
            tallies[arm.name].estimate = (await client.job_stats(jobs[arm.name])).gain
            tallies[arm.name].replay = workers[arm.name].stats
            workers[arm.name].close()
    finally:
        await client.aclose()
    return tallies


def ratio(tally: Tally, flat: Tally, unit: str) -> float:
    mine, theirs = getattr(tally, unit), getattr(flat, unit)
    return (tally.mixed / mine) / (flat.mixed / theirs) if mine and theirs and flat.mixed else float("nan")


def print_summary(results: dict[str, dict[int, dict[str, Tally]]]) -> None:
    print("\nMixed groups against GRPO's flat groups (uniform), mean ± std over seeds; environment steps per")
    print("continuation over its depth (the replay's cost)")
    header = f"{'env':<12} {'arm':<14} {'mixed/turn':>14} {'mixed/rollout':>14} {'policy share':>14}"
    header += f" {'steps/depth':>12}"
    print(header)
    print("-" * len(header))
    for env, per_seed in results.items():
        for name in next(iter(per_seed.values())):
            rows = [tallies[name] for tallies in per_seed.values()]
            flats = [tallies[UNIFORM] for tallies in per_seed.values()]
            per_turn = [ratio(r, f, "turns") for r, f in zip(rows, flats, strict=True)]
            per_rollout = [ratio(r, f, "rollouts") for r, f in zip(rows, flats, strict=True)]
            shares = [statistics.fmean(r.shares) for r in rows]
            replay = [None if r.replay is None else r.replay.steps_per_depth for r in rows]
            print(
                f"{env:<12} {name:<14} {mean_spread(per_turn):>14} {mean_spread(per_rollout):>14} "
                f"{mean_spread(shares):>14} {mean_spread(replay, none='—'):>12}"
            )


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--env", default=",".join(TASKS), help=f"comma list of {', '.join(TASKS)}")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--prompts", type=int, default=512, help="tasks per seed: one recurs every prompts/B steps"
    )
    parser.add_argument("--pool", type=int, default=128, help="prompts offered each step (B)")
    parser.add_argument("--budget", type=int, default=256, help="bare rollouts per step (M)")
    parser.add_argument("--expansion", type=float, default=1.0, help="continuations per bare rollout (N)")
    parser.add_argument("--arms", default="uniform,uniform_tree,trace,trace~0", help="as bench/learning.py's")
    parser.add_argument("--pilot-share", type=float, default=0.5, help=f"for an arm <policy>{PILOT_SUFFIX}")
    parser.add_argument("--step-timeout", type=float, default=300.0)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = argument_parser()
    args = parser.parse_args(argv)
    unknown = [env for env in comma_list(args.env) if env not in TASKS]
    if unknown:
        parser.error(f"unknown environments {unknown}; choose from {', '.join(TASKS)}")
    arms = [arm for arm in chosen_arms(parser, args) if arm.policy is not None]
    results: dict[str, dict[int, dict[str, Tally]]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        redis = RedisServer(Path(directory), append_only=False).start()
        try:
            for env in comma_list(args.env):
                task = TASKS[env]()
                for seed in range(args.seeds):
                    settings = {**SERVICE_SETTINGS, "TRACE_STORE_PREFIX": f"external-{env}-{seed}",
                                "TRACE_PREDICTOR_MAX_JOBS": str(len(arms))}  # fmt: skip
                    with ServiceProcess(redis.url, Path(directory), settings) as service:
                        service.wait_ready()
                        results.setdefault(env, {})[seed] = asyncio.run(
                            run_seed(task, seed, arms, args, service.url)
                        )
        finally:
            redis.stop()
    print_summary(results)
    print_report(checks(results))
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
