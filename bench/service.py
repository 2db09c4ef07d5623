"""Service latency and throughput over real HTTP, next to redis-benchmark on the same machine.

    python bench/service.py [--prompts 1024] [--budget 16384] [--events 20000] [--batch 100] [--rate 10000]

Starts a throwaway redis-server and the measured `trace-rollout serve` process (serving only) with a
second replica that trains the predictor (`--trainer same`: the measured process trains), all on
loopback, then:
  0. warm-up: 100 trees of one job through the whole flow until the service predicts with trained
     weights; a separate trainer then stops;
then, for each count in --jobs (1 and 50 by default), with the traffic spread over that many jobs, each
starting from a copy of the warm-up job's predictor (so every measured call pays a real forward pass,
and with 50 jobs, 50 predictors serve side by side):
  1. /v1/allocate with B prompts of about 200 words and budget M, one call at a time after a warm-up
     call per job: latency percentiles;
  2. /v1/expand with fresh trees: bare rollouts, the Stage 2 decisions they trigger inline, the
     continuations the instructions ask for and the completions they make, in batches of whole
     rollouts, twice:
     a. capacity: closed loop, each of --workers workers sends its next batch when the previous one is
        answered: events/s, and the service process's events per CPU-second;
     b. latency at a given load: open loop at --rate events/s, each batch's latency counted from when
        it was due (no coordinated omission): p50 and p99;
  3. redis-benchmark (SET, GET) on the same server as the physical reference.
Later counts are also reported as ratios to the first, measured in the same run.
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


#: The job the warm-up trains; every measured job starts from a copy of its predictor.
WARM_UP_JOB = "bench-warm-up"


async def bench_allocate(url: str, prompts: int, budget: int, repeats: int, jobs: list[str]) -> list[float]:
    """Latency of /v1/allocate calls, one at a time, taking the jobs in turn, after one warm-up call per
    job (its first, which copies the warm-up job's predictor).  Bodies are encoded before the clock
    starts: the client's JSON encoding of a megabyte is not the service's time."""
    rng = random.Random(0)
    pool = [{"prompt_id": f"p{i}", "text": prompt_text(rng)} for i in range(prompts)]

    def body(call: int) -> bytes:
        job, step = jobs[call % len(jobs)], call // len(jobs)
        fields = {"job": job, "step": step, "budget": budget, "max_rollouts": 64, "prompts": pool}
        return json.dumps(fields | ({"predictor_from": WARM_UP_JOB} if step == 0 else {})).encode()

    bodies = [body(call) for call in range(len(jobs) + repeats)]
    times = []
    async with httpx.AsyncClient(base_url=url, timeout=60.0, headers=JSON) as client:
        for content in bodies:
            start = time.perf_counter()
            response = await client.post("/v1/allocate", content=content)
            times.append(time.perf_counter() - start)
            response.raise_for_status()
    return times[len(jobs) :]


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


async def new_trees(url: str, job: str, step: int, trees: int, rng: random.Random) -> list[str]:
    """Allocate ``trees`` prompts ``ROLLOUTS`` bare rollouts each (no Stage 1 skipping), expansion 1."""
    prompts = [{"prompt_id": f"{job}-{step}-q{i}", "text": prompt_text(rng)} for i in range(trees)]
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        response = await client.post(
            "/v1/allocate",
            json={"job": job, "step": step, "budget": trees * ROLLOUTS, "min_rollouts": ROLLOUTS,
                  "max_rollouts": ROLLOUTS, "expansion": 1.0, "prompts": prompts,
                  "predictor_from": WARM_UP_JOB},
        )  # fmt: skip
        response.raise_for_status()
    return [tree["tree_id"] for tree in response.json()["trees"]]


async def workload(
    url: str, jobs: list[str], step: int, trees: int, args: argparse.Namespace, rng: random.Random
) -> Workload:
    """``trees`` fresh trees spread over the jobs, their rollouts interleaved: batches mix the jobs."""
    shares = [trees // len(jobs) + (k < trees % len(jobs)) for k in range(len(jobs))]
    by_job = [
        await new_trees(url, job, step, share, rng) for job, share in zip(jobs, shares, strict=True) if share
    ]
    interleaved = [tree for row in itertools.zip_longest(*by_job) for tree in row if tree is not None]
    return Workload(interleaved, args.batch, args.turn_words, rng)


async def warm_up(url: str, args: argparse.Namespace, rng: random.Random) -> int:
    """Run 100 trees through the whole flow, then wait (up to two minutes) until the service predicts
    with trained weights; returns their version."""
    await saturate(url, await workload(url, [WARM_UP_JOB], 0, 100, args, rng), args.workers)
    deadline = time.monotonic() + 120.0
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        while time.monotonic() < deadline:
            version = int((await client.get("/v1/predictor", params={"job": WARM_UP_JOB})).json()["version"])
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


@dataclass
class Measured:
    """One pass of the measurements with the traffic spread over ``jobs`` jobs."""

    jobs: int
    allocate: list[float]
    saturated: ExpandRun
    offered: ExpandRun
    service_cpu: float


def measure(url: str, pid: int, jobs: int, args: argparse.Namespace) -> Measured:
    """/v1/allocate, then /v1/expand at capacity and at the offered rate, over ``jobs`` jobs each with
    its own predictor (a copy of the warm-up job's: every call pays a real forward pass)."""
    names = [f"bench-{jobs}-{k}" for k in range(jobs)]
    allocate = asyncio.run(bench_allocate(url, args.prompts, args.budget, args.allocate_repeats, names))
    rng = random.Random(1)
    trees = max(1, round(args.events / 60))  # about 40 bare and 20 continuation events per tree
    capacity_step, offered_step = 10_000, 10_001  # after every allocate call's step
    saturation = asyncio.run(workload(url, names, capacity_step, trees, args, rng))
    offered_load = asyncio.run(workload(url, names, offered_step, trees, args, rng))
    cpu_before = cpu_seconds(pid)
    saturated = asyncio.run(saturate(url, saturation, args.workers))
    service_cpu = cpu_seconds(pid) - cpu_before
    offered = asyncio.run(offer(url, offered_load, args.rate, args.connections))
    for run, step in ((saturated, capacity_step), (offered, offered_step)):
        for job in names:
            stats = httpx.get(f"{url}/v1/jobs/{job}/stats", timeout=60.0).json()["steps"]
            run.trees += sum(entry["active"] for entry in stats if entry["step"] == step)
            run.completed += sum(entry["trees_complete"] for entry in stats if entry["step"] == step)
    return Measured(jobs, allocate, saturated, offered, service_cpu)


def report(measured: Measured, args: argparse.Namespace) -> dict[str, float]:
    """Print one pass; its headline figures by name."""
    allocate = measured.allocate
    figures = {
        "allocate p50 ms": statistics.median(allocate) * 1e3,
        "allocate p99 ms": percentile(allocate, 0.99) * 1e3,
    }
    jobs = f"{measured.jobs} job" + ("s" if measured.jobs > 1 else "")
    print(f"--- {jobs}, each with its own predictor (the calls and trees take the jobs in turn)")
    print(f"/v1/allocate  B={args.prompts} M={args.budget}, 200-word prompts, {args.allocate_repeats} calls:")
    print(f"    p50 {figures['allocate p50 ms']:.1f} ms   p99 {figures['allocate p99 ms']:.1f} ms")
    print(
        f"/v1/expand    {measured.saturated.trees} trees each way: 8 bare rollouts of 5 turns of "
        f"{args.turn_words} words, then the continuations their instructions ask for; batches of up to "
        f"{args.batch} events:"
    )
    for name, label, run in (
        ("capacity", f"capacity, {args.workers} workers back to back", measured.saturated),
        ("offered", f"offered {args.rate:,.0f} events/s, open loop", measured.offered),
    ):
        p50, p99 = statistics.median(run.latencies) * 1e3, percentile(run.latencies, 0.99) * 1e3
        figures |= {f"{name} events/s": run.rate, f"{name} p50 ms": p50, f"{name} p99 ms": p99}
        print(
            f"    {label:38s} {run.rate:8,.0f} events/s   batch p50 {p50:6.1f} ms   p99 {p99:6.1f} ms"
            f"   ({run.accepted}/{run.events} accepted, {run.completed}/{run.trees} trees complete)"
        )
    figures["events per CPU-s"] = measured.saturated.events / measured.service_cpu
    print(
        f"    service process CPU at capacity: {figures['events per CPU-s']:,.0f} events per CPU-second"
        " (the load generator and Redis share the same cores)"
    )
    return figures


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
        "--jobs",
        default="1,50",
        help="comma-separated job counts: one pass of every measurement per count, the traffic spread over"
        " that many jobs, each with its own predictor; later passes are also given as ratios to the first",
    )
    parser.add_argument(
        "--trainer",
        choices=["separate", "same"],
        default="separate",
        help="train the predictor in a second replica (TRACE_TRAINER=false on the measured one) or in the"
        " measured one",
    )
    parser.add_argument("--trainer-threads", type=int, default=1, help="torch threads of a separate trainer")
    args = parser.parse_args()
    job_counts = [int(count) for count in args.jobs.split(",")]
    if not job_counts or min(job_counts) < 1:
        parser.error("--jobs takes counts of at least 1")

    # Every measured job's predictor stays in memory, beside the warm-up job's.
    settings = {"TRACE_LOG_LEVEL": "WARNING", "TRACE_PREDICTOR_MAX_JOBS": str(sum(job_counts) + 1)}
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
        try:
            for process in (service, trainer):
                if process is not None:
                    process.wait_ready()
            # Warm-up: complete some trees and wait for trained weights, which every measured job copies
            # (version 0 would answer from the prior alone).  A separate trainer then stops, as if it
            # trained elsewhere (a GPU): the measured process is the only one serving.
            version = asyncio.run(warm_up(service.url, args, random.Random(2)))
            if trainer is not None:
                trainer.stop()
            passes = [measure(service.url, service.process.pid, jobs, args) for jobs in job_counts]
            reference = redis_benchmark(redis.port)
        finally:
            for process in (service, trainer):
                if process is not None:
                    process.stop()
            redis.stop()
    figures = [report(measured, args) for measured in passes]
    for measured, later in zip(passes[1:], figures[1:], strict=True):
        ratios = "   ".join(f"{name} {later[name] / figures[0][name]:.2f}" for name in figures[0])
        print(f"{measured.jobs} jobs against {passes[0].jobs}, same run: {ratios}")
    print(
        f"predictor: the warm-up job's v{version}, copied by every measured job, trained "
        + (
            "by a second replica, stopped before the measurements"
            if args.trainer == "separate"
            else "in the measured process, which goes on training"
        )
    )
    print(f"redis-benchmark (same redis-server, physical reference): {reference}")


if __name__ == "__main__":
    main()
