"""Service latency and throughput over real HTTP, next to redis-benchmark on the same machine.

    python bench/service.py [--prompts 1024] [--budget 16384] [--events 20000] [--batch 100] [--rate 10000]

Starts a throwaway redis-server and the measured `trace-rollout serve` process (serving only) with a
second replica that trains the predictor (`--trainer same`: the measured process trains), all on
loopback, then:
  0. warm-up: 100 trees through the whole flow until the service predicts with trained weights; a
     separate trainer then stops, so every measured call pays for a real forward pass;
  1. /v1/allocate with B prompts of about 200 words and budget M, one call at a time after a warm-up
     call: latency percentiles;
  2. /v1/expand with fresh trees: bare rollouts, the Stage 2 decisions they trigger inline, the
     continuations the instructions ask for and the completions they make, in batches of whole
     rollouts, twice:
     a. capacity: closed loop, each of --workers workers sends its next batch when the previous one is
        answered: events/s, and the service process's events per CPU-second;
     b. latency at a given load: open loop at --rate events/s, each batch's latency counted from when
        it was due (no coordinated omission): p50 and p99;
  3. redis-benchmark (SET, GET) on the same server as the physical reference.
Client connections are opened before the clock starts.  Everything runs on 127.0.0.1 and stops by itself;
the load generator, Redis and the service share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from trace_lab.load import percentile
from trace_lab.local import RedisServer, ServiceProcess


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


WORDS = [f"w{i}" for i in range(5000)]
JSON = {"content-type": "application/json"}


def prompt_text(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=200))


async def bench_allocate(url: str, prompts: int, budget: int, repeats: int) -> list[float]:
    """Latency of /v1/allocate calls, one at a time, after one warm-up call.  Bodies are encoded before
    the clock starts: the client's JSON encoding of a megabyte is not the service's time."""
    rng = random.Random(0)
    pool = [{"prompt_id": f"p{i}", "text": prompt_text(rng)} for i in range(prompts)]
    bodies = [
        json.dumps(
            {"job": "bench-allocate", "step": step, "budget": budget, "max_rollouts": 64, "prompts": pool}
        ).encode()
        for step in range(repeats + 1)
    ]
    times = []
    async with httpx.AsyncClient(base_url=url, timeout=60.0, headers=JSON) as client:
        for body in bodies:
            start = time.perf_counter()
            response = await client.post("/v1/allocate", content=body)
            times.append(time.perf_counter() - start)
            response.raise_for_status()
    return times[1:]


@dataclass
class ExpandRun:
    """What one /v1/expand phase measured."""

    events: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    accepted: int = 0
    trees: int = 0
    completed: int = 0

    @property
    def rate(self) -> float:
        return self.events / self.seconds


#: Turns of a bare rollout and bare rollouts per tree.
TURNS, ROLLOUTS = 5, 8


class Workload:
    """The /v1/expand traffic of fresh trees: their bare rollouts, prepared up front, then the
    continuations their Stage 2 instructions ask for, made as the answers come back.

    A batch holds whole rollouts (a parent travels with its children), so batches in flight never
    wait for one another.  A tree's last bare rollout triggers its Stage 2 decision inline; its last
    continuation completes it, which records the prompt's outcome and trains the predictor.
    """

    def __init__(self, trees: list[str], batch: int, turn_words: int, rng: random.Random) -> None:
        self.batch, self.turn_words, self.rng = batch, turn_words, rng
        self.nodes = itertools.count()
        self.depth: dict[str, int] = {}  # node → its turn (1 … TURNS): where a continuation resumes
        self.in_flight = 0
        self.failed = False
        self.waiting: list[list[dict[str, object]]] = []  # continuation rollouts not yet in a batch
        bare = [self.rollout(tree, None, 0, None, float(r % 2)) for tree in trees for r in range(ROLLOUTS)]
        self.bare = self.pack(bare)
        self.continuations: collections.deque[tuple[bytes, int]] = collections.deque()

    def rollout(
        self, tree: str, parent: str | None, depth: int, instruction: str | None, reward: float
    ) -> list[dict[str, object]]:
        events: list[dict[str, object]] = []
        for turn in range(depth + 1, TURNS + 1):
            node = f"n{next(self.nodes)}"
            last = turn == TURNS
            events.append(
                {"event_id": f"e-{node}", "tree_id": tree, "node_id": node, "parent_id": parent,
                 "text": " ".join(self.rng.choices(WORDS, k=self.turn_words)), "done": last,
                 "reward": reward if last else None,
                 "instruction_id": instruction if turn == depth + 1 else None}
            )  # fmt: skip
            self.depth[node], parent = turn, node
        return events

    def pack(self, rollouts: list[list[dict[str, object]]]) -> collections.deque[tuple[bytes, int]]:
        """Whole rollouts into bodies of at most ``batch`` events, with their event counts."""
        bodies: collections.deque[tuple[bytes, int]] = collections.deque()
        current: list[dict[str, object]] = []
        for rollout in rollouts:
            if current and len(current) + len(rollout) > self.batch:
                bodies.append((json.dumps({"events": current}).encode(), len(current)))
                current = []
            current.extend(rollout)
        if current:
            bodies.append((json.dumps({"events": current}).encode(), len(current)))
        return bodies

    def next(self) -> tuple[bytes, int] | None:
        """The next body to send (continuations first), counted in flight from now on until
        :meth:`answered`; None when nothing is ready now."""
        if not self.continuations and self.waiting and (not self.bare or self.in_flight == 0):
            self.continuations, self.waiting = self.pack(self.waiting), []
        for source in (self.continuations, self.bare):
            if source:
                self.in_flight += 1
                return source.popleft()
        return None

    def answered(self, reply: dict[str, Any]) -> None:
        """Make the continuations a batch's answer asks for; the batch is no longer in flight."""
        self.in_flight -= 1
        for instruction in reply["instructions"]:
            node = instruction["node_id"]
            for _ in range(instruction["count"]):
                reward = float(self.rng.random() < 0.5)
                self.waiting.append(
                    self.rollout(
                        instruction["tree_id"], node, self.depth[node], instruction["instruction_id"], reward
                    )
                )
        if sum(len(rollout) for rollout in self.waiting) >= self.batch:
            self.continuations.extend(self.pack(self.waiting))
            self.waiting = []

    @property
    def finished(self) -> bool:
        return self.failed or not (self.bare or self.continuations or self.waiting or self.in_flight)


