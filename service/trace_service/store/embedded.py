"""The embedded store's durable form: a redis-server of the service's own, in a data directory.

With no store URL the service still needs its state to outlive the process: trees, job statistics
and the trained predictor's weights.  When a ``redis-server`` binary is installed the service runs one
on a Unix socket in the data directory, with its append-only file there.  Redis writes each command to
that file before it answers, so an answered request survives a kill -9 of the service (the server
keeps running and the next start adopts it) or of the server itself (:meth:`EmbeddedRedis.supervise`
starts it again, which replays the file, while the service keeps running); only a crash of the machine
can lose the last second (``appendfsync everysec``).  Without the
binary the store is in-process and in memory (fakeredis), and the service says so at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

#: Longest Unix socket path the kernel accepts (sun_path holds 108 bytes, one of them the NUL).
_MAX_SOCKET_PATH = 107
#: Seconds a starting redis-server may take to load its append-only file.
_START_TIMEOUT = 120.0
#: Seconds between looks at an adopted server (one this service did not start, so cannot wait on).
_POLL_SECONDS = 0.5
#: Seconds between attempts to start a server that failed to start.
_RETRY_SECONDS = 1.0


class EmbeddedRedis:
    """A redis-server on ``data_dir/redis.sock`` that persists to ``data_dir``; one service per
    directory.  :meth:`start` adopts a server that an earlier, killed service left running."""

    def __init__(self, data_dir: str | os.PathLike[str], binary: str) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.binary = binary
        self.socket = self.data_dir / "redis.sock"
        if len(os.fsencode(self.socket)) > _MAX_SOCKET_PATH:
            raise ValueError(
                f"data directory {self.data_dir} is too long for a Unix socket path; pick a shorter one"
            )
        self.process: asyncio.subprocess.Process | None = None
        self._adopted_pid: int | None = None
        self._down_since: float | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    async def start(self) -> str:
        """Start (or adopt) the server and return its URL once it answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if await self._answers():
            self._adopted_pid = await self._server_pid()
            logger.info("embedded store: adopting the redis-server already serving %s", self.socket)
            return self.url
        self._adopted_pid = None
        self.process = None
        self.socket.unlink(missing_ok=True)
        self.process = await asyncio.create_subprocess_exec(
            *[
                self.binary,
                "--port", "0",
                "--unixsocket", str(self.socket),
                "--unixsocketperm", "700",
                "--dir", str(self.data_dir),
                "--appendonly", "yes",
                "--appendfsync", "everysec",
                "--save", "",
                "--logfile", str(self.data_dir / "redis.log"),
            ],
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            # Its own session: a Ctrl-C meant for the service must not stop the store under it; the
            # service stops it at shutdown.
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + _START_TIMEOUT
        while not await self._answers():
            if self.process.returncode is not None:
                raise RuntimeError(
                    f"redis-server exited with {self.process.returncode}; see {self.data_dir}/redis.log"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"redis-server did not answer on {self.socket} within {_START_TIMEOUT:.0f} s"
                )
            await asyncio.sleep(0.05)
        logger.info("embedded store: redis-server persisting to %s", self.data_dir)
        return self.url

    def down_for(self) -> float:
        """Seconds since the server was last seen gone without coming back (0 while it serves)."""
        return 0.0 if self._down_since is None else time.monotonic() - self._down_since

    async def supervise(self, stop: asyncio.Event) -> None:
        """Until ``stop``: whenever the server exits (killed, crashed, out of memory), start it again
        from its append-only file; the service's clients reconnect on their next call.  While it is
        down, :meth:`down_for` grows, which ``/healthz`` reports once it passes its bound."""
        while not stop.is_set():
            await self._until_exit(stop)
            if stop.is_set():
                return
            self._down_since = self._down_since or time.monotonic()
            logger.error("embedded store: redis-server is gone; starting it again from %s", self.data_dir)
            try:
                await self.start()
            except (OSError, RuntimeError, TimeoutError) as error:
                logger.error("embedded store: could not start redis-server: %s", error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), _RETRY_SECONDS)
                continue
            logger.warning(
                "embedded store: redis-server serving again after %.1f s, nothing answered lost",
                self.down_for(),
            )
            self._down_since = None

    async def _until_exit(self, stop: asyncio.Event) -> None:
        """Return once the server this service runs (or adopted) has exited, or ``stop`` is set."""
        stopping = asyncio.ensure_future(stop.wait())
        exiting = asyncio.ensure_future(self._exit())
        try:
            await asyncio.wait([stopping, exiting], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            exiting.cancel()

    async def _exit(self) -> None:
        if self.process is not None:
            await self.process.wait()
            return
        # An adopted server is not this process's child, and no event tells of its exit: look at its pid
        # (or, unknown, whether it answers) every so often.
        while True:
            pid = self._adopted_pid
            if not (self._alive(pid) if pid is not None else await self._answers()):
                return
            await asyncio.sleep(_POLL_SECONDS)

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, another user's
            return True
        return True

    async def _server_pid(self) -> int | None:
        client = Redis(unix_socket_path=str(self.socket), socket_connect_timeout=1)
        try:
            info = await client.info("server")
            return int(info["process_id"])
        except (RedisError, OSError, KeyError, ValueError):
            return None
        finally:
            await client.aclose()

    async def stop(self) -> None:
        """Shut the server down cleanly (its append-only file flushed), whoever started it."""
        # No retries: the server drops the connection as it exits, and a client that retried would
        # spend seconds reconnecting to a socket that is gone (most of a stop's time).
        client = Redis(unix_socket_path=str(self.socket), retry=Retry(NoBackoff(), 0))
        try:
            await client.shutdown()
        except RedisError:
            pass  # shutdown() ends the connection as the server exits, or the server was gone already
        finally:
            await client.aclose()
        if self.process is not None:
            await asyncio.wait_for(self.process.wait(), 30)
            self.process = None

    async def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        client = Redis(unix_socket_path=str(self.socket), socket_connect_timeout=1)
        try:
            return bool(await client.ping())
        except (RedisError, OSError):  # not there, or still loading its file (BusyLoadingError)
            return False
        finally:
            await client.aclose()


#: What PID 1's cgroup paths name under a container runtime (cgroup v1; under v2 they read ``0::/``).
_CONTAINER_CGROUP_MARKERS = ("docker", "kubepods", "containerd", "libpod")


def running_in_container(root: Path = Path("/"), environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process runs in a container: a Kubernetes pod (every one gets
    ``KUBERNETES_SERVICE_HOST``), Docker's or Podman's marker file, or a runtime in PID 1's cgroup."""
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return True
    if (root / ".dockerenv").exists() or (root / "run" / ".containerenv").exists():
        return True
    try:
        cgroup = (root / "proc" / "1" / "cgroup").read_text()
    except OSError:
        return False
    return any(marker in cgroup for marker in _CONTAINER_CGROUP_MARKERS)


def embedded_redis(data_dir: str) -> EmbeddedRedis | None:
    """The durable embedded store for ``data_dir``, or None (in memory) when there is no data
    directory or no redis-server to run there."""
    binary = shutil.which("redis-server") if data_dir else None
    if data_dir and binary:
        return EmbeddedRedis(data_dir, binary)
    why = "TRACE_DATA_DIR is empty" if not data_dir else "no redis-server is installed"
    # A container is where the in-memory store is a trap: it restarts, and it is one of several replicas.
    if running_in_container():
        logger.warning(
            "embedded store: in memory inside a container (TRACE_STORE_URL is empty and %s): every tree, "
            "statistic and the trained predictor is lost when the container restarts, and other replicas "
            "share none of it; set TRACE_STORE_URL to a Redis",
            why,
        )
    elif data_dir:
        logger.warning(
            "embedded store: no redis-server installed, so the store is in memory and a restart loses "
            "every tree, statistic and the trained predictor; install redis-server or set TRACE_STORE_URL"
        )
    return None
