"""trace_lab.local, the harness of tests, benchmarks and the demo: ports, a throwaway redis-server that
restarts on its port and data, the service as a subprocess and in a thread, and clear errors when a
binary is missing or a process dies."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis
from support import make_settings

from trace_lab.local import (
    RedisNotInstalled,
    RedisServer,
    ServiceProcess,
    ThreadedService,
    free_ports,
    redis_binary,
    wait_for_port,
)


def needs_redis_server() -> None:
    try:
        redis_binary("redis-server")
    except RedisNotInstalled as missing:
        pytest.skip(str(missing))


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_wait_for_port_names_the_port_it_waited_for() -> None:
    (port,) = free_ports(1)
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{port}"):
        wait_for_port(port, timeout=0.1)


def test_wait_for_port_stops_waiting_when_the_process_exits(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match=re.escape(f"port {port} exited with 3: see {tmp_path}")):
        wait_for_port(port, timeout=30, process=process, log=tmp_path)


def test_the_import_pulls_in_neither_the_service_nor_uvicorn() -> None:
    """The base client install has neither: only what starts a service may import them."""
    probe = "import sys, trace_lab.local; print(sorted({'trace_service', 'uvicorn'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_missing_redis_server_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no redis-server on it
    server = RedisServer(tmp_path)
    with pytest.raises(RedisNotInstalled, match=r"redis-server is not installed.*redis-server package"):
        server.start()
    assert server.process is None


@pytest.mark.redis
def test_redis_restarts_on_its_port_with_its_data(tmp_path: Path) -> None:
    needs_redis_server()
    with RedisServer(tmp_path) as server:
        port = server.port
        with redis.Redis.from_url(server.url) as client:
            client.set("kept", "yes")
        server.restart()
        assert server.port == port
        with redis.Redis.from_url(server.url) as client:
            assert client.get("kept") == b"yes"  # from the append-only file
    assert server.process is None
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # stopped: nothing listens any more


@pytest.mark.redis
def test_a_port_in_use_fails_the_start(tmp_path: Path) -> None:
    needs_redis_server()
    with RedisServer(tmp_path / "first") as first:
        second = RedisServer(tmp_path / "second", port=first.port)
        with pytest.raises(RuntimeError, match=f"already listens on 127.0.0.1:{first.port}"):
            second.start()
        assert second.process is None


@pytest.mark.redis
def test_a_redis_server_that_exits_points_at_its_log(tmp_path: Path) -> None:
    needs_redis_server()
    (tmp_path / "appendonlydir").write_text("")  # where its append-only files go: redis-server exits
    server = RedisServer(tmp_path)
    with pytest.raises(RuntimeError, match=re.escape(f"exited with 1: see {server.log_path}")):
        server.start()
    assert server.process is None
    assert "append-only dir" in server.log_path.read_text()


def test_a_threaded_service_serves_until_it_leaves() -> None:
    service = ThreadedService.from_settings(make_settings())
    with pytest.raises(RuntimeError, match="not started"):
        _ = service.url
    with service:
        assert httpx.get(f"{service.url}/healthz").status_code == 200
        port = service.port
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow  # two starts of `trace-rollout serve`, each importing torch
def test_a_service_process_is_killed_and_restarted_on_its_port(tmp_path: Path) -> None:
    service = ServiceProcess("", tmp_path, {"TRACE_TORCH_THREADS": "1", "TRACE_DATA_DIR": ""})
    with service:
        port = service.port
        assert httpx.get(f"{service.url}/healthz").status_code == 200
        service.kill()
        assert service.process.returncode == -signal.SIGKILL
        service.start().wait_ready()
        assert service.port == port
        assert httpx.get(f"{service.url}/healthz").status_code == 200
    assert service.process.returncode is not None
    assert service.log_path.exists()


def test_a_service_process_that_exits_says_where_its_log_is(tmp_path: Path) -> None:
    service = ServiceProcess("", tmp_path, {"TRACE_LEASE_SECONDS": "-1"}).start()
    try:
        with pytest.raises(RuntimeError, match=re.escape(f"exited with 2: see {service.log_path}")):
            service.wait_ready()
    finally:
        service.stop()
    assert "TRACE_LEASE_SECONDS" in service.log_path.read_text()
