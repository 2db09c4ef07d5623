"""Service latency and throughput over real HTTP, next to redis-benchmark on the same machine.

    python bench/service.py [--prompts 1024] [--budget 16384] [--events 20000] [--batch 100] [--rate 10000]

Starts a throwaway redis-server and one `trace-rollout serve` process (both on loopback), then:
  1. /v1/allocate with B prompts of about 200 words and budget M, one call at a time after a warm-up
     call: latency percentiles;
  2. /v1/expand with bare rollouts of fresh trees in batches of whole rollouts (Stage 2 decisions
     included: they run inline when a tree's last bare rollout is reported), twice:
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
import gc
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.load import free_port, percentile


def wait_until_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not become ready")


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
    async with httpx2.AsyncClient(base_url=url, timeout=60.0, headers=JSON) as client:
        for body in bodies:
            start = time.perf_counter()
            response = await client.post("/v1/allocate", content=body)
            times.append(time.perf_counter() - start)
            response.raise_for_status()
    return times[1:]


@dataclass
class ExpandRun:
    """What one /v1/expand phase measured."""

    events: int
    seconds: float
    latencies: list[float]
    accepted: int
    instructions: int

    @property
    def rate(self) -> float:
        return self.events / self.seconds


async def expand_bodies(
    url: str, job: str, total_events: int, batch: int, turn_words: int, rng: random.Random
) -> list[bytes]:
    """Fresh trees (8 bare rollouts of 5 turns each, no Stage 1 skipping) and their turns as /v1/expand
    bodies of ``batch`` events.  A batch holds whole rollouts (a parent travels with its children), so
    batches sent concurrently never wait for one another; every eighth-rollout group completes a tree
    and triggers its Stage 2 decision inline."""
    turns_per_rollout, rollouts_per_tree = 5, 8
    trees_needed = -(-total_events // (turns_per_rollout * rollouts_per_tree))
    prompts = [{"prompt_id": f"{job}-q{i}", "text": prompt_text(rng)} for i in range(trees_needed)]
    async with httpx2.AsyncClient(base_url=url, timeout=60.0) as client:
        response = await client.post(
            "/v1/allocate",
            json={"job": job, "step": 0, "budget": trees_needed * rollouts_per_tree,
                  "min_rollouts": rollouts_per_tree, "max_rollouts": rollouts_per_tree, "prompts": prompts},
        )  # fmt: skip
        response.raise_for_status()
    events = []
    counter = itertools.count()
    for tree in response.json()["trees"]:
        for rollout in range(rollouts_per_tree):
            parent = None
            for turn in range(turns_per_rollout):
                n = next(counter)
                last = turn == turns_per_rollout - 1
                events.append(
                    {"event_id": f"{job}-e{n}", "tree_id": tree["tree_id"], "node_id": f"n{n}",
                     "parent_id": parent, "text": " ".join(rng.choices(WORDS, k=turn_words)), "done": last,
                     "reward": float(rollout % 2) if last else None}
                )  # fmt: skip
                parent = f"n{n}"
    events = events[:total_events]
    return [json.dumps({"events": events[i : i + batch]}).encode() for i in range(0, len(events), batch)]


async def warm_client(url: str, connections: int) -> httpx2.AsyncClient:
    """A client with ``connections`` open keep-alive connections (their set-up is not the service's)."""
    client = httpx2.AsyncClient(
        base_url=url,
        timeout=60.0,
        headers=JSON,
        limits=httpx2.Limits(max_connections=connections, max_keepalive_connections=connections),
    )
    await asyncio.gather(*(client.get("/healthz") for _ in range(connections)))
    return client


async def saturate(url: str, bodies: list[bytes], workers: int) -> ExpandRun:
    """Closed loop: ``workers`` workers each send their next batch as soon as the previous one is
    answered.  The throughput is the service's capacity; the latency is mostly time spent queueing."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    run = ExpandRun(sum(body.count(b'"event_id"') for body in bodies), 0.0, [], 0, 0)
    client = await warm_client(url, workers)

    async def worker() -> None:
        while not queue.empty():
            body = queue.get_nowait()
            start = time.perf_counter()
            answer = await client.post("/v1/expand", content=body)
            run.latencies.append(time.perf_counter() - start)
            record(run, answer)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    run.seconds = time.perf_counter() - start
    await client.aclose()
    return run


async def offer(url: str, bodies: list[bytes], events_per_second: float, connections: int) -> ExpandRun:
    """Open loop: batch i is due at i·(batch size)/rate whatever happened before, and its latency runs
    from when it was due (time spent waiting for a free connection counts: no coordinated omission)."""
    run = ExpandRun(sum(body.count(b'"event_id"') for body in bodies), 0.0, [], 0, 0)
    client = await warm_client(url, connections)
    # The load generator's own collector pauses would show up as the service's latency.
    gc.collect()
    gc.disable()
    loop = asyncio.get_running_loop()
    interval = run.events / len(bodies) / events_per_second
    begin = loop.time() + 0.05

    async def send(index: int, body: bytes) -> None:
        due = begin + index * interval
        await asyncio.sleep(max(0.0, due - loop.time()))
        answer = await client.post("/v1/expand", content=body)
        run.latencies.append(loop.time() - due)
        record(run, answer)

    try:
        await asyncio.gather(*(send(index, body) for index, body in enumerate(bodies)))
    finally:
        gc.enable()
    run.seconds = loop.time() - begin
    await client.aclose()
    return run


def record(run: ExpandRun, answer: httpx2.Response) -> None:
    answer.raise_for_status()
    reply = answer.json()
    run.accepted += reply["accepted"]
    run.instructions += len(reply["instructions"])


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
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as directory:
        redis_port, port = free_port(), free_port()
        redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
                directory,
            ],
            stdout=subprocess.DEVNULL,
        )
        env = {
            **os.environ,
            "TRACE_STORE_URL": f"redis://127.0.0.1:{redis_port}/0",
            "TRACE_LOG_LEVEL": "WARNING",
        }
        command = [sys.executable, "-m", "trace_service.cli", "serve", "--port", str(port)]
        service = subprocess.Popen(command, env=env, cwd=Path(directory))
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_ready(url)
            allocate = asyncio.run(bench_allocate(url, args.prompts, args.budget, args.allocate_repeats))
            rng = random.Random(1)
            saturation_bodies = asyncio.run(
                expand_bodies(url, "bench-saturate", args.events, args.batch, args.turn_words, rng)
            )
            offered_bodies = asyncio.run(
                expand_bodies(url, "bench-offered", args.events, args.batch, args.turn_words, rng)
            )
            cpu_before = cpu_seconds(service.pid)
            saturated = asyncio.run(saturate(url, saturation_bodies, args.workers))
            service_cpu = cpu_seconds(service.pid) - cpu_before
            offered = asyncio.run(offer(url, offered_bodies, args.rate, args.connections))
            reference = redis_benchmark(redis_port)
        finally:
            service.terminate()
            service.wait(timeout=60)
            redis.terminate()
            redis.wait(timeout=30)
    p50, p99 = statistics.median(allocate) * 1e3, percentile(allocate, 0.99) * 1e3
    print(f"/v1/allocate  B={args.prompts} M={args.budget}, 200-word prompts, {args.allocate_repeats} calls:")
    print(f"    p50 {p50:.1f} ms   p99 {p99:.1f} ms")
    print(
        f"/v1/expand    batches of {args.batch} events (whole rollouts of 5 turns of {args.turn_words} words;"
        " a tree's last batch runs its Stage 2 decision inline):"
    )
    for label, run in (
        (f"capacity, {args.workers} workers back to back", saturated),
        (f"offered {args.rate:,.0f} events/s, open loop", offered),
    ):
        p50, p99 = statistics.median(run.latencies) * 1e3, percentile(run.latencies, 0.99) * 1e3
        print(
            f"    {label:38s} {run.rate:8,.0f} events/s   batch p50 {p50:6.1f} ms   p99 {p99:6.1f} ms"
            f"   ({run.accepted}/{run.events} accepted, {run.instructions} instructions)"
        )
    print(
        f"    service process CPU at capacity: {saturated.events / service_cpu:,.0f} events per CPU-second"
        " (the load generator and Redis share the same cores)"
    )
    print(f"redis-benchmark (same redis-server, physical reference): {reference}")


if __name__ == "__main__":
    main()
