"""Local services for tests, benchmarks and the demo: an ASGI app served in this process.

Needs uvicorn (the `service` extra); imported only by code that runs a service, never by the base client.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp

logger = logging.getLogger(__name__)


class LocalService:
    """An ASGI app served by uvicorn in a background thread on a free loopback port.

    Leaving asks the server to shut down and waits up to `stop_timeout` seconds. While it waits it
    re-delivers cancellations that were swallowed: a task cancelled in the middle of an embedded-store
    call (fakeredis' async client lets such calls finish instead of raising) would otherwise keep the
    app's background loops, and so its shutdown, running. Past the timeout the daemon thread is left
    behind (it ends with the process) and a warning says so.
    """

    def __init__(self, app: ASGIApp, *, start_timeout: float = 30.0, stop_timeout: float = 10.0) -> None:
        import uvicorn

        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="trace-service", daemon=True)
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout

    @property
    def url(self) -> str:
        (server,) = self._server.servers
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __enter__(self) -> LocalService:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the in-process service did not start")
            time.sleep(0.02)
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
