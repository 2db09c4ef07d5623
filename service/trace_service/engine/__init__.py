"""What the API does, independent of HTTP, one component per concern.  Routers translate requests to
calls on the component they need; the algorithms are the pure functions of ``trace_service.allocation``
and ``trace_service.tree``.

- ``allocate``: POST /v1/allocate (idempotency, predictions, Stage 1)
- ``intake``: POST /v1/expand (events, the follow-ups they make due, re-offers)
- ``decide``: one Stage 2 round of one tree, decided (``trace_service.branching``) and recorded
- ``completion``: the bookkeeping once a tree is finished
- ``instructions``: GET /v1/instructions (leases)
- ``maintenance``: the sweeper
- ``queries``: tree export and close, job statistics, predictions on demand
- ``readiness``: whether this replica can serve (the store and the predictor answer)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from trace_service.engine.allocate import Allocation
from trace_service.engine.common import Clock, IdempotencyConflictError, NotFoundError
from trace_service.engine.completion import Completion
from trace_service.engine.decide import Stage2
from trace_service.engine.instructions import Instructions
from trace_service.engine.intake import Intake
from trace_service.engine.maintenance import Sweeper
from trace_service.engine.queries import JobStatistics, Predictions, Trees
from trace_service.engine.readiness import Readiness
from trace_service.metrics import Metrics
from trace_service.runtime import PredictorRuntime
from trace_service.settings import Settings
from trace_service.store import TreeStore

__all__ = [
    "Allocation",
    "Clock",
    "Engine",
    "IdempotencyConflictError",
    "Instructions",
    "Intake",
    "JobStatistics",
    "NotFoundError",
    "Predictions",
    "Readiness",
    "Stage2",
    "Sweeper",
    "Trees",
    "build_engine",
]


@dataclass(frozen=True)
class Engine:
    """The service's components, wired once per process: the app's state holds one and each route
    takes the component it uses (``deps``).  ``store`` and ``predictor`` are what they were built on:
    GET /v1/predictor reads the predictor; tests and the fault harness reach the store."""

    store: TreeStore
    predictor: PredictorRuntime
    allocation: Allocation
    intake: Intake
    instructions: Instructions
    sweeper: Sweeper
    trees: Trees
    stats: JobStatistics
    predictions: Predictions
    readiness: Readiness


def build_engine(
    store: TreeStore,
    predictor: PredictorRuntime,
    settings: Settings,
    metrics: Metrics,
    *,
    clock: Clock = time.time,
) -> Engine:
    completion = Completion(store, metrics)
    stage2 = Stage2(store, predictor, settings, metrics, completion, clock)
    return Engine(
        store=store,
        predictor=predictor,
        allocation=Allocation(store, predictor, metrics, clock),
        intake=Intake(store, predictor, settings, metrics, stage2, completion, clock),
        instructions=Instructions(store, settings, metrics, clock),
        sweeper=Sweeper(store, settings, stage2, completion, clock),
        trees=Trees(store, settings, completion, clock),
        stats=JobStatistics(store, settings, metrics),
        predictions=Predictions(store, predictor),
        readiness=Readiness(store, predictor, metrics),
    )
