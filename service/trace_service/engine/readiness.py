"""GET /readyz: whether this replica can serve, from what the store and the predictor answer now."""

from __future__ import annotations

import asyncio
import logging
import math

from redis.exceptions import RedisError

from trace_proto import Ready
from trace_service.metrics import Metrics
from trace_service.predictor import Query
from trace_service.predictor.job_predictors import PredictorRegistry
from trace_service.store import TreeStore

logger = logging.getLogger(__name__)

#: Seconds the probe prediction may take: below the readiness probe's own timeout (3 s in deploy/),
#: above what a batch of Stage 2 decisions ahead of it in the queue takes.
PROBE_SECONDS = 2.0


class Readiness:
    def __init__(self, store: TreeStore, predictors: PredictorRegistry, metrics: Metrics) -> None:
        self.store = store
        self.predictors = predictors
        self.metrics = metrics

    async def check(self) -> Ready:
        """Ready when the store answers a ping and the predictor answers a probe query."""
        store = await self._store_answers()
        self.metrics.store_up.set(int(store))
        predictor = await self._predictor_answers()
        return Ready(ready=store and predictor, store=store, predictor=predictor)

    async def _store_answers(self) -> bool:
        try:
            return await self.store.ping()
        except (RedisError, OSError):
            return False

    async def _predictor_answers(self) -> bool:
        """The predictor is usable when the cold predictor, which every new job starts from, turns a
        prompt with no history into a probability, in time, through the same batched path that
        allocations and decisions take."""
        probe = self.predictors.probe
        try:
            (prompt,) = probe.featurizer.encode_prompts([("readyz-probe", "", None)])
            _, values = await asyncio.wait_for(probe.predict([Query(prompt)]), PROBE_SECONDS)
        except Exception as error:  # whatever breaks the prediction makes this replica unready
            logger.warning("readiness: the predictor does not answer: %r", error)
            return False
        return len(values) == 1 and math.isfinite(values[0]) and 0.0 <= values[0] <= 1.0
