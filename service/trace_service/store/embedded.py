"""The embedded store's durable form: a redis-server of the service's own, in a data directory.

With no store URL the service still needs its state to outlive the process: trees, job statistics
and the trained predictor's weights.  When a ``redis-server`` binary is installed the service runs one
on a Unix socket in the data directory, with its append-only file there.  Redis writes each command to
that file before it answers, so an answered request survives a kill -9 of the service (the server
keeps running and the next start adopts it) or of the server itself (the next start replays the
file); only a crash of the machine can lose the last second (``appendfsync everysec``).  Without the
binary the store is in-process and in memory (fakeredis), and the service says so at start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

#: Longest Unix socket path the kernel accepts (sun_path holds 108 bytes, one of them the NUL).
_MAX_SOCKET_PATH = 107
#: Seconds a starting redis-server may take to load its append-only file.
_START_TIMEOUT = 120.0


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

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    async def start(self) -> str:
        """Start (or adopt) the server and return its URL once it answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if await self._answers():
            logger.info("embedded store: adopting the redis-server already serving %s", self.socket)
            return self.url
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

    async def stop(self) -> None:
        """Shut the server down cleanly (its append-only file flushed), whoever started it."""
        client = Redis(unix_socket_path=str(self.socket))
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


def embedded_redis(data_dir: str) -> EmbeddedRedis | None:
    """The durable embedded store for ``data_dir``, or None (in memory) when there is no data
    directory or no redis-server to run there."""
    if not data_dir:
        return None
    binary = shutil.which("redis-server")
    if binary is None:
        logger.warning(
            "embedded store: no redis-server installed, so the store is in memory and a restart loses "
            "every tree, statistic and the trained predictor; install redis-server or set TRACE_STORE_URL"
        )
        return None
    return EmbeddedRedis(data_dir, binary)
