"""Every job's predictor on this replica: one :class:`~trace_service.predictor.runtime.PredictorRuntime` per
training job, created on the job's first request, bounded in memory, trained where the job's lease is.

Two jobs train two policies, so the same prompt has two success rates: each job learns only from its
own trees, with its own weights, calibration, continuation freshness, training data and version.  A
new job starts clean (the configured checkpoint, else untrained) or, when its first allocation names
``predictor_from``, from a copy of that job's weights; nothing else flows between jobs.

**Memory.**  A job that has learned nothing yet is served by one shared cold predictor and costs
almost nothing (a bounded cache of them saves the store reads).  At most ``capacity`` jobs with a
predictor of their own stay in memory, holding at most ``memory_budget`` bytes by their estimates;
beyond either the least recently used is set down: its trainer writes the predictor (its published
weights, its newest training data: ``SuccessPredictor.to_bytes``) to the store
(``TreeStore.save_predictor``) and gives up the job's lease, and the next request for the job loads it
back.  A stopping replica sets down every job it trains at once, within a deadline (:meth:`close`).

**Replicas.**  Each job's weights are published under the job's keys and every replica loads them.
One replica at a time holds a job's trainer lease; a replica takes new leases only up to its share of
the jobs that want or have a trainer (``TreeStore.trainers`` counts the training replicas), so many jobs
spread over the replicas; a job no other replica took within a round it takes anyway.  Training runs
in worker threads under each job's own lock: one job's training never holds up another's predictions,
and inference batches per job.

**Deletion.**  ``DELETE /v1/jobs/{job}`` removes the job's keys; :meth:`PredictorRegistry.forget`
drops it here, and every other replica drops it at its next refresh, when the job is gone from the
store's index, without writing it back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

from redis.exceptions import RedisError

from trace_service.metrics import Metrics
from trace_service.predictor import (
    CheckpointError,
    EncodedHistory,
    HistoryFeaturizer,
    PredictorConfig,
    SuccessPredictor,
)
from trace_service.predictor.runtime import PredictorRuntime, encode_tree
from trace_service.store import StoredTree, TreeStore

logger = logging.getLogger(__name__)

#: Cold jobs (nothing learned) remembered at once, and for how long before the store is asked again.
_COLD_CAPACITY = 4_096
_COLD_SECONDS = 2.0
#: Seconds a trainer lease, and a trainer's word that it trains, last without renewal.
LEASE_SECONDS = 60.0


class UnknownPredictorError(ValueError):
    """``predictor_from`` names a job without a predictor to copy (answered 422)."""


@dataclass
class _Cold:
    runtime: PredictorRuntime
    checked_at: float


class PredictorRegistry:
    def __init__(
        self,
        store: TreeStore,
        metrics: Metrics,
        config: PredictorConfig,
        *,
        capacity: int,
        memory_budget: int = 0,
        success_threshold: float,
        train_steps: int,
        base: bytes | None = None,
    ) -> None:
        """``base`` is the checkpoint a new job starts from (none: untrained); ``capacity`` the jobs
        with a predictor of their own kept in memory, and ``memory_budget`` the bytes they may hold
        together (their estimates; 0: no bound but the count)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.store = store
        self.metrics = metrics
        self.config = config
        self.capacity = capacity
        self.memory_budget = memory_budget
        self.success_threshold = success_threshold
        self.train_steps = train_steps
        self._base = base
        self.cold = self._fresh()  # never trained: shared by every job that has learned nothing
        self.featurizer: HistoryFeaturizer = self.cold.featurizer
        self.owner = uuid.uuid4().hex
        self._resident: OrderedDict[str, PredictorRuntime] = OrderedDict()
        self._cold: OrderedDict[str, _Cold] = OrderedDict()
        self._loading: dict[str, asyncio.Task[PredictorRuntime]] = {}
        self._setting_down: dict[str, asyncio.Task[None]] = {}
        self._leases: set[str] = set()
        self._deferred: set[str] = set()  # jobs left last round to other trainers
        self.probe = self._runtime("", self.cold, owned=False)  # readiness: the cold predictor answers

    # --- serving ------------------------------------------------------------------------------------

    def encode_tree(
        self, tree: StoredTree, nodes: Iterable[int] | None = None
    ) -> tuple[EncodedHistory, dict[str, EncodedHistory]]:
        """The tree's histories (``runtime.encode_tree``; the featurizer is the same for every job)."""
        return encode_tree(self.featurizer, tree, nodes)

    async def get(self, job: str, *, warm_from: str | None = None) -> PredictorRuntime:
        """The job's predictor, loaded from the store when not in memory.  ``warm_from`` names a job
        whose weights a job without any of its own starts from (:class:`UnknownPredictorError` when
        that job has none); a job with its own ignores it."""
        runtime = self._resident.get(job)
        if runtime is not None:
            self._resident.move_to_end(job)
            return runtime
        cold = self._cold.get(job)
        if cold is not None and warm_from is None and time.monotonic() - cold.checked_at < _COLD_SECONDS:
            self._cold.move_to_end(job)
            return cold.runtime
        task = self._loading.get(job)
        if task is None:
            task = asyncio.ensure_future(self._load(job))
            self._loading[job] = task
            task.add_done_callback(lambda _: self._loading.pop(job, None))
        runtime = await asyncio.shield(task)
        starts_from = warm_from if warm_from != job and not runtime.owned else None
        if starts_from is not None and await self._warm_start(runtime, starts_from):
            self._keep(job, runtime)
        return runtime

    async def _load(self, job: str) -> PredictorRuntime:
        """The job's predictor from the store: the whole one its trainer set down, then any newer
        published weights; none of either: a cold runtime.  A copy already in memory wins."""
        setting_down = self._setting_down.get(job)
        if setting_down is not None:  # what it sets down is what this loads
            await asyncio.shield(setting_down)
        predictor: SuccessPredictor | None = None
        whole = await self.store.load_predictor(job)
        if whole is not None:
            try:
                predictor = await asyncio.to_thread(SuccessPredictor.from_bytes, whole, self.config)
            except CheckpointError as error:
                self.metrics.predictor_load_failures.inc()
                logger.error("job %r: the predictor set down in the store is unreadable: %s", job, error)
        runtime = self._runtime(job, predictor or self.cold, owned=predictor is not None)
        published = await self.store.load_weights(job)
        if published is not None:
            await runtime.adopt(*published)
        kept = self._resident.get(job)
        if kept is not None:  # kept meanwhile (a trainer's first round): that copy is the job's
            return kept
        if runtime.owned:
            await runtime.measure()
            self._keep(job, runtime)
        else:
            self._cold[job] = _Cold(runtime, time.monotonic())
            while len(self._cold) > _COLD_CAPACITY:
                self._cold.popitem(last=False)
        return runtime

    async def _warm_start(self, runtime: PredictorRuntime, source: str) -> bool:
        """A copy of ``source``'s weights (published, or in memory here) becomes the job's first;
        whether the copy was adopted."""
        cold = self._cold.get(source)
        # A job trained here for the first time is still among the cold ones until its round ends.
        resident = self._resident.get(source) or (cold.runtime if cold is not None else None)
        if resident is not None and resident.version > 0:
            blob: bytes | None = await asyncio.to_thread(resident.predictor.to_bytes)
            version = resident.version
        else:
            published = await self.store.load_weights(source)
            version, blob = published if published is not None else (0, None)
        if blob is None:
            raise UnknownPredictorError(
                f"predictor_from names job {source!r}, which has no trained predictor to start from"
            )
        if not await runtime.adopt(version, blob):
            return False
        await self.store.publish_weights(runtime.job, version, blob, new_job=True)  # every replica alike
        return True

    def _runtime(self, job: str, predictor: SuccessPredictor, *, owned: bool) -> PredictorRuntime:
        return PredictorRuntime(
            job,
            predictor,
            self.store,
            self.metrics,
            owned=owned,
            new_predictor=self._fresh,
            success_threshold=self.success_threshold,
            train_steps=self.train_steps,
        )

    def _fresh(self) -> SuccessPredictor:
        """A clean predictor: the configured checkpoint, else untrained."""
        if self._base is not None:
            return SuccessPredictor.from_bytes(self._base, self.config)
        return SuccessPredictor(self.config)

    # --- memory -------------------------------------------------------------------------------------

    def _keep(self, job: str, runtime: PredictorRuntime) -> None:
        """Keep a job's predictor in memory, setting down the least recently used (a copy already kept
        stays: it is the one its trainer trains)."""
        self._cold.pop(job, None)
        if self._resident.get(job, runtime) is not runtime:
            return
        self._resident[job] = runtime
        self.metrics.predictor_resident.set(len(self._resident))
        self._set_down_beyond_capacity()

    def _over_budget(self) -> bool:
        """More jobs kept than ``capacity``, or (beside the one most recently used) more bytes than
        ``memory_budget``."""
        if len(self._resident) > self.capacity:
            return True
        held = sum(runtime.memory_bytes for runtime in self._resident.values())
        return bool(self.memory_budget) and len(self._resident) > 1 and held > self.memory_budget

    def _set_down_beyond_capacity(self) -> None:
        while self._over_budget():
            job, runtime = self._resident.popitem(last=False)
            self.metrics.predictor_evictions.inc()
            self.metrics.predictor_resident.set(len(self._resident))
            task = asyncio.ensure_future(self._set_down(runtime))
            self._setting_down[job] = task
            task.add_done_callback(partial(self._set_down_done, job))

    def _set_down_done(self, job: str, task: asyncio.Task[None]) -> None:
        if self._setting_down.get(job) is task:
            del self._setting_down[job]

    async def _set_down(self, runtime: PredictorRuntime) -> None:
        """Write a job's predictor to the store if this replica trains it (others hold only the
        published weights), then give up its lease: whoever loads it next has it whole."""
        job = runtime.job
        if job not in self._leases:
            return
        try:
            async with runtime.lock:
                whole = await runtime.whole()
                await self.store.save_predictor(job, whole)  # unless deleted meanwhile
                runtime.unsaved.clear()
            self.metrics.predictor_bytes.labels(self.metrics.job_label(job), "set_down").set(len(whole))
            self.metrics.predictor_bytes.labels(self.metrics.job_label(job), "memory").set(0)
            self._leases.discard(job)
            await self.store.release_trainer_lease(job, self.owner)
        except Exception:
            # The lease lapses on its own; the trees it trained on are what the next trainer lacks.
            self._leases.discard(job)
            logger.exception("job %r: its predictor could not be set down", job)

    async def forget(self, job: str) -> None:
        """Drop a deleted job here at once (the store writes nothing of a deleted job back, whatever a
        round under way does)."""
        self._cold.pop(job, None)
        self._resident.pop(job, None)
        self._leases.discard(job)
        self.metrics.predictor_resident.set(len(self._resident))
        self.metrics.forget_job(job)

    async def close(self, seconds: float) -> None:
        """Set down every job this replica trains, all at once, within ``seconds`` (a restart loses
        nothing), and give up its leases.  A job not set down in time keeps its last set-down state
        in the store, and the trees it learned from since are queued again for its next trainer."""
        runtimes = [runtime for job, runtime in self._resident.items() if job in self._leases]
        tasks = [asyncio.ensure_future(self._set_down(runtime)) for runtime in runtimes]
        tasks += self._setting_down.values()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=seconds)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for runtime in runtimes:
            if runtime.unsaved:
                logger.warning(
                    "job %r: its predictor was not set down in time; %d trees are queued again for "
                    "its next trainer",
                    runtime.job,
                    len(runtime.unsaved),
                )
                await self.store.requeue_completed(runtime.job, runtime.unsaved)

    # --- background work ----------------------------------------------------------------------------

    async def refresh(self, *, train: bool = True) -> None:
        """One round of background work: train the jobs whose lease this replica holds or takes (up to
        its share), then load newer published weights of the others kept here; a job gone from the
        store is dropped."""
        for job in list(self._leases):  # renewed first: a long round must not let them lapse
            if not await self.store.hold_trainer_lease(job, self.owner, LEASE_SECONDS, time.time()):
                self._leases.discard(job)  # it lapsed and another replica took it
        trained: set[str] = set()
        if train:
            trained = await self._train_round()
        for job, runtime in list(self._resident.items()):
            if job in trained:
                continue
            if not await self.store.job_exists(job):
                await self.forget(job)
                continue
            await runtime.load_newer()

    async def _train_round(self) -> set[str]:
        wanted = await self.store.training_wanted()
        if not wanted and not self._leases:
            return set()
        now = time.time()
        trainers = await self.store.trainers(self.owner, now, LEASE_SECONDS)
        busy = set(wanted) | set(await self.store.trained_jobs(now)) | self._leases
        share = math.ceil(len(busy) / trainers)
        trained: set[str] = set()
        deferred, self._deferred = self._deferred, set()
        random.shuffle(wanted)  # replicas that start together try the jobs in different orders
        for job in wanted:
            if job in self._setting_down:  # its lease is being given up: a later round decides
                continue
            if job not in self._leases and len(self._leases) >= share and job not in deferred:
                # Past its share, a replica leaves a job one round for the others; still untaken
                # then, the job is its own: no job waits for long, whatever the shares.
                self._deferred.add(job)
                continue
            newly = job not in self._leases  # a lease already held was renewed as the round began
            if newly and not await self.store.hold_trainer_lease(job, self.owner, LEASE_SECONDS, now):
                continue
            self._leases.add(job)
            try:
                await self._train(job, newly=newly)
            except (RedisError, OSError):
                raise  # the store is down: the whole round waits for it
            except Exception:  # one job's failure must not stop the others' training
                logger.exception("job %r: its training round failed", job)
            trained.add(job)
        return trained

    async def _train(self, job: str, *, newly: bool) -> None:
        """One training round of a job whose lease this replica holds.  A lease newly taken starts from
        what the job's last trainer set down in the store, not from the copy this replica serves (which
        holds the published weights and no training data)."""
        if newly:
            self._cold.pop(job, None)
            if self._resident.pop(job, None) is not None:
                self.metrics.predictor_resident.set(len(self._resident))
        runtime = await self.get(job)
        await runtime.own()
        self._keep(job, runtime)  # kept before it trains: a request meanwhile gets this copy
        await runtime.train()
        self._set_down_beyond_capacity()  # its training data grew
