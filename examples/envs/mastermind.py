"""GEM's Mastermind through the service: TRACE against uniform allocation at the same budget, with every
continuation resuming the game's state at its node (`trace_client.envs`).

    .venv/bin/python examples/envs/mastermind.py            # an in-process service on the embedded store
    .venv/bin/python examples/envs/mastermind.py --url http://127.0.0.1:8000

The game: GEM's `game:Mastermind-v0-easy` made with a 3-digit code over the digits 1-6 (no repeats) and
6 guesses; each prompt is one secret code (its seed). A rollout's reward is 1.0 when it cracks the code,
else 0.0. The game draws its code from Python's global `random`, and GEM has no snapshot of its own:
by default continuations restore a node by replaying its guesses from the seed (each replayed answer
checked); `--snapshots` deep-copies the game after every turn instead; `--cache-size 0` keeps no live
game between turns, so every turn restores its node (what the cache saves).

The policy stands where an LLM's next turn would go: a scripted stochastic player. Its skill rule,
fixed once: prompt k has skill s = SKILLS[k % 5]; at each turn, with probability s it guesses a code
drawn uniformly from those consistent with every answer so far, otherwise one drawn uniformly from the
codes it has not guessed yet. So a prompt's success rate rises with its skill, and where in a game a
continuation branches matters: after a lucky consistent guess it is easier to finish.

It prints, per allocation policy, the trees, the mixed ones (leaves with a success and a failure: a
group with a learning signal), the turns with a non-zero advantage, the environment steps spent and the
signal per 100 steps; then what restoring the continuations cost, by the depth they branched at:
environment steps per continuation against its depth (at most 1.5x with the cache), and what a worker
that rebuilt the game from its history before every turn would have stepped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from trace_client import AsyncTraceClient
from trace_client.driver import DriverConfig
from trace_client.envs import DeepCopySnapshots, Environment, EnvironmentWorker, Episode, GemEnvironment
from trace_proto import AllocateRequest, Policy, PromptIn

GAME = "game:Mastermind-v0-easy"
GAME_KWARGS = {"code_length": 3, "num_numbers": 6, "max_turns": 6}
SKILLS = (0.1, 0.3, 0.5, 0.7, 0.9)
CODES = list(itertools.permutations(range(1, GAME_KWARGS["num_numbers"] + 1), GAME_KWARGS["code_length"]))
_ANSWER = re.compile(r"guessed \[([\d, ]+)\]\. This guess receives (\d+) black peg\(s\) and (\d+) white")


def pegs(code: tuple[int, ...], guess: tuple[int, ...]) -> tuple[int, int]:
    """Mastermind's answer to `guess` when the secret is `code`: (black, white) pegs."""
    black = sum(a == b for a, b in zip(code, guess, strict=True))
    return black, len(set(code) & set(guess)) - black


class ScriptedPlayer:
    """The scripted stochastic policy of the module doc (the slot an LLM's next turn fills)."""

    def __init__(self, skills: dict[str, float], seed: int) -> None:
        self._skills = skills
        self._rng = random.Random(seed)

    def __call__(self, episode: Episode) -> str:
        answers = [_parse(observation) for _, observation, _ in episode.steps]
        guessed = {answer[0] for answer in answers if answer is not None}
        fresh = [code for code in CODES if code not in guessed]
        consistent = [
            code
            for code in fresh
            if all(answer is None or pegs(code, answer[0]) == answer[1] for answer in answers)
        ]
        if consistent and self._rng.random() < self._skills[episode.prompt.prompt_id]:
            guess = self._rng.choice(consistent)
        else:
            guess = self._rng.choice(fresh)
        return "\\boxed{" + " ".join(map(str, guess)) + "}"


def _parse(observation: object) -> tuple[tuple[int, ...], tuple[int, int]] | None:
    match = _ANSWER.search(str(observation))
    if match is None:
        return None
    guess = tuple(int(digit) for digit in match.group(1).split(","))
    return guess, (int(match.group(2)), int(match.group(3)))


def cracked(episode: Episode) -> float:
    """The rollout's reward: 1.0 when the game ended with the code found."""
    return 1.0 if str(episode.observation).startswith("Congratulations") else 0.0


@dataclass
class Run:
    """One allocation policy's steps, summed."""

    policy: Policy
    trees: int = 0
    mixed: int = 0
    leaves: int = 0
    successes: int = 0
    signal: int = 0  # turns with a non-zero advantage


