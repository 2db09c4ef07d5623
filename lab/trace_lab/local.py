"""Run the service and Redis locally, for tests, benchmarks and the demo.

* `free_port`, `free_ports`, `wait_for_port`: loopback ports.
* `RedisServer`: a throwaway redis-server on a loopback port with its data in a directory; `restart`
  stops it and starts it again on the same port and data (what a Redis restart looks like to a client).
* `RedisCluster`: three redis-server masters joined into one Redis Cluster.
* `ServiceProcess`: `trace-rollout serve` as a subprocess, for what needs a real process: SIGKILL,
  restarts, CPU time.
* `ThreadedService`: an ASGI app (the service's, by default) under uvicorn in a background thread, for
  what needs the app's objects at hand.

The Redis binaries come from the system (Debian's redis-server package carries redis-server and
redis-cli); a missing one raises `RedisNotInstalled`, naming it.  Nothing here imports `trace_service`
or uvicorn when the module is imported (the base client install has neither): `ServiceProcess` and
`ThreadedService` need the `service` extra when they start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from trace_service.settings import Settings

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
#: Seconds a process may take to stop after SIGTERM before it is killed.
_STOP_TIMEOUT = 30.0


class RedisNotInstalled(RuntimeError):
    """A Redis binary the harness needs is not on PATH."""


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (all held open at once while they are picked, so the system
    cannot hand out the same one twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_for_port(
    port: int, timeout: float = 60.0, process: subprocess.Popen[bytes] | None = None, log: Path | None = None
) -> None:
    """Until something accepts connections on the loopback `port`; fails at once if `process` (the one
    meant to listen there) exits first.  `log` is where that process writes, for the error message."""
    deadline = time.monotonic() + timeout
    see = f": see {log}" if log is not None else ""
    while True:
        with socket.socket() as sock:
            if sock.connect_ex((LOOPBACK, port)) == 0:
                return
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"what was to listen on port {port} exited with {process.returncode}{see}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on {LOOPBACK}:{port} after {timeout:.0f} s{see}")
        time.sleep(0.02)


def _ensure_free(port: int) -> None:
    """A process started on a port something else listens on would fail, and waiting for the port would
    find that other listener: refuse up front."""
    with socket.socket() as sock:
        if sock.connect_ex((LOOPBACK, port)) == 0:
            raise RuntimeError(f"something already listens on {LOOPBACK}:{port}")


def _answers_ping(port: int) -> bool:
    """Whether a Redis server on the loopback `port` answers an inline PING with +PONG."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_binary(name: str) -> str:
    """The path of `name` (redis-server, redis-cli), or `RedisNotInstalled` saying how to get it."""
    path = shutil.which(name)
    if path is None:
        raise RedisNotInstalled(
            f"{name} is not installed: install Debian's redis-server package (scripts/test does), which "
            "carries redis-server and redis-cli"
        )
    return path


