"""How many bytes the tree store holds: Redis's own count where it has one, an estimate in the embedded
store.  A mixin of :class:`~trace_service.store.store.TreeStore`, on its client."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from trace_service.store.runner import RedisClient

#: Keys serialised per pipeline while the embedded store is measured.
_KEYS_PER_DUMP = 1_000


class MemoryOperations:
    """What :class:`~trace_service.store.store.TreeStore` reports of its size."""

    redis: RedisClient

    async def memory(self) -> tuple[int, int]:
        """Bytes the store holds and its ``maxmemory`` (0: none): Redis's ``INFO memory``, summed over a
        Cluster's nodes.  The in-process store has no INFO: there the serialised size of every key
        (``DUMP``, about its payload, without Redis's per-key overhead) stands in, with no maxmemory."""
        try:
            info = await self.redis.info("memory")
        except ResponseError:
            return await self._dumped_bytes(), 0
        nodes = [info] if "used_memory" in info else list(info.values())
        return sum(int(node["used_memory"]) for node in nodes), sum(int(node["maxmemory"]) for node in nodes)

    async def _dumped_bytes(self) -> int:
        total = 0
        batch: list[Any] = []
        async for key in self.redis.scan_iter(count=_KEYS_PER_DUMP):
            batch.append(key)
            if len(batch) == _KEYS_PER_DUMP:
                total += await self._dump_sizes(batch)
                batch = []
        return total + (await self._dump_sizes(batch) if batch else 0)

    async def _dump_sizes(self, keys: list[Any]) -> int:
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.dump(key)
            return sum(len(dumped) for dumped in await pipe.execute() if dumped)