async def new_trees(url: str, job: str, trees: int, rng: random.Random) -> list[str]:
    """Allocate ``trees`` prompts ``ROLLOUTS`` bare rollouts each (no Stage 1 skipping), expansion 1."""
    prompts = [{"prompt_id": f"{job}-q{i}", "text": prompt_text(rng)} for i in range(trees)]
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        response = await client.post(
            "/v1/allocate",
            json={"job": job, "step": 0, "budget": trees * ROLLOUTS, "min_rollouts": ROLLOUTS,
                  "max_rollouts": ROLLOUTS, "expansion": 1.0, "prompts": prompts},
        )  # fmt: skip
        response.raise_for_status()
    return [tree["tree_id"] for tree in response.json()["trees"]]


async def workload(url: str, job: str, trees: int, args: argparse.Namespace, rng: random.Random) -> Workload:
    return Workload(await new_trees(url, job, trees, rng), args.batch, args.turn_words, rng)


async def warm_up(url: str, args: argparse.Namespace, rng: random.Random) -> int:
    """Run 100 trees through the whole flow, then wait (up to two minutes) until the service predicts
    with trained weights; returns their version."""
    await saturate(url, await workload(url, "bench-warm-up", 100, args, rng), args.workers)
    deadline = time.monotonic() + 120.0
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        while time.monotonic() < deadline:
            version = int((await client.get("/v1/predictor")).json()["version"])
            if version > 0:
                return version
            await asyncio.sleep(0.2)
    raise TimeoutError("no trained predictor weights after the warm-up")