def _terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `_STOP_TIMEOUT` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class RedisServer:
    """A redis-server on a loopback port (a free one unless given) persisting to `directory`, with its
    append-only file unless `append_only` is off.  Its log is `directory`/redis-PORT.log."""

    def __init__(self, directory: Path, *, port: int = 0, append_only: bool = True) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.append_only = append_only
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.directory / f"redis-{self.port}.log"

    def start(self, timeout: float = 60.0) -> RedisServer:
        if self.process is not None:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        binary = redis_binary("redis-server")
        _ensure_free(self.port)
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [binary, "--port", str(self.port), "--bind", LOOPBACK, "--save", "",
                   "--appendonly", "yes" if self.append_only else "no", "--dir", str(self.directory),
                   "--protected-mode", "no"]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        try:
            self._wait_ready(self.process, timeout)
        except (RuntimeError, TimeoutError):
            self.stop()
            raise
        return self

    def _wait_ready(self, process: subprocess.Popen[bytes], timeout: float) -> None:
        """Until it answers PING with PONG: it listens before it has loaded its append-only file (and
        answers LOADING meanwhile), and it may still exit on a bad file after it listens."""
        deadline = time.monotonic() + timeout
        while not _answers_ping(self.port):
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {process.returncode}: see {self.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server did not answer on port {self.port}: see {self.log_path}")
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM: Redis writes its append-only file and exits; `start` brings the data back."""
        if self.process is not None:
            _terminate(self.process)
            self.process = None

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stop, stay down `down_seconds`, start again on the same port and data."""
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisCluster:
    """`masters` redis-server masters on loopback ports (no replicas, no persistence), each in its own
    directory under `directory`, joined into one cluster by redis-cli."""

    def __init__(self, directory: Path, masters: int = 3) -> None:
        self.directory = directory
        ports = free_ports(2 * masters)  # client ports and cluster-bus ports, all distinct
        self.ports, self.bus_ports = ports[:masters], ports[masters:]
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """A seed node's URL: a cluster client discovers the others from it."""
        return f"redis://{LOOPBACK}:{self.ports[0]}"

    def start(self, timeout: float = 120.0) -> RedisCluster:
        server, cli = redis_binary("redis-server"), redis_binary("redis-cli")
        try:
            for port, bus_port in zip(self.ports, self.bus_ports, strict=True):
                node_dir = self.directory / str(port)
                node_dir.mkdir(parents=True, exist_ok=True)
                command = [server, "--port", str(port), "--cluster-port", str(bus_port),
                           "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                           "--bind", LOOPBACK, "--save", "", "--appendonly", "no", "--protected-mode", "no",
                           "--dir", str(node_dir)]  # fmt: skip
                with (node_dir / "redis.log").open("ab") as log:
                    self.processes.append(subprocess.Popen(command, stdout=log, stderr=log))
            for port, process in zip(self.ports, self.processes, strict=True):
                wait_for_port(port, timeout, process, self.directory / str(port) / "redis.log")
            subprocess.run(
                [cli, "--cluster", "create", *(f"{LOOPBACK}:{port}" for port in self.ports),
                 "--cluster-replicas", "0", "--cluster-yes"],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip
            deadline = time.monotonic() + timeout
            while not all(self._state_ok(cli, port) for port in self.ports):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the cluster did not reach cluster_state:ok within {timeout:.0f} s")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            _terminate(process)
        self.processes = []

    @staticmethod
    def _state_ok(cli: str, port: int) -> bool:
        command = [cli, "-h", LOOPBACK, "-p", str(port), "cluster", "info"]
        info = subprocess.run(command, capture_output=True, text=True, timeout=10)
        return "cluster_state:ok" in info.stdout

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServiceProcess:
    """`trace-rollout serve` as a subprocess on a loopback port (a free one unless given), on `store_url`
    (empty: the embedded store), with `environment` (TRACE_* settings) over this process's own.  It runs
    in `directory` and writes its output to `directory`/service-PORT.log.  `start` after `stop` or `kill`
    starts it again on the same port."""

    def __init__(
        self, store_url: str, directory: Path, environment: Mapping[str, str] | None = None, *, port: int = 0
    ) -> None:
        self.store_url = store_url
        self.directory = directory
        self.environment = dict(environment or {})
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / f"service-{self.port}.log"

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The running (or last) process; an error before the first `start`."""
        if self._process is None:
            raise RuntimeError(f"the service on port {self.port} was never started")
        return self._process

    def start(self) -> ServiceProcess:
        """Launch it and return at once (starting takes seconds: torch is imported); `wait_ready` waits."""
        if self._process is not None and self._process.poll() is None:
            raise RuntimeError(f"the service on port {self.port} is already running")
        _ensure_free(self.port)
        command = [sys.executable, "-m", "trace_service.cli", "serve", "--host", LOOPBACK,
                   "--port", str(self.port), "--store-url", self.store_url]  # fmt: skip
        self.directory.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command, env={**os.environ, **self.environment}, cwd=self.directory, stdout=log, stderr=log
            )
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until /readyz answers 200."""
        deadline = time.monotonic() + timeout
        # One client for every poll: a client per call would build a TLS context (~0.1 CPU-s) each time.
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"the service exited with {self.process.returncode}: see {self.log_path}"
                    )
                try:
                    if client.get(f"{self.url}/readyz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise TimeoutError(f"{self.url} was not ready within {timeout:.0f} s: see {self.log_path}")

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, requests in flight die with the process."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=_STOP_TIMEOUT)

    def stop(self) -> None:
        """SIGTERM (a graceful shutdown), SIGKILL if that takes too long; nothing if not running."""
        if self._process is not None:
            _terminate(self._process)

    def __enter__(self) -> ServiceProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ThreadedService:
    """An ASGI app served by uvicorn in a background thread on a free loopback port.

    Leaving asks the server to shut down and waits up to `stop_timeout` seconds. While it waits it
    re-delivers cancellations that were swallowed: a task cancelled in the middle of an embedded-store
    call (fakeredis' async client lets such calls finish instead of raising) would otherwise keep the
    app's background loops, and so its shutdown, running. Past the timeout the daemon thread is left
    behind (it ends with the process) and a warning says so.
    """

    def __init__(self, app: ASGIApp, *, start_timeout: float = 120.0, stop_timeout: float = 10.0) -> None:
        import uvicorn

        self.app = app
        self._server = uvicorn.Server(
            uvicorn.Config(app, host=LOOPBACK, port=0, log_level="warning", lifespan="on")
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._port: int | None = None
        self._thread = threading.Thread(target=self._run, name="trace-service", daemon=True)
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout

    @classmethod
    def from_settings(cls, settings: Settings) -> ThreadedService:
        """The service's own app, built from `settings`."""
        from trace_service.app import create_app

        return cls(create_app(settings))

    @property
    def port(self) -> int:
        """The port the server listens on, known once it has started (and kept after it stops)."""
        if self._port is None:
            raise RuntimeError("the in-process service has not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def __enter__(self) -> ThreadedService:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the in-process service did not start")
            time.sleep(0.02)
        (server,) = self._server.servers
        self._port = int(server.sockets[0].getsockname()[1])
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        deadline = time.monotonic() + self._stop_timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            self._thread.join(timeout=0.5)
            if self._thread.is_alive() and self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(_recancel)
        if self._thread.is_alive():
            logger.warning("the in-process service did not shut down within %.0fs", self._stop_timeout)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._server.serve()


def _recancel() -> None:
    """Cancel again every task whose cancellation was requested but swallowed."""
    for task in asyncio.all_tasks():
        if task.cancelling() and not task.done():
            task.cancel()
