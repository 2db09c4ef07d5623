"""What the service holds as training goes on: store bytes per turn and per tree, each job's predictor,
the store's size step after step, the service's memory, and how long it takes to stop.

    python bench/footprint.py [--steps 100] [--jobs 50] [--job-steps 1] [--retention 5]

The service runs in this process, on its embedded store (a redis-server of its own, whose ``INFO
memory`` gives the figures), with its background loops slowed so that the benchmark drives them: each
step allocates ``--prompts`` prompts of ``--rollouts`` bare rollouts of ``--turns`` turns of
``--turn-bytes`` bytes of text on average (half to one and a half times as much; ids as long as
uuids), completes them, reads every tree as a trainer does (``GET
/v1/trees/{id}``) and runs a round of the predictors' training.  Finished trees that were read and
learned from expire ``--retention`` seconds later (``TRACE_TREE_RETENTION_SECONDS``; a benchmark-only
window, the setting's least is 60 s), so the store should stop growing once a window's steps have
passed.

1. One steady job for ``--steps`` steps: bytes per in-flight turn beyond its text (what the trees'
   keys grow by, ``MEMORY USAGE``, as the turns of one step are applied before any rollout ends), per
   retained tree, the store (``used_memory``) after 10, 50 and 100 steps.
2. ``--jobs`` jobs for ``--job-steps`` steps each: bytes of each job's predictor state in the store,
   the store and the service's resident memory, and the time the service takes to stop (its lifespan's
   end: set down every predictor it trains, close the store) with all of them, against one job.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch
from fastapi import FastAPI

from trace_proto import AllocateRequest, ExpandEvent, Policy, PromptIn
from trace_service.app import create_app
from trace_service.engine import Engine
from trace_service.settings import Settings

_ids = itertools.count()


@dataclass
class Options:
    prompts: int
    rollouts: int
    turns: int
    turn_bytes: int


def words(size: int, seed: int) -> str:
    """``size`` bytes of varied text (a job's turns do not repeat: their hashed tokens spread)."""
    vocabulary = [f"w{(seed * 7919 + i * 104729) % 50_000}" for i in range(size // 4 + 1)]
    return " ".join(vocabulary)[:size]


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.asynccontextmanager
async def service(data_dir: str, retention: int) -> AsyncIterator[tuple[FastAPI, Engine]]:
    settings = Settings(
        data_dir=data_dir,
        store_prefix="bench",
        train_interval_seconds=3600,  # the benchmark trains when a step is done
        train_steps_per_round=10,
        sweep_interval_seconds=3600,
        torch_threads=1,
        predictor_device="cpu",
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        engine: Engine = app.state.engine
        engine.store.retention = retention  # below the setting's least (60 s): a short benchmark
        yield app, engine


async def store_bytes(engine: Engine) -> int:
    used, _ = await engine.store.memory()
    return used


async def one_step(
    engine: Engine, job: str, step: int, options: Options, *, in_flight: list[int] | None = None
) -> int:
    """Allocate, play and finish one step of ``job``; read its trees; train.  With ``in_flight``, the
    bytes the step's turns took before any rollout ended, and their text, are appended to it."""
    prompts = [
        PromptIn(prompt_id=f"{job}-p{i}", text=words(400, step * 1000 + i)) for i in range(options.prompts)
    ]
    request = AllocateRequest(
        job=job,
        step=step,
        budget=options.prompts * options.rollouts,
        expansion=0.0,
        policy=Policy.UNIFORM,
        prompts=prompts,
    )
    answer = await engine.allocation.allocate(request, None)
    chains: list[tuple[str, list[ExpandEvent]]] = []
    for tree in answer.trees:
        for _ in range(tree.rollouts):
            parent = None
            events = []
            for _ in range(options.turns):
                n = next(_ids)
                size = options.turn_bytes // 2 + n * 7919 % (options.turn_bytes + 1)  # ½ to 1½ times
                events.append(
                    ExpandEvent(
                        event_id=f"{n:032x}",  # ids as long as a worker's uuids
                        tree_id=tree.tree_id,
                        node_id=f"{(1 << 64) + n:032x}",
                        parent_id=parent,
                        text=words(size, n),
                        done=False,
                    )
                )
                parent = events[-1].node_id
            chains.append((tree.tree_id, events))
    tree_ids = [tree.tree_id for tree in answer.trees]
    before = await trees_bytes(engine, tree_ids) if in_flight is not None else 0
    turns = [event for _, events in chains for event in events]
    for start in range(0, len(turns), 512):
        await engine.intake.expand(turns[start : start + 512])
    if in_flight is not None:
        used = await trees_bytes(engine, tree_ids) - before
        in_flight += [used, sum(len(e.text or "") for e in turns), len(turns)]
    ends = []
    for index, (tree_id, events) in enumerate(chains):
        n = next(_ids)
        ends.append(
            ExpandEvent(
                event_id=f"{n:032x}", tree_id=tree_id, node_id=f"{(1 << 64) + n:032x}",
                parent_id=events[-1].node_id, text="answer", done=True, reward=float(index % 3 == 0),
            )
        )  # fmt: skip
    await engine.intake.expand(ends)
    for tree in answer.trees:
        await engine.trees.tree(tree.tree_id)  # the trainer reads it
    await engine.predictors.refresh(train=True)
    return tree_ids


async def trees_bytes(engine: Engine, tree_ids: list[str]) -> int:
    """What the trees' keys take in Redis (``MEMORY USAGE``, every value sampled): their own bytes,
    without what Redis buffers beside them (its append-only file's buffer holds the last writes)."""
    keys = [key for tree_id in tree_ids for key in engine.store.keys.tree(tree_id).all]
    return sum([await engine.store.redis.memory_usage(key, samples=0) or 0 for key in keys])


async def steady_job(options: Options, steps: int, retention: int) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        async with service(data_dir, retention) as (_, engine):
            in_flight: list[int] = []
            sizes: dict[int, int] = {}
            tree_ids = await one_step(engine, "steady", 0, options, in_flight=in_flight)
            retained = await trees_bytes(engine, tree_ids) / len(tree_ids)
            began = time.monotonic()
            for step in range(1, steps + 1):
                await one_step(engine, "steady", step, options)
                if step in (10, 50, 100) or step == steps:
                    sizes[step] = await store_bytes(engine)
            seconds = time.monotonic() - began
            used, text, turns = in_flight
            shape = f"{options.prompts} prompts x {options.rollouts} rollouts x {options.turns} turns"
            print(
                f"one job, {shape} of {options.turn_bytes} B per step, retention {retention} s "
                f"({seconds / steps:.2f} s a step):"
            )
            print(
                f"  per in-flight turn: {used / turns:,.0f} B in the store, of which text "
                f"{text / turns:,.0f} B: {(used - text) / turns:,.0f} B beside its text"
            )
            print(
                f"  per retained tree (read, learned, in its window): {retained:,.0f} B "
                f"({options.rollouts * (options.turns + 1)} turns)"
            )
            for step, size in sizes.items():
                print(f"  store after {step:>3} steps: {size / 1e6:7.1f} MB")


async def many_jobs(options: Options, jobs: int, job_steps: int, retention: int) -> None:
    for count in (1, jobs):
        with tempfile.TemporaryDirectory() as data_dir:
            async with service(data_dir, retention) as (_, engine):
                for step in range(job_steps):
                    for job in range(count):
                        await one_step(engine, f"job{job}", step, options)
                states = []
                for job in range(count):
                    whole = await engine.store.redis.strlen(engine.store.keys.predictor_state(f"job{job}"))
                    weights = await engine.store.redis.hstrlen(engine.store.keys.weights(f"job{job}"), "blob")
                    states.append((int(whole), int(weights)))
                resident = len(engine.predictors._resident)
                size = await store_bytes(engine)
                info = await engine.store.redis.info("memory")
                service_rss = rss_bytes()
                began = time.monotonic()
            stopped = time.monotonic() - began
        set_down = [whole + weights for whole, weights in states if whole]
        redis_rss = int(info["used_memory_rss"])
        print(
            f"{count} job(s), {job_steps} steps each: store {size / 1e6:.1f} MB (redis RSS "
            f"{redis_rss / 1e6:.1f} MB), service RSS {service_rss / 1e6:.0f} MB, "
            f"{resident} predictors in memory"
        )
        if set_down:
            print(
                f"  predictor state per job in the store (set down + published): median "
                f"{statistics.median(set_down) / 1e6:.1f} MB, largest {max(set_down) / 1e6:.1f} MB"
            )
        print(f"  shutdown (set down {resident} trained predictors, close the store): {stopped:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100, help="steps of the steady job")
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--job-steps", type=int, default=1, help="steps of each of the many jobs")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4, help="turns before a rollout's scored answer")
    parser.add_argument("--turn-bytes", type=int, default=2048)
    parser.add_argument("--retention", type=int, default=5, help="seconds a read, learned tree is kept")
    parser.add_argument("--skip-steady", action="store_true")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.pop("TRACE_STORE_URL", None)
    options = Options(arguments.prompts, arguments.rollouts, arguments.turns, arguments.turn_bytes)
    if not arguments.skip_steady:
        asyncio.run(steady_job(options, arguments.steps, arguments.retention))
    asyncio.run(many_jobs(options, arguments.jobs, arguments.job_steps, arguments.retention))


if __name__ == "__main__":
    main()