async def warm_client(url: str, connections: int) -> httpx.AsyncClient:
    """A client with ``connections`` open keep-alive connections (their set-up is not the service's)."""
    client = httpx.AsyncClient(
        base_url=url,
        timeout=60.0,
        headers=JSON,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )
    await asyncio.gather(*(client.get("/healthz") for _ in range(connections)))
    return client


async def post(
    client: httpx.AsyncClient, workload: Workload, run: ExpandRun, item: tuple[bytes, int]
) -> None:
    body, events = item
    try:
        answer = await client.post("/v1/expand", content=body)
        answer.raise_for_status()
        reply = answer.json()
    except BaseException:
        workload.failed = True  # stop the run: what this batch would have started never comes
        raise
    workload.answered(reply)
    run.events += events
    run.accepted += reply["accepted"]


async def saturate(url: str, workload: Workload, workers: int) -> ExpandRun:
    """Closed loop: ``workers`` workers each send the next ready batch as soon as their previous one is
    answered.  The throughput is the service's capacity; the latency is mostly time spent queueing."""
    run = ExpandRun()
    client = await warm_client(url, workers)

    async def worker() -> None:
        while not workload.finished:
            item = workload.next()
            if item is None:  # continuations will come with answers still in flight
                await asyncio.sleep(0.001)
                continue
            start = time.perf_counter()
            await post(client, workload, run, item)
            run.latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    run.seconds = time.perf_counter() - start
    await client.aclose()
    return run


async def offer(url: str, workload: Workload, events_per_second: float, connections: int) -> ExpandRun:
    """Open loop at ``events_per_second``: each batch is due (its size)/rate after the one before,
    whatever happened to that one; when nothing is ready (continuations still being decided) the
    schedule moves on.  A batch's latency runs from when it was due (time spent waiting for a free
    connection counts: no coordinated omission)."""
    run = ExpandRun()
    client = await warm_client(url, connections)
    # The load generator's own collector pauses would show up as the service's latency.
    gc.collect()
    gc.disable()
    loop = asyncio.get_running_loop()
    begin = due = loop.time() + 0.05

    async def send(item: tuple[bytes, int], due: float) -> None:
        await post(client, workload, run, item)
        run.latencies.append(loop.time() - due)

    sent = []
    try:
        while not workload.finished:
            await asyncio.sleep(max(0.0, due - loop.time()))
            item = workload.next()
            if item is None:
                due += 0.001
                continue
            sent.append(asyncio.ensure_future(send(item, due)))
            due += item[1] / events_per_second
        await asyncio.gather(*sent)
    finally:
        gc.enable()
    run.seconds = loop.time() - begin
    await client.aclose()
    return run


