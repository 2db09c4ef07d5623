"""Service latency and throughput over real HTTP, next to redis-benchmark on the same machine.

    python bench/service.py [--prompts 1024] [--budget 16384] [--events 20000] [--batch 100]

Starts a throwaway redis-server and one `trace-rollout serve` process (both on loopback), then:
  1. /v1/allocate with B prompts of about 200 words and budget M: latency percentiles;
  2. /v1/expand: bare rollouts reported in batches by concurrent workers: events/s and batch latency
     percentiles (Stage 2 decisions included, as they happen inline);
  3. redis-benchmark (SET, EVALSHA-free) on the same server as the physical reference.
Everything runs on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
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


async def bench_expand(
    url: str, total_events: int, batch: int, workers: int
) -> tuple[float, list[float], int]:
    turns_per_rollout, rollouts_per_tree = 5, 8
    trees_needed = total_events // (turns_per_rollout * rollouts_per_tree) + 1
    async with httpx2.AsyncClient(base_url=url, timeout=60.0) as client:
        prompts = [{"prompt_id": f"q{i}", "text": "solve the task"} for i in range(trees_needed)]
        response = await client.post(
            "/v1/allocate",
            json={"job": "bench-expand", "step": 0, "budget": trees_needed * rollouts_per_tree,
                  "min_rollouts": rollouts_per_tree, "max_rollouts": rollouts_per_tree, "prompts": prompts},
        )  # fmt: skip
        response.raise_for_status()
        trees = [t["tree_id"] for t in response.json()["trees"]]
        counter = itertools.count()
        events = []
        for tree_id in trees:
            for r in range(rollouts_per_tree):
                parent = None
                for t in range(turns_per_rollout):
                    n = next(counter)
                    last = t == turns_per_rollout - 1
                    events.append(
                        {"event_id": f"e{n}", "tree_id": tree_id, "node_id": f"n{n}", "parent_id": parent,
                         "text": f"thought {t} action observation", "done": last,
                         "reward": float(r % 2) if last else None}
                    )  # fmt: skip
                    parent = f"n{n}"
        events = events[:total_events]
        batches = [
            json.dumps({"events": events[i : i + batch]}).encode() for i in range(0, len(events), batch)
        ]
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        for item in batches:
            queue.put_nowait(item)
        latencies: list[float] = []
        instructions = 0

        async def worker() -> None:
            nonlocal instructions
            async with httpx2.AsyncClient(base_url=url, timeout=60.0, headers=JSON) as own:
                while not queue.empty():
                    item = queue.get_nowait()
                    start = time.perf_counter()
                    answer = await own.post("/v1/expand", content=item)
                    latencies.append(time.perf_counter() - start)
                    answer.raise_for_status()
                    instructions += len(answer.json()["instructions"])

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        elapsed = time.perf_counter() - start
    return len(events) / elapsed, latencies, instructions


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
    parser.add_argument("--workers", type=int, default=8)
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
            cpu_before = cpu_seconds(service.pid)
            rate, latencies, instructions = asyncio.run(
                bench_expand(url, args.events, args.batch, args.workers)
            )
            service_cpu = cpu_seconds(service.pid) - cpu_before
            reference = redis_benchmark(redis_port)
        finally:
            service.terminate()
            service.wait(timeout=60)
            redis.terminate()
            redis.wait(timeout=30)
    p50, p99 = statistics.median(allocate) * 1e3, percentile(allocate, 0.99) * 1e3
    print(f"/v1/allocate  B={args.prompts} M={args.budget}, 200-word prompts, {args.allocate_repeats} calls:")
    print(f"    p50 {p50:.1f} ms   p99 {p99:.1f} ms")
    p50, p99 = statistics.median(latencies) * 1e3, percentile(latencies, 0.99) * 1e3
    print(
        f"/v1/expand    {args.events} events in batches of {args.batch}, {args.workers} concurrent workers:"
    )
    print(
        f"    {rate:,.0f} events/s   batch p50 {p50:.1f} ms   p99 {p99:.1f} ms  ({instructions} instructions)"
    )
    print(
        f"    service process CPU {service_cpu:.1f} s: {args.events / service_cpu:,.0f} events per CPU-second"
        " (the load generator and Redis share the same cores)"
    )
    print(f"redis-benchmark (same redis-server, physical reference): {reference}")


if __name__ == "__main__":
    main()
