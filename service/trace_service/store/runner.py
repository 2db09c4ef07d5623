"""Running the store's Lua scripts on one Redis or a Redis Cluster.

Each script in ``scripts/`` is loaded with :data:`~trace_service.lifecycle.LUA_PRELUDE` in front (the
life cycle's names and rules) and run by its SHA; a Redis that lost its scripts (restarted) gets them
again.  A script's keys share one hash tag, so every call touches one slot; what differs on a Cluster
(no script spanning slots, no pipelined scripts) stays here, behind :attr:`ScriptRunner.single_node`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from importlib import resources
from typing import Any, NamedTuple

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from trace_service.lifecycle import LUA_PRELUDE

RedisClient = Redis | RedisCluster

SCRIPTS = (
    "create_trees",
    "apply_events",
    "commit_decision",
    "take_over_decision",
    "close_tree",
    "retain_tree",
    "claim_instructions",
    "record_outcome",
    "write_expire",
    "tree_progress",
    "load_tree",
    "push_completed",
    "create_reserve",
    "commit_draw",
    "release_lease",
    "hold_lease",
    "job_write",
)
#: Script calls in flight at once when a Cluster cannot pipeline them.
_CLUSTER_FANOUT = 64
#: Command arguments one write_expire.lua call passes on (Lua's unpack() fails beyond ~8,000).
_ARGS_PER_WRITE = 4_000


class ScriptCall(NamedTuple):
    """One call of a script: its name in ``scripts/``, its keys, its arguments."""

    script: str
    keys: list[str]
    args: list[Any]


def script_source(name: str) -> str:
    """A script as Redis runs it: the life-cycle prelude, then the script's own text."""
    own = resources.files("trace_service.store").joinpath("scripts", f"{name}.lua").read_text()
    return LUA_PRELUDE + own


class ScriptRunner:
    """The store's scripts on ``redis``, and the few plain commands that need no script."""

    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis
        self._scripts: dict[str, AsyncScript] = {
            name: redis.register_script(script_source(name)) for name in SCRIPTS
        }

    @property
    def single_node(self) -> bool:
        """Whether the store is one Redis node, where one script call may touch keys under different
        hash tags (a Cluster keeps each call to one slot)."""
        return not isinstance(self.redis, RedisCluster)

    async def run(self, call: ScriptCall) -> Any:
        """One call (loading the script first if Redis does not have it)."""
        return await self._scripts[call.script](keys=call.keys, args=call.args)

    async def run_all(self, calls: Sequence[ScriptCall], *, ordered: bool = False) -> list[Any]:
        """Several calls and their results (raises the first failure).  ``ordered`` calls run one after
        another (each retried on its own if Redis lost its scripts, so none can run twice); unordered
        ones as :meth:`run_each`."""
        if ordered:
            return [await self.run(call) for call in calls]
        results = await self.run_each(calls)
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    async def run_in_order(self, first: Sequence[ScriptCall], then: Sequence[ScriptCall]) -> None:
        """``then`` after ``first``: one Redis node runs a pipeline's commands in the order sent, so both
        go in one round trip (a connection lost part-way leaves ``first`` or a part of it done, never
        ``then`` alone); a Cluster, whose pipelines refuse scripts, waits for ``first``."""
        if self.single_node:
            await self.run_all([*first, *then])
        else:
            await self.run_all(first)
            await self.run_all(then)

    async def run_each(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Independent calls, each with its result or the exception it raised.  One pipeline on a single
        Redis; the calls that find their script gone (Redis restarted) did not run and run again on
        their own.  On a Cluster, whose pipelines refuse scripts, they run concurrently."""
        if not self.single_node:
            results: list[Any] = []
            for start in range(0, len(calls), _CLUSTER_FANOUT):
                chunk = calls[start : start + _CLUSTER_FANOUT]
                results.extend(
                    await asyncio.gather(*(self.run(call) for call in chunk), return_exceptions=True)
                )
            return results
        async with self.redis.pipeline(transaction=False) as pipe:
            for call in calls:
                sha = self._scripts[call.script].sha
                pipe.execute_command("EVALSHA", sha, len(call.keys), *call.keys, *call.args)
            results = list(await pipe.execute(raise_on_error=False))
        for index, result in enumerate(results):
            if isinstance(result, NoScriptError):
                try:
                    results[index] = await self.run(calls[index])  # loads the script, then runs it
                except RedisError as error:
                    results[index] = error
        return results

    @staticmethod
    def writes(key: str, ttl: int, command: str, args: Sequence[Any], stride: int = 1) -> list[ScriptCall]:
        """A write command (SADD, ZADD, HSET, …) with the key's expiry, atomically (``write_expire.lua``:
        no key is ever left without one), as calls of a bounded size each; ``stride`` arguments make one
        item (2 for a ZADD's score and member)."""
        size = _ARGS_PER_WRITE - _ARGS_PER_WRITE % stride
        return [
            ScriptCall("write_expire", [key], [ttl, command, *args[start : start + size]])
            for start in range(0, len(args), size)
        ]

    async def read_fields(self, keys: Sequence[str], fields: Sequence[str]) -> list[list[str | None]]:
        """The given fields of each hash (``None`` where absent), in one pipeline."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, list(fields))
            rows = await pipe.execute()
        return [[None if value is None else text(value) for value in row] for row in rows]


def text(value: Any) -> str:
    """A Redis reply as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def pairs(flat: Sequence[Any]) -> dict[str, str]:
    """A hash from a flat field/value list (what HGETALL returns inside a script)."""
    return {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat), 2)}