def redis_benchmark(port: int) -> str:
    if shutil.which("redis-benchmark") is None:
        return "redis-benchmark not installed"
    out = subprocess.run(
        ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "--csv", "-n", "100000", "-t", "set,get"],
        capture_output=True, text=True, timeout=120, check=False,
    ).stdout  # fmt: skip
    rows = [line.replace('"', "").split(",") for line in out.strip().splitlines()[1:]]
    return ", ".join(f"{row[0]} {float(row[1]):,.0f} req/s (p50 {row[4]} ms)" for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=16384)
    parser.add_argument("--allocate-repeats", type=int, default=20)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--workers", type=int, default=8, help="closed-loop workers for the capacity run")
    parser.add_argument("--rate", type=float, default=10_000, help="events/s offered in the open-loop run")
    parser.add_argument("--connections", type=int, default=16, help="connections of the open-loop run")
    parser.add_argument("--turn-words", type=int, default=40)
    parser.add_argument(
        "--trainer",
        choices=["separate", "same"],
        default="separate",
        help="train the predictor in a second replica (TRACE_TRAINER=false on the measured one) or in the"
        " measured one",
    )
    parser.add_argument("--trainer-threads", type=int, default=1, help="torch threads of a separate trainer")
    args = parser.parse_args()

    settings = {"TRACE_LOG_LEVEL": "WARNING"}
    separate = args.trainer == "separate"
    with tempfile.TemporaryDirectory() as directory:
        redis = RedisServer(Path(directory), append_only=False).start()
        service = ServiceProcess(
            redis.url, Path(directory), {**settings, "TRACE_TRAINER": str(not separate).lower()}
        ).start()
        # The deployed topology: serving replicas, and one replica that trains (and serves no traffic).
        trainer = (
            ServiceProcess(
                redis.url, Path(directory), {**settings, "TRACE_TORCH_THREADS": str(args.trainer_threads)}
            ).start()
            if separate
            else None
        )
        url = service.url
        try:
            for process in (service, trainer):
                if process is not None:
                    process.wait_ready()
            # Warm-up: complete some trees and wait for trained weights, so that every call below pays
            # for a real forward pass (version 0 answers from the prior alone).  A separate trainer then
            # stops, as if it trained elsewhere (a GPU): the measured process is the only one serving.
            version = asyncio.run(warm_up(url, args, random.Random(2)))
            if trainer is not None:
                trainer.stop()
            allocate = asyncio.run(bench_allocate(url, args.prompts, args.budget, args.allocate_repeats))
            rng = random.Random(1)
            # About 40 bare and 20 continuation events per tree.
            trees = max(1, round(args.events / 60))
            saturation = asyncio.run(workload(url, "bench-capacity", trees, args, rng))
            offered_load = asyncio.run(workload(url, "bench-offered", trees, args, rng))
            cpu_before = cpu_seconds(service.process.pid)
            saturated = asyncio.run(saturate(url, saturation, args.workers))
            service_cpu = cpu_seconds(service.process.pid) - cpu_before
            offered = asyncio.run(offer(url, offered_load, args.rate, args.connections))
            for run, job in ((saturated, "bench-capacity"), (offered, "bench-offered")):
                stats = httpx.get(f"{url}/v1/jobs/{job}/stats", timeout=60.0).json()["steps"]
                run.trees = sum(step["active"] for step in stats)
                run.completed = sum(step["trees_complete"] for step in stats)
            reference = redis_benchmark(redis.port)
        finally:
            for process in (service, trainer):
                if process is not None:
                    process.stop()
            redis.stop()
    p50, p99 = statistics.median(allocate) * 1e3, percentile(allocate, 0.99) * 1e3
    print(f"/v1/allocate  B={args.prompts} M={args.budget}, 200-word prompts, {args.allocate_repeats} calls:")
    print(f"    p50 {p50:.1f} ms   p99 {p99:.1f} ms")
    print(
        f"/v1/expand    {trees} trees each way: 8 bare rollouts of 5 turns of {args.turn_words} words, then"
        f" the continuations their instructions ask for; batches of up to {args.batch} events:"
    )
    for label, run in (
        (f"capacity, {args.workers} workers back to back", saturated),
        (f"offered {args.rate:,.0f} events/s, open loop", offered),
    ):
        p50, p99 = statistics.median(run.latencies) * 1e3, percentile(run.latencies, 0.99) * 1e3
        print(
            f"    {label:38s} {run.rate:8,.0f} events/s   batch p50 {p50:6.1f} ms   p99 {p99:6.1f} ms"
            f"   ({run.accepted}/{run.events} accepted, {run.completed}/{run.trees} trees complete)"
        )
    print(
        f"    service process CPU at capacity: {saturated.events / service_cpu:,.0f} events per CPU-second"
        " (the load generator and Redis share the same cores)"
    )
    print(
        f"predictor: v{version} after the warm-up, trained "
        + (
            "by a second replica, stopped before the measurements"
            if args.trainer == "separate"
            else "in the measured process, which goes on training"
        )
    )
    print(f"redis-benchmark (same redis-server, physical reference): {reference}")


if __name__ == "__main__":
    main()
