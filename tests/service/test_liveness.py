"""No allowed request stalls the service, on both stores: a hostile body of any shape is answered in
time that grows with its size no faster than linearly, a large tree is trained on and read back, and
`/healthz` answers all the while.  Times are compared as ratios (to a small body's, to the request's
own), never against an absolute figure; `bench/liveness.py` measures the same cases at full size."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from trace_lab.liveness import ROUTES, HealthProbe, allocate_one_tree, hostile_bodies, turn_events
from trace_lab.local import RedisServer, ServiceProcess

#: The service's body limit here: the large bodies are as large as it allows.
MAX_BODY = 4 << 20
SMALL, LARGE = 16 << 10, MAX_BODY - (8 << 10)


def stalled(probe: HealthProbe, start: float, end: float) -> bool:
    """`/healthz` waited on the request: its slowest answer meanwhile took most of the request's time
    (a loop that the request holds answers nothing until the request ends)."""
    return probe.slowest(start, end) > max(0.25, 0.5 * (end - start))


@pytest.fixture(scope="module", params=["embedded", "redis"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    directory = tmp_path_factory.mktemp("liveness")
    data_dir = Path(f"/tmp/trace-live-{time.monotonic_ns()}")  # a short path: the store's socket lives in it
    environment = {
        "TRACE_DATA_DIR": str(data_dir),
        "TRACE_MAX_BODY_BYTES": str(MAX_BODY),
        "TRACE_TRAIN_INTERVAL_SECONDS": "0.2",
        "TRACE_TORCH_THREADS": "1",
        "TRACE_LOG_LEVEL": "WARNING",
    }
    with RedisServer(directory / "redis") as server:
        store_url = server.url if request.param == "redis" else ""
        with ServiceProcess(store_url, directory, environment) as service:
            yield service


def timed_post(client: httpx.Client, route: str, body: bytes) -> tuple[float, int]:
    start = time.monotonic()
    status = client.post(route, content=body, headers={"content-type": "application/json"}).status_code
    return time.monotonic() - start, status


@pytest.mark.slow
@pytest.mark.parametrize("route", list(ROUTES))
def test_hostile_bodies_answer_in_linear_time(live: ServiceProcess, route: str) -> None:
    with httpx.Client(base_url=live.url, timeout=120) as client, HealthProbe(live.url, 120) as probe:
        for shape, small in hostile_bodies(SMALL, route).items():
            large = hostile_bodies(LARGE, route)[shape]
            small_seconds, small_status = timed_post(client, route, small)
            start = time.monotonic()
            large_seconds, large_status = timed_post(client, route, large)
            assert large_status == small_status, shape
            assert large_status in (200, 422), shape
            # Linear time: a body 255 times larger takes at most 8 times longer per byte.
            assert large_seconds <= 8 * (len(large) / len(small)) * max(small_seconds, 0.005), shape
            assert not stalled(probe, start, time.monotonic()), shape
        assert probe.failures == 0


@pytest.mark.slow
def test_a_large_tree_is_trained_on_and_read_without_stalling(live: ServiceProcess) -> None:
    rollouts, depth = 1024, 24
    with httpx.Client(base_url=live.url, timeout=120) as client, HealthProbe(live.url, 120) as probe:
        version = client.get("/v1/predictor").json()["version"]
        tree_id = allocate_one_tree(client, rollouts)
        for d in range(depth):
            events = turn_events(tree_id, d, range(rollouts), last=depth - 1)
            start = time.monotonic()
            answer = client.post("/v1/expand", json={"events": events}).json()
            assert answer["accepted"] == rollouts
            assert not stalled(probe, start, time.monotonic())
        assert answer["completed"] == [tree_id]
        start = time.monotonic()
        while client.get("/v1/predictor").json()["version"] <= version:
            assert time.monotonic() < start + 120, "the predictor never trained on the tree"
            time.sleep(0.2)
        assert not stalled(probe, start, time.monotonic())
        start = time.monotonic()
        tree = client.get(f"/v1/trees/{tree_id}")
        assert tree.status_code == 200
        assert len(tree.json()["nodes"]) == rollouts * depth
        assert not stalled(probe, start, time.monotonic())
        assert probe.failures == 0
