"""The embedded default keeps what it answered across a restart, a kill -9 of the service and a kill -9
of its redis-server, which the running service starts again by itself."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from trace_lab.liveness import HealthProbe
from trace_lab.local import ServiceProcess

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")


def embedded_service(data_dir: Path, directory: Path) -> ServiceProcess:
    """`trace-rollout serve` on the embedded store in `data_dir`, its log in `directory`."""
    environment = {
        "TRACE_DATA_DIR": str(data_dir),
        "TRACE_TRAIN_INTERVAL_SECONDS": "0.2",
        "TRACE_SWEEP_INTERVAL_SECONDS": "0.2",
        "TRACE_TORCH_THREADS": "1",
    }
    return ServiceProcess("", directory, environment)


def store_client(data_dir: Path) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(data_dir / "redis.sock"))


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    # A short path: the store's Unix socket lives in it.
    directory = Path(f"/tmp/trace-{os.getpid()}-{time.monotonic_ns()}")
    yield directory
    # A server that a killed service left behind.
    with store_client(directory) as client, contextlib.suppress(redis.ConnectionError, redis.ResponseError):
        client.shutdown(nosave=True)
    shutil.rmtree(directory, ignore_errors=True)


def finished_step(client: httpx.Client) -> str:
    """Allocate a pool without continuations and score every rollout (three turns each): the trees
    complete and the predictor trains on them.  Returns one tree's id."""
    prompts = [{"prompt_id": f"p{i}", "text": f"task {i % 3}"} for i in range(24)]
    allocation = client.post(
        "/v1/allocate",
        json={"step": 0, "budget": 96, "min_rollouts": 4, "expansion": 0.0, "prompts": prompts},
    ).json()
    events = []
    for tree in allocation["trees"]:
        for j in range(tree["rollouts"]):
            for depth in range(3):
                node = {
                    "event_id": f"{tree['tree_id']}-{j}-{depth}",
                    "tree_id": tree["tree_id"],
                    "node_id": f"n{j}-{depth}",
                    "parent_id": f"n{j}-{depth - 1}" if depth else None,
                }
                if depth == 2:
                    node |= {"done": True, "reward": float(j % 2)}
                events.append(node)  # fmt: skip
    answer = client.post("/v1/expand", json={"events": events}).json()
    assert answer["accepted"] == len(events)
    assert len(answer["completed"]) == len(allocation["trees"])
    return str(allocation["trees"][0]["tree_id"])


def wait_for_published_predictor(client: httpx.Client, data_dir: Path) -> int:
    """The version the service serves once it is trained and its weights are in the store (training
    that a kill interrupts before publishing is lost, like any unanswered work)."""
    deadline = time.monotonic() + 60
    with store_client(data_dir) as store:
        while time.monotonic() < deadline:
            version = int(client.get("/v1/predictor").json()["version"])
            if version > 0 and int(store.hget("trace:{j:default}:weights", "version") or 0) >= version:
                return version
            time.sleep(0.2)
    raise TimeoutError("the predictor never trained")


@pytest.mark.parametrize("crash", ["clean restart", "kill -9 of the service", "kill -9 of both"])
def test_the_embedded_store_survives(data_dir: Path, tmp_path: Path, crash: str) -> None:
    service = embedded_service(data_dir, tmp_path)
    service.start().wait_ready(60)
    try:
        with httpx.Client(base_url=service.url, timeout=30) as client:
            tree_id = finished_step(client)
            version = wait_for_published_predictor(client, data_dir)
            before = client.get(f"/v1/trees/{tree_id}").json()
            stats = client.get("/v1/jobs/default/stats").json()
            # The last answered write, just before the crash: it must survive too.
            last = client.post(
                "/v1/allocate", json={"step": 1, "budget": 2, "prompts": [{"prompt_id": "late"}]}
            ).json()
        if crash == "clean restart":
            service.stop()
        else:
            service.kill()
            if crash == "kill -9 of both":
                pid = int(store_client(data_dir).info("server")["process_id"])
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
        service.start().wait_ready(60)
        with httpx.Client(base_url=service.url, timeout=30) as client:
            assert client.get(f"/v1/trees/{tree_id}").json() == before
            assert client.get("/v1/jobs/default/stats").json()["steps"][0] == stats["steps"][0]
            assert client.get(f"/v1/trees/{last['trees'][0]['tree_id']}").status_code == 200
            assert int(client.get("/v1/predictor").json()["version"]) >= version
    finally:
        service.stop()


def test_the_embedded_store_heals_without_a_restart_of_the_service(data_dir: Path, tmp_path: Path) -> None:
    """kill -9 of the store's redis-server mid-flow: the service starts it again from its append-only
    file and is ready again without a restart, nothing answered is lost, and /healthz never fails."""
    service = embedded_service(data_dir, tmp_path)
    service.start().wait_ready(60)
    try:
        with httpx.Client(base_url=service.url, timeout=30) as client, HealthProbe(service.url, 30) as probe:
            tree_id = finished_step(client)
            before = client.get(f"/v1/trees/{tree_id}").json()
            pid = int(store_client(data_dir).info("server")["process_id"])
            os.kill(pid, signal.SIGKILL)
            during = client.post(
                "/v1/allocate", json={"step": 1, "budget": 2, "prompts": [{"prompt_id": "q"}]}
            )
            assert during.status_code in (200, 503)
            deadline = time.monotonic() + 30
            while client.get("/readyz").status_code != 200:
                assert time.monotonic() < deadline, "the embedded store never came back"
                time.sleep(0.1)
            assert int(store_client(data_dir).info("server")["process_id"]) != pid
            assert client.get(f"/v1/trees/{tree_id}").json() == before
            after = client.post(
                "/v1/allocate", json={"step": 2, "budget": 2, "prompts": [{"prompt_id": "r"}]}
            )
            assert after.status_code == 200
            assert client.get(f"/v1/trees/{after.json()['trees'][0]['tree_id']}").status_code == 200
            assert probe.failures == 0
    finally:
        service.stop()


def test_liveness_fails_while_the_embedded_store_cannot_come_back(data_dir: Path, tmp_path: Path) -> None:
    """A store that cannot be started again (here: its append-only manifest made unreadable) fails
    /healthz once `store_heal_seconds` pass, so that the orchestrator restarts the service; once it can
    start again, the service heals by itself."""
    service = embedded_service(data_dir, tmp_path)
    service.environment["TRACE_STORE_HEAL_SECONDS"] = "1"
    service.start().wait_ready(60)
    try:
        with httpx.Client(base_url=service.url, timeout=30) as client:
            (manifest,) = (data_dir / "appendonlydir").glob("*.manifest")
            intact = manifest.read_bytes()
            manifest.write_bytes(b"not a manifest\n")
            os.kill(int(store_client(data_dir).info("server")["process_id"]), signal.SIGKILL)
            deadline = time.monotonic() + 30
            while (health := client.get("/healthz")).status_code == 200:
                assert time.monotonic() < deadline, "/healthz never failed"
                time.sleep(0.2)
            assert health.status_code == 503
            assert "redis-server has been down" in health.json()["detail"]
            manifest.write_bytes(intact)
            while client.get("/healthz").status_code != 200 or client.get("/readyz").status_code != 200:
                assert time.monotonic() < deadline + 30, "the store never came back"
                time.sleep(0.2)
    finally:
        service.stop()
