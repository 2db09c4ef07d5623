"""Run each client test against both `TraceClient` and `AsyncTraceClient` over `httpx.MockTransport`."""

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from trace_client import AsyncTraceClient, Backoff, TraceClient

BASE_URL = "http://trace.test/api"
Handler = Callable[[httpx.Request], httpx.Response]


class BlockingFacade:
    """Calls an `AsyncTraceClient` as if it were blocking, so one test body covers both clients."""

    def __init__(self, client: AsyncTraceClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop

    def with_options(self, **options: Any) -> "BlockingFacade":
        return BlockingFacade(self._client.with_options(**options), self._loop)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(method(*args, **kwargs))

        return call


@dataclass
class Recorder:
    """The requests a mock service received and the waits a client slept."""

    requests: list[httpx.Request] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)


Connect = Callable[..., tuple[Any, Recorder]]


@pytest.fixture(params=["sync", "async"])
def connect(request: pytest.FixtureRequest) -> Iterator[Connect]:
    """`connect(handler, **client_options) -> (client, recorder)`; jitter is off (U = 1) unless given."""
    closers: list[Callable[[], None]] = []

    def make(handler: Handler, **options: Any) -> tuple[Any, Recorder]:
        recorder = Recorder()

        def recording_handler(sent: httpx.Request) -> httpx.Response:
            recorder.requests.append(sent)
            return handler(sent)

        options.setdefault("backoff", Backoff(uniform=lambda: 1.0))
        transport = httpx.MockTransport(recording_handler)
        if request.param == "sync":
            client = TraceClient(BASE_URL, transport=transport, sleep=recorder.sleeps.append, **options)
            closers.append(client.close)
            return client, recorder

        async def record_sleep(delay: float) -> None:
            recorder.sleeps.append(delay)

        loop = asyncio.new_event_loop()
        async_client = AsyncTraceClient(BASE_URL, transport=transport, sleep=record_sleep, **options)

        def close() -> None:
            loop.run_until_complete(async_client.aclose())
            loop.close()

        closers.append(close)
        return BlockingFacade(async_client, loop), recorder

    yield make
    for close in closers:
        close()
