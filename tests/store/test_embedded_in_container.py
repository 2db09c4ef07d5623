"""The embedded store in a container: told apart without one, and its in-memory fallback warned about
once, at start, since a container restarts and runs beside other replicas."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support import make_settings

from trace_service.app import create_app
from trace_service.store import embedded
from trace_service.store.embedded import EmbeddedRedis, embedded_redis, running_in_container

LOGGER = "trace_service.store.embedded"


def test_a_plain_machine_is_no_container(tmp_path: Path) -> None:
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/init.scope\n")
    assert not running_in_container(tmp_path, environ={})


def test_no_cgroup_file_is_no_container(tmp_path: Path) -> None:
    assert not running_in_container(tmp_path, environ={})


def test_a_kubernetes_pod_is_a_container(tmp_path: Path) -> None:
    assert running_in_container(tmp_path, environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})


@pytest.mark.parametrize("marker", [".dockerenv", "run/.containerenv"])
def test_a_runtime_marker_file_means_a_container(tmp_path: Path, marker: str) -> None:
    (tmp_path / marker).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / marker).touch()
    assert running_in_container(tmp_path, environ={})


@pytest.mark.parametrize(
    "cgroup",
    [
        "12:memory:/docker/3f1c5a7e9b\n",
        "0::/kubepods/burstable/pod1234/abcd\n",
        "1:name=systemd:/system.slice/containerd.service/kubepods-pod1.slice:cri-containerd:abcd\n",
    ],
)
def test_a_runtime_in_the_cgroup_means_a_container(tmp_path: Path, cgroup: str) -> None:
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text(cgroup)
    assert running_in_container(tmp_path, environ={})


@pytest.fixture
def no_redis_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.fixture
def in_container(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "running_in_container", lambda: True)


@pytest.fixture
def on_a_plain_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "running_in_container", lambda: False)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


@pytest.mark.usefixtures("in_container", "no_redis_server")
def test_in_a_container_without_redis_server_one_warning_says_what_is_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    assert embedded_redis(str(tmp_path / "data")) is None
    (warning,) = warnings_of(caplog)
    assert "inside a container" in warning
    assert "no redis-server is installed" in warning
    assert "lost when the container restarts" in warning
    assert "set TRACE_STORE_URL" in warning


@pytest.mark.usefixtures("in_container")
def test_in_a_container_an_empty_data_dir_is_warned_about_too(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    assert embedded_redis("") is None
    (warning,) = warnings_of(caplog)
    assert "TRACE_DATA_DIR is empty" in warning
    assert "set TRACE_STORE_URL" in warning


@pytest.mark.usefixtures("in_container")
def test_in_a_container_a_durable_embedded_store_is_not_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    binaries = tmp_path / "bin"
    binaries.mkdir()
    (binaries / "redis-server").touch(mode=0o755)  # found on PATH; never run here
    monkeypatch.setenv("PATH", str(binaries))
    store = embedded_redis(str(tmp_path / "data"))
    assert isinstance(store, EmbeddedRedis)
    assert store.binary == str(binaries / "redis-server")
    assert warnings_of(caplog) == []


@pytest.mark.usefixtures("on_a_plain_machine", "no_redis_server")
def test_outside_a_container_a_missing_redis_server_keeps_its_own_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    assert embedded_redis(str(tmp_path / "data")) is None
    (warning,) = warnings_of(caplog)
    assert "no redis-server installed" in warning
    assert "container" not in warning


@pytest.mark.usefixtures("on_a_plain_machine")
def test_outside_a_container_an_asked_for_memory_store_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    assert embedded_redis("") is None
    assert warnings_of(caplog) == []


@pytest.mark.usefixtures("in_container")
async def test_the_service_warns_once_as_it_starts_in_a_container(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    app = create_app(make_settings(data_dir=""))
    async with app.router.lifespan_context(app):
        assert app.state.embedded_store is None
    (warning,) = warnings_of(caplog)
    assert "set TRACE_STORE_URL" in warning
