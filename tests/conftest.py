"""Fixtures shared by the whole suite: throwaway redis-servers and live service instances."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import LiveService, RedisServer, make_settings


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/test installs it)")
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory))
        server.start()
        yield server
        server.stop()


@pytest.fixture(params=["embedded", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    """Each test using it runs twice: on the embedded store and on a real redis-server."""
    if request.param == "embedded":
        return ""
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
def service(store_url: str) -> Iterator[LiveService]:
    with LiveService(make_settings(store_url)) as live:
        yield live
