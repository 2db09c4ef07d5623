"""Liveness under hostile and heavy requests: does `/healthz` keep answering while one request works?

    python bench/liveness.py [--store embedded|redis] [--tree-nodes 131072] [--sizes 8K,64K,1M,8M,30M]

Starts `trace-rollout serve` as a subprocess, the trainer on, on the embedded store (a redis-server of
its own in a data directory) or on a throwaway redis-server, then, with a probe thread asking
`/healthz` every 20 ms throughout:

1. hostile bodies: `POST /v1/expand` with bodies of each shape of :func:`hostile_bodies` at growing
   sizes: the answer's time and status, and the probe's slowest answer while it ran;
2. a large finished tree: one prompt, R rollouts of D turns (`--tree-nodes` = R·D), reported in
   batches and finished: the probe's slowest answer while the batches are applied, while the
   service trains on the tree, and while `GET /v1/trees/{id}` reads it back;
3. (embedded store) kill -9 of the store's redis-server: seconds until `/readyz` answers 200 again
   without a restart of the service, the probe's slowest answer meanwhile, and whether the large tree
   is still whole.

Prints one markdown table.  A request that gets no answer within `--timeout` shows `> T s`, and the
service is started afresh before the next case (a request that never ends keeps its process busy).
Everything runs on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from trace_lab.liveness import HealthProbe, allocate_one_tree, hostile_bodies, turn_events
from trace_lab.local import RedisServer, ServiceProcess


@dataclass
class Row:
    case: str
    answer: str
    slowest_health: float


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def timed(call: Callable[[], httpx.Response], timeout: float) -> tuple[float, str]:
    """Seconds to the answer and its status (``> timeout`` when none came)."""
    start = time.monotonic()
    try:
        status = str(call().status_code)
    except httpx.TimeoutException:
        return timeout, f"> {timeout:.0f} s"
    return time.monotonic() - start, status


class Bench:
    def __init__(self, args: argparse.Namespace, directory: Path) -> None:
        self.args = args
        self.directory = directory
        self.data_dir = Path(tempfile.mkdtemp(prefix="trace-live-", dir="/tmp"))  # a short socket path
        self.redis: RedisServer | None = None
        self.service: ServiceProcess | None = None
        self.rows: list[Row] = []

    @property
    def url(self) -> str:
        assert self.service is not None
        return self.service.url

    def start(self) -> None:
        if self.args.store == "redis" and self.redis is None:
            self.redis = RedisServer(self.directory / "redis").start()
        environment = {
            "TRACE_DATA_DIR": str(self.data_dir),
            "TRACE_TRAIN_INTERVAL_SECONDS": "0.5",
            "TRACE_TORCH_THREADS": "1",
            "TRACE_LOG_LEVEL": "WARNING",
            "TRACE_STORE_PREFIX": f"live{time.monotonic_ns()}",
        }
        store_url = self.redis.url if self.redis else ""
        self.service = ServiceProcess(store_url, self.directory, environment)
        self.service.start()
        self.service.wait_ready(180)

    def restart(self) -> None:
        if self.service is not None:
            self.service.kill()
        self.start()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
        with contextlib.suppress(redis.RedisError, OSError), self.store_client() as client:
            client.shutdown(nosave=True)
        if self.redis is not None:
            self.redis.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def store_client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.data_dir / "redis.sock"))

    def hostile(self, sizes: list[int]) -> None:
        timeout = self.args.timeout
        for shape in hostile_bodies(1):
            for size in sizes:
                body = hostile_bodies(size)[shape]
                with HealthProbe(self.url, timeout) as probe, httpx.Client(timeout=timeout) as client:
                    time.sleep(0.1)
                    start = time.monotonic()
                    seconds, status = timed(
                        lambda body=body: client.post(f"{self.url}/v1/expand", content=body), timeout
                    )
                    slowest = probe.slowest(start, time.monotonic())
                self.rows.append(
                    Row(f"{shape}, {len(body) / 1e6:.2f} MB", f"{status} in {seconds:.2f} s", slowest)
                )
                print(self.rows[-1], file=sys.stderr)
                if status.startswith(">"):
                    self.restart()
                    break  # larger bodies of this shape: longer still

    def large_tree(self, nodes: int) -> str:
        """Build and finish one tree of about ``nodes`` nodes; returns its id."""
        rollouts = min(4096, max(2, nodes // 32))
        depth = max(1, nodes // rollouts)
        timeout = self.args.timeout
        with (
            httpx.Client(base_url=self.url, timeout=timeout) as client,
            HealthProbe(self.url, timeout) as probe,
        ):
            version = client.get("/v1/predictor").json()["version"]
            tree_id = allocate_one_tree(client, rollouts)
            start = time.monotonic()
            for d in range(depth):
                for first in range(0, rollouts, 4096):
                    batch = turn_events(tree_id, d, range(first, min(rollouts, first + 4096)), last=depth - 1)
                    client.post("/v1/expand", json={"events": batch}).raise_for_status()
            applied = time.monotonic()
            self.rows.append(
                Row(
                    f"report a {rollouts * depth:,}-node tree",
                    f"in {applied - start:.1f} s",
                    probe.slowest(start, applied),
                )
            )
            deadline = applied + timeout
            while client.get("/v1/predictor").json()["version"] <= version and time.monotonic() < deadline:
                time.sleep(0.2)
            trained = time.monotonic()
            answer = "trained" if trained < deadline else f"not trained in {timeout:.0f} s"
            self.rows.append(
                Row(
                    f"train on the {rollouts * depth:,}-node tree",
                    f"{answer} in {trained - applied:.1f} s",
                    probe.slowest(applied, trained),
                )
            )
            start = time.monotonic()
            seconds, status = timed(lambda: client.get(f"/v1/trees/{tree_id}"), timeout)
            self.rows.append(
                Row(
                    f"GET the {rollouts * depth:,}-node tree",
                    f"{status} in {seconds:.2f} s",
                    probe.slowest(start, time.monotonic()),
                )
            )
        for row in self.rows[-3:]:
            print(row, file=sys.stderr)
        return str(tree_id)

    def kill_store(self, tree_id: str) -> None:
        timeout = self.args.timeout
        with self.store_client() as client:
            pid = int(client.info("server")["process_id"])
        with (
            httpx.Client(base_url=self.url, timeout=timeout) as client,
            HealthProbe(self.url, timeout) as probe,
        ):
            nodes = len(client.get(f"/v1/trees/{tree_id}").json()["nodes"])
            start = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            while time.monotonic() < start + timeout:
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/readyz", timeout=3).status_code == 200:
                        break
                time.sleep(0.1)
            recovered = time.monotonic()
            slowest = probe.slowest(start, recovered)
            if recovered - start >= timeout:
                answer = f"not ready in {timeout:.0f} s"
            else:
                tree = client.get(f"/v1/trees/{tree_id}")
                whole = tree.status_code == 200 and len(tree.json()["nodes"]) == nodes
                answer = f"ready in {recovered - start:.1f} s, tree {'whole' if whole else 'LOST'}"
        self.rows.append(Row("kill -9 of the embedded redis-server", answer, slowest))
        print(self.rows[-1], file=sys.stderr)


def table(rows: list[Row]) -> Iterator[str]:
    yield "| case | answer | slowest /healthz meanwhile |"
    yield "|---|---|---|"
    for row in rows:
        yield f"| {row.case} | {row.answer} | {row.slowest_health * 1000:.0f} ms |"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["embedded", "redis"], default="embedded")
    parser.add_argument("--sizes", default="8K,64K,1M,8M,30M", help="hostile body sizes (K, M suffixes)")
    parser.add_argument("--tree-nodes", type=int, default=131_072)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds any one answer may take")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        bench = Bench(args, Path(directory))
        try:
            bench.start()
            bench.hostile([parse_size(size) for size in args.sizes.split(",")])
            tree_id = bench.large_tree(args.tree_nodes)
            if args.store == "embedded":
                bench.kill_store(tree_id)
        finally:
            bench.stop()
    print(f"store: {args.store}")
    print("\n".join(table(bench.rows)))


if __name__ == "__main__":
    main()