async def run_policy(url: str, policy: Policy, args: argparse.Namespace, worker: EnvironmentWorker) -> Run:
    prompts = [PromptIn(prompt_id=f"code-{k}", metadata={"seed": k}) for k in range(args.prompts)]
    job, run = f"mastermind-{policy.value}-{uuid.uuid4().hex[:6]}", Run(policy)
    async with AsyncTraceClient(url) as client:
        driver = worker.driver(client, config=DriverConfig(concurrency=16, poll_interval=0.1))
        for step in range(args.steps):
            result = await driver.run_step(
                AllocateRequest(
                    job=job, step=step, budget=args.budget, expansion=1.0, policy=policy, prompts=prompts
                )
            )
            for finished in result.trees:
                tree = finished.tree
                leaves = [node for node in tree.nodes if node.reward is not None]
                run.trees += 1
                run.mixed += tree.mixed
                run.leaves += len(leaves)
                run.successes += sum(node.reward is not None and node.reward >= 0.5 for node in leaves)
                run.signal += sum(
                    node.advantage is not None and abs(node.advantage) > 1e-9 for node in tree.nodes
                )
                worker.forget_tree(tree.tree_id)
    return run


def make_worker(args: argparse.Namespace) -> EnvironmentWorker:
    skills = {f"code-{k}": SKILLS[k % len(SKILLS)] for k in range(args.prompts)}

    def make_env(_prompt: PromptIn) -> Environment:
        game = GemEnvironment(GAME, **GAME_KWARGS)
        return DeepCopySnapshots(game) if args.snapshots else game

    return EnvironmentWorker(
        make_env, ScriptedPlayer(skills, args.seed), outcome=cracked, cache_size=args.cache_size
    )


@contextlib.contextmanager
def service(url: str | None) -> Iterator[str]:
    """`url`, or an in-process service on the embedded store."""
    if url is not None:
        yield url
        return
    from trace_lab.local import ThreadedService
    from trace_service.app import create_app
    from trace_service.settings import Settings

    settings = Settings(
        store_url="", data_dir="", train_interval_seconds=0.5, torch_threads=1, log_level="WARNING"
    )
    with ThreadedService(create_app(settings)) as live:
        yield live.url


def table(header: list[str], rows: list[list[object]]) -> str:
    """Columns right-aligned to their widest cell; floats with two decimals."""
    cells = [
        header,
        *[[f"{cell:.2f}" if isinstance(cell, float) else str(cell) for cell in row] for row in rows],
    ]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    return "\n".join(
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in cells
    )


def report(runs: list[tuple[Run, EnvironmentWorker]]) -> None:
    rows: list[list[object]] = []
    for run, worker in runs:
        steps = worker.stats.steps
        per_100 = 100 * run.signal / steps if steps else 0.0
        rows.append(
            [run.policy.value, run.trees, run.mixed, run.leaves, run.successes, run.signal, steps, per_100]
        )
    print(
        table(["policy", "trees", "mixed", "leaves", "wins", "signal", "env steps", "signal/100 steps"], rows)
    )
    for run, worker in runs:
        stats = worker.stats
        print(
            f"\nrestoring continuations ({run.policy.value}): {stats.restored_by_replay} by replay,"
            f" {stats.restored_by_snapshot} by snapshot, {stats.divergences} diverged"
        )
        costs = [*sorted(stats.by_branch_depth.items()), ("all", stats.total)]
        rows = [
            [
                depth,
                cost.count,
                cost.replayed / cost.count,
                cost.steps / cost.count,
                cost.depths / cost.count,
                cost.steps / cost.depths,
                cost.uncached_steps / cost.depths,
            ]
            for depth, cost in costs
            if cost.count
        ]
        header = ["branch depth", "continuations", "replayed", "env steps", "depth", "steps/depth"]
        print(table([*header, "uncached steps/depth"], rows))
        ratio = stats.steps_per_depth
        shown = "-" if ratio is None else f"{ratio:.2f}"
        print(f"environment steps per continuation / its depth: {shown} (target <= 1.50)")
        cache = worker.cache_stats
        print(
            f"live-state cache: {cache.hits} hits, {cache.misses} misses, {cache.evictions} evictions,"
            f" bound {cache.capacity}"
        )


async def compare(url: str, args: argparse.Namespace) -> list[tuple[Run, EnvironmentWorker]]:
    runs = []
    for policy in (Policy.TRACE, Policy.UNIFORM):
        worker = make_worker(args)
        try:
            runs.append((await run_policy(url, policy, args, worker), worker))
        finally:
            worker.close()
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="a running service (default: one in this process)")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--budget", type=int, default=80, help="bare rollouts per step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--snapshots", action="store_true", help="restore by deep copy instead of replay")
    parser.add_argument(
        "--cache-size", type=int, default=64, help="live environments kept between turns (0: none)"
    )
    args = parser.parse_args(argv)
    with service(args.url) as url:
        report(asyncio.run(compare(url, args)))


if __name__ == "__main__":
    main()
