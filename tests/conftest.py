"""Fixtures shared by the whole suite: a throwaway redis-server and live service instances, from
`trace_lab.local` (the one harness of tests, benchmarks and the demo)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import make_settings

from trace_lab.local import RedisNotInstalled, RedisServer, ThreadedService


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session (append-only file on); tests keep apart by key prefix."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        server.start()
    except RedisNotInstalled as missing:
        pytest.skip(str(missing))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["embedded", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    """Each test using it runs twice: on the embedded store and on a real redis-server."""
    if request.param == "embedded":
        return ""
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
def service(store_url: str) -> Iterator[ThreadedService]:
    with ThreadedService.from_settings(make_settings(store_url)) as live:
        yield live
