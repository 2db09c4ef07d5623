"""Test support: throwaway redis-servers, live service instances, settings for tests."""

from __future__ import annotations

import itertools
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from trace_proto import ExpandEvent
from trace_service.app import create_app
from trace_service.settings import Settings


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (all held open at once while they are picked, so the
    system cannot hand out the same one twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


@dataclass
class RedisServer:
    """A redis-server of the test run's own, on a free loopback port, persisting to a temp dir."""

    directory: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.port = self.port or free_port()
        self.process = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes", "--dir", str(self.directory), "--protected-mode", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(self.port)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


class LiveService:
    """The real app under uvicorn in a thread, on a free loopback port."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.port = free_port()
        self.app = create_app(settings)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveService:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the service did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def make_settings(store_url: str = "", **overrides: object) -> Settings:
    """Settings for a test: its own key prefix (tests share redis-servers), fast background loops."""
    values: dict[str, object] = {
        "store_url": store_url,
        "data_dir": "",  # the embedded store in memory: tests that need it durable give a directory
        "store_prefix": f"test-{uuid.uuid4().hex[:12]}",
        "train_interval_seconds": 0.2,
        "sweep_interval_seconds": 0.2,
        "torch_threads": 1,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


_ids = itertools.count()


def turn(
    tree_id: str,
    parent: str | None,
    *,
    done: bool = False,
    reward: float | None = None,
    instruction: str | None = None,
) -> ExpandEvent:
    n = next(_ids)
    return ExpandEvent(
        event_id=f"e{n}",
        tree_id=tree_id,
        node_id=f"n{n}",
        parent_id=parent,
        text=f"turn {n}",
        done=done,
        reward=reward,
        instruction_id=instruction,
    )


def rollout(
    tree_id: str, start: str | None, turns: int, reward: float, instruction: str | None = None
) -> list[ExpandEvent]:
    """A chain of turns from ``start``; the last one scored."""
    events = []
    parent = start
    for t in range(turns):
        last = t == turns - 1
        event = turn(
            tree_id,
            parent,
            done=last,
            reward=reward if last else None,
            instruction=instruction if t == 0 else None,
        )
        events.append(event)
        parent = event.node_id
    return events
