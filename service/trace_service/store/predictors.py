"""The tree store's operations for the jobs' predictors: the queue of completed trees each job's trainer
learns from, the trainer leases, the published weights and the whole predictors set down between
replicas.  A mixin of :class:`~trace_service.store.store.TreeStore`, on its client, scripts and keys."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from trace_service.store.keys import KeySpace
from trace_service.store.runner import RedisClient, ScriptCall, ScriptRunner, text


class PredictorOperations:
    """What :class:`~trace_service.store.store.TreeStore` keeps for each job's predictor."""

    redis: RedisClient
    scripts: ScriptRunner
    keys: KeySpace
    job_ttl: int

    async def push_completed(self, job: str, tree_id: str, cap: int = 100_000) -> None:
        """Queue a completed tree for its job's predictor (the newest ``cap`` are kept) and mark the job
        as wanting its trainer, in one round trip."""
        await self.scripts.run_all(self._push_calls(job, tree_id, cap))

    def _push_calls(self, job: str, tree_id: str, cap: int = 100_000) -> list[ScriptCall]:
        """The calls of :meth:`push_completed`, independent of each other."""
        push = ScriptCall("push_completed", [self.keys.completed_trees(job)], [tree_id, cap, self.job_ttl])
        return [push, *ScriptRunner.writes(self.keys.training_wanted, self.job_ttl, "SADD", [job])]

    async def requeue_completed(self, job: str, tree_ids: Sequence[str]) -> None:
        """Queue again, as the oldest, trees a job's predictor learned from but could not set down (a
        replica stopping past its deadline): its next trainer learns from them again."""
        if tree_ids:
            queue = self.keys.completed_trees(job)
            await self.scripts.run_all(ScriptRunner.writes(queue, self.job_ttl, "RPUSH", list(tree_ids)))
            await self.scripts.run_all(
                ScriptRunner.writes(self.keys.training_wanted, self.job_ttl, "SADD", [job])
            )

    async def training_wanted(self) -> list[str]:
        """The jobs with completed trees waiting for their trainer."""
        return sorted(text(job) for job in await self.redis.smembers(self.keys.training_wanted))

    async def pop_completed(self, job: str, count: int) -> list[str]:
        """Up to ``count`` of the job's completed trees, oldest first; a job left with none stops wanting
        its trainer (unless a tree arrived meanwhile)."""
        queue = self.keys.completed_trees(job)
        raw = await self.redis.rpop(queue, count)
        popped = [text(item) for item in raw or []]
        if len(popped) < count:
            await self.redis.srem(self.keys.training_wanted, job)
            if await self.redis.llen(queue):  # pushed between the pop and the removal
                await self.scripts.run_all(
                    ScriptRunner.writes(self.keys.training_wanted, self.job_ttl, "SADD", [job])
                )
        return popped

    async def publish_weights(self, job: str, version: int, blob: bytes, *, new_job: bool = False) -> bool:
        """Publish the job's weights; false, writing nothing, when the job was deleted meanwhile.
        ``new_job``: its first allocation is under way (a warm start), so it is not indexed yet."""
        fields = ["version", version, "blob", blob]
        if new_job:
            await self.scripts.run_all(
                ScriptRunner.writes(self.keys.weights(job), self.job_ttl, "HSET", fields)
            )
            return True
        return await self._job_write(job, self.keys.weights(job), "HSET", fields)

    async def _job_write(self, job: str, key: str, command: str, args: Sequence[Any]) -> bool:
        """``command`` on one of the job's keys while the job exists (``job_write.lua``)."""
        call = ScriptCall("job_write", [self.keys.steps(job), key], [self.job_ttl, command, *args])
        return bool(await self.scripts.run(call))

    async def weights_version(self, job: str) -> int:
        value = await self.redis.hget(self.keys.weights(job), "version")
        return int(value) if value else 0

    async def load_weights(self, job: str) -> tuple[int, bytes] | None:
        version, blob = await self.redis.hmget(self.keys.weights(job), ["version", "blob"])
        return (
            (int(version), blob if isinstance(blob, bytes) else blob.encode()) if version and blob else None
        )

    async def save_predictor(self, job: str, blob: bytes) -> bool:
        """Set down the job's whole predictor (its weights and training data) for whoever loads it next;
        false when the job was deleted meanwhile (nothing is written)."""
        return await self._job_write(job, self.keys.predictor_state(job), "SET", [blob])

    async def load_predictor(self, job: str) -> bytes | None:
        blob = await self.redis.get(self.keys.predictor_state(job))
        return None if blob is None else blob if isinstance(blob, bytes) else blob.encode()

    async def hold_trainer_lease(self, job: str, owner: str, ttl: float, now: float) -> bool:
        """Take or renew the lease on training the job's predictor; true while this owner holds it.  A
        job that does not exist (deleted, or expired) has no lease to take."""
        lease = [self.keys.steps(job), self.keys.trainer_lease(job)]
        held = bool(await self.scripts.run(ScriptCall("hold_lease", lease, [owner, int(ttl * 1000)])))
        if held:
            trained = ScriptRunner.writes(
                self.keys.trained_jobs, math.ceil(2 * ttl), "ZADD", [now + ttl, job], 2
            )
            await self.scripts.run_all(trained)
        return held

    async def release_trainer_lease(self, job: str, owner: str) -> None:
        """Give the lease up, if this owner holds it (another may have taken it once it lapsed)."""
        if await self.scripts.run(ScriptCall("release_lease", [self.keys.trainer_lease(job)], [owner])):
            await self.redis.zrem(self.keys.trained_jobs, job)

    async def trained_jobs(self, now: float) -> list[str]:
        """The jobs whose trainer lease is held at ``now``, by any replica."""
        key = self.keys.trained_jobs
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(key, "-inf", now)
            pipe.zrange(key, 0, -1)
            replies = await pipe.execute()
        return sorted(text(job) for job in replies[1])

    async def trainers(self, owner: str, now: float, ttl: float) -> int:
        """Say that ``owner`` trains (at ``now``) and count the trainers heard from within ``ttl``."""
        key = self.keys.trainers
        said = ScriptRunner.writes(key, math.ceil(2 * ttl), "ZADD", [now, owner], stride=2)
        await self.scripts.run_all(said)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(key, "-inf", now - ttl)
            pipe.zcard(key)
            replies = await pipe.execute()
        return max(int(replies[1]), 1)
