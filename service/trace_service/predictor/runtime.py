"""One job's predictor inside the service: inference off the event loop, training in one place,
weights shared through the store (``trace_service.predictor.job_predictors`` keeps one per job).

Every replica serves a job's predictions from its own copy of the job's model.  One replica at a time
holds the job's trainer lease in the store; it turns the job's completed trees into examples (targets
V̂ and visit weights from :func:`trace_service.allocation.tree.tree_targets`), trains in a worker thread and
publishes versioned weights; the others load a newer version when they see one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import numpy.typing as npt

from trace_proto import PredictorInfo, PriorInfo
from trace_service.metrics import Metrics
from trace_service.predictor import (
    CheckpointError,
    EncodedHistory,
    HistoryFeaturizer,
    OutcomeCounts,
    Predictive,
    PredictorDiagnostics,
    Query,
    RootGroup,
    SuccessPredictor,
    TrainingExample,
    Turn,
)
from trace_service.store import StoredTree, TreeStore

logger = logging.getLogger(__name__)

#: The weights' version and Ṽ of each query.
Prediction = tuple[int, npt.NDArray[np.float64]]
#: The weights' version, Ṽ and the posterior concentration of each query (:class:`Predictive`).
VersionedPredictive = tuple[int, Predictive]
#: A call waiting for the next batch: its queries and where its answer goes.
_Waiting = tuple[list[Query], "asyncio.Future[VersionedPredictive]"]


class PredictorRuntime:
    """One job's predictor on this replica: batched inference off the loop, training rounds from the
    job's completed trees, and its weights in the store.

    A job with nothing learned yet serves from ``predictor``, the registry's shared cold predictor
    (``owned`` false: never trained, so every cold job predicts alike); its first training round or
    its first published weights give it a predictor of its own (``new_predictor``).
    """

    def __init__(
        self,
        job: str,
        predictor: SuccessPredictor,
        store: TreeStore,
        metrics: Metrics,
        *,
        owned: bool,
        new_predictor: Callable[[], SuccessPredictor],
        success_threshold: float,
        train_steps: int,
    ) -> None:
        self.job = job
        self.predictor = predictor
        self.owned = owned
        self.store = store
        self.metrics = metrics
        self.success_threshold = success_threshold
        self.train_steps = train_steps
        self._new_predictor = new_predictor
        self.lock = asyncio.Lock()  # training, loading and setting down take turns
        self.unsaved: list[str] = []  # trees learned from since the predictor was last set down
        self.memory_bytes = 0  # the predictor's estimated size (``SuccessPredictor.memory_bytes``)
        self._waiting: list[_Waiting] = []
        self._batcher: asyncio.Task[None] | None = None

    @property
    def featurizer(self) -> HistoryFeaturizer:
        return self.predictor.featurizer

    @property
    def version(self) -> int:
        return self.predictor.version

    async def predict(self, queries: Sequence[Query]) -> Prediction:
        """Ṽ of the queries and the weights' version (:meth:`predictive` without the concentrations)."""
        version, predictive = await self.predictive(queries)
        return version, predictive.mean

    async def predictive(self, queries: Sequence[Query]) -> VersionedPredictive:
        """Ṽ and the posterior concentration of the queries, and the weights' version, computed in a
        worker thread so that the event loop keeps serving.  Calls made while a batch runs are merged
        into the next one: one forward pass serves many trees' Stage 2 decisions (on a GPU, one launch
        instead of dozens)."""
        if not queries:
            return self.predictor.version, Predictive(np.zeros(0), np.zeros(0))
        answer: asyncio.Future[VersionedPredictive] = asyncio.get_running_loop().create_future()
        self._waiting.append((list(queries), answer))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        return await answer

    async def _run_batches(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await self._answer(batch)
            except asyncio.CancelledError:  # the service is stopping: no caller may wait forever
                for _, answer in batch + self._waiting:
                    if not answer.done():
                        answer.set_exception(RuntimeError("the predictor is stopping"))
                raise

    async def _answer(self, batch: list[_Waiting]) -> None:
        merged = [query for queries, _ in batch for query in queries]
        try:
            version, predictive = await asyncio.to_thread(self.predictor.predict_versioned, merged)
        except Exception as error:
            if len(batch) > 1:  # a bad query fails its own call only: answer the calls one by one
                for single in batch:
                    await self._answer([single])
            elif not batch[0][1].done():
                batch[0][1].set_exception(error)
            return
        start = 0
        for queries, answer in batch:
            if not answer.done():  # its caller may have gone
                part = slice(start, start + len(queries))
                answer.set_result(
                    (version, Predictive(predictive.mean[part], predictive.concentration[part]))
                )
            start += len(queries)

    def training_data(self, tree: StoredTree) -> tuple[list[TrainingExample], RootGroup | None]:
        """Training examples from a finished tree (every node with a scored leaf below, and the root)
        and the group of its bare rollouts, which the calibration is fitted to."""
        if not tree.nodes:
            return [], None
        targets = tree.targets(self.success_threshold)
        outcomes = OutcomeCounts(*tree.meta.prior_outcomes)
        root, encoded = encode_tree(self.featurizer, tree)
        examples = [
            TrainingExample(
                encoded[node.node_id], float(targets.value[i]), float(targets.visits[i]), outcomes
            )
            for i, node in enumerate(tree.nodes)
            if targets.visits[i] > 0
        ]
        if targets.root_visits:
            examples.append(TrainingExample(root, targets.root_value, float(targets.root_visits), outcomes))
        meta = tree.meta  # the store counts bare leaves and successes as it records them
        group = RootGroup(root, meta.bare_successes, meta.bare_leaves, outcomes) if meta.bare_leaves else None
        return examples, group

    def _learn_from(self, tree: StoredTree) -> int:
        """Add one finished tree's examples, group and continuation flips to the predictor's buffers;
        the number of examples added."""
        examples, group = self.training_data(tree)
        flips = tree.continuation_flips(self.success_threshold)
        if examples:
            self.predictor.add_examples(examples, group)
            self.predictor.observe_continuations(*flips)
        return len(examples)

    @property
    def freshness(self) -> float:
        """ρ of Stage 1's joint objective, learned with the weights (``SuccessPredictor.freshness``)."""
        return self.predictor.freshness

    async def own(self) -> None:
        """A predictor of its own in place of the shared cold one (built beside the loop)."""
        if not self.owned:
            self.predictor, self.owned = await asyncio.to_thread(self._new_predictor), True

    async def train(self, most_trees: int = 512) -> None:
        """One training round on the job's completed trees, if any; publishes the new weights."""
        async with self.lock:
            tree_ids = await self.store.pop_completed(self.job, most_trees)
            if not tree_ids:
                return
            await self.own()
            added = 0
            for tree_id in tree_ids:
                try:
                    # Encoding every node of a large tree takes seconds: beside the loop, as its parsing.
                    added += await self.store.with_tree(tree_id, self._learn_from) or 0
                except ValueError as error:  # a malformed tree must not stop training on the others
                    logger.warning("skipping tree %s for training: %s", tree_id, error)
                self.unsaved.append(tree_id)
                await self.store.retain_tree(tree_id, "learned")  # its examples are the predictor's now
            label = self.metrics.job_label(self.job)
            if added:
                self.metrics.predictor_examples.labels(label).inc(added)
            if self.predictor.examples_seen == 0 or not added:
                return
            with self.metrics.predictor_train_duration.time():
                result = await asyncio.to_thread(self.predictor.train_round, self.train_steps)
            if result.steps:
                blob = await asyncio.to_thread(self.predictor.to_bytes)
                if await self.store.publish_weights(self.job, result.version, blob):  # not if deleted
                    await self._observe()
                    self.metrics.predictor_bytes.labels(label, "published").set(len(blob))
            await self.measure()

    async def measure(self) -> None:
        """Estimate the predictor's size in memory (beside the loop) and report it."""
        if self.owned:
            self.memory_bytes = await asyncio.to_thread(self.predictor.memory_bytes)
            self.metrics.predictor_bytes.labels(self.metrics.job_label(self.job), "memory").set(
                self.memory_bytes
            )

    async def load_newer(self) -> None:
        """Adopt the job's published weights if they are newer than the ones served here."""
        async with self.lock:
            if await self.store.weights_version(self.job) <= self.predictor.version:
                return
            published = await self.store.load_weights(self.job)
            if published is None:
                return
            await self.adopt(*published)

    async def adopt(self, version: int, blob: bytes) -> bool:
        """Serve the weights ``blob`` (of ``version``) if newer; a damaged blob is counted and refused."""
        previous = self.predictor.version
        if version <= previous:
            return False
        await self.own()
        try:
            await asyncio.to_thread(self.predictor.update_from_bytes, blob)
        except CheckpointError as error:
            self.metrics.predictor_load_failures.inc()
            logger.error(
                "job %r: published predictor weights v%s rejected, keeping v%s: %s",
                self.job,
                version,
                previous,
                error,
            )
            return False
        await self._observe()
        return True

    async def whole(self) -> bytes:
        """The job's whole predictor, training data included (``SuccessPredictor.to_bytes``)."""
        return await asyncio.to_thread(self.predictor.to_bytes, with_training_data=True)

    async def _observe(self) -> None:
        report = await self._diagnostics()
        calibration = self.predictor.calibration
        self.metrics.observe_predictor(
            self.metrics.job_label(self.job),
            version=report.version,
            brier=report.brier,
            ece=report.ece,
            spearman=report.spearman,
            prior_log_likelihood=calibration.log_likelihood,
            concentration=calibration.concentration,
            freshness=self.predictor.freshness,
        )

    async def _diagnostics(self) -> PredictorDiagnostics:
        """The held-out diagnostics: a forward pass over every held-out example, beside the loop."""
        return await asyncio.to_thread(self.predictor.diagnostics)

    async def info(self) -> PredictorInfo:
        report = await self._diagnostics()
        calibration = self.predictor.calibration
        return PredictorInfo(
            job=self.job,
            version=report.version,
            examples_seen=report.examples_seen,
            brier=report.brier,
            ece=report.ece,
            spearman=report.spearman,
            spearman_by_depth={d: v for d, v in report.spearman_by_depth.items() if v is not None},
            device=str(self.predictor.device),
            continuation_freshness=self.predictor.freshness,
            prior=PriorInfo(
                source=calibration.prior,
                concentration=calibration.concentration,
                log_likelihood=calibration.log_likelihood,
                groups=calibration.groups,
            ),
        )


def encode_tree(
    featurizer: HistoryFeaturizer, tree: StoredTree, nodes: Iterable[int] | None = None
) -> tuple[EncodedHistory, dict[str, EncodedHistory]]:
    """Encode the prompt and the histories of ``nodes`` (indices into ``tree.nodes``; all nodes by
    default) in one pass.  A history extends its parent's, so the nodes' ancestors are encoded too."""
    parents = tree.parent_indices()
    if nodes is None:
        kept: Sequence[int] = range(len(tree.nodes))
    else:
        marked: set[int] = set()
        for index in nodes:
            while index >= 0 and index not in marked:
                marked.add(index)
                index = parents[index]
        kept = sorted(marked)  # nodes are stored parents first, so this order is too
    position = {index: rank for rank, index in enumerate(kept)}
    meta = tree.meta
    root, encoded = featurizer.encode_tree(
        meta.prompt_id,
        tree.prompt_text,
        meta.prompt_features,
        [Turn(tree.nodes[index].text, tree.nodes[index].features) for index in kept],
        [position[parents[index]] if parents[index] >= 0 else -1 for index in kept],
    )
    return root, {tree.nodes[index].node_id: history for index, history in zip(kept, encoded, strict=True)}
