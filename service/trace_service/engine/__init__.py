"""What the API does, independent of HTTP, one component per concern.  Routers translate requests to
calls on the component they need; the algorithms are the pure functions of ``trace_service.allocation``
and ``trace_service.allocation.tree``.

- ``allocate``: POST /v1/allocate (idempotency, predictions, Stage 1)
- ``budget``: the store's byte budget (new work refused when it is full)
- ``intake``: POST /v1/expand (events, the follow-ups they make due, re-offers)
- ``stage2_rounds``: one Stage 2 round of one tree, decided (``trace_service.allocation.branching``)
  and recorded
- ``completion``: the bookkeeping once a tree is finished
- ``evidence``: what a job's finished groups say (its trust map; the predictor's calibration on control
  prompts)
- ``instructions``: GET /v1/instructions (leases)
- ``maintenance``: the sweeper
- ``queries``: tree export and close, job statistics, predictions on demand
- ``readiness``: whether this replica can serve (the store and the predictor answer)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from trace_service.engine.allocate import Allocation
from trace_service.engine.budget import StoreBudget, StoreFullError
from trace_service.engine.common import Clock, IdempotencyConflictError, NotFoundError
from trace_service.engine.completion import Completion
from trace_service.engine.evidence import JobEvidence
from trace_service.engine.instructions import Instructions
from trace_service.engine.intake import Intake
from trace_service.engine.maintenance import Sweeper
from trace_service.engine.queries import Jobs, JobStatistics, Predictions, Trees
from trace_service.engine.readiness import Readiness
from trace_service.engine.stage2_rounds import Stage2
from trace_service.metrics import Metrics
from trace_service.predictor.job_predictors import PredictorRegistry
from trace_service.settings import Settings
from trace_service.store import TreeStore

__all__ = [
    "Allocation",
    "Clock",
    "Engine",
    "IdempotencyConflictError",
    "Instructions",
    "Intake",
    "JobEvidence",
    "JobStatistics",
    "Jobs",
    "NotFoundError",
    "Predictions",
    "Readiness",
    "Stage2",
    "StoreBudget",
    "StoreFullError",
    "Sweeper",
    "Trees",
    "build_engine",
]


@dataclass(frozen=True)
class Engine:
    """The service's components, wired once per process: the app's state holds one and each route
    takes the component it uses (``deps``).  ``store`` and ``predictors`` are what they were built on:
    GET /v1/predictor reads a job's predictor; tests and the fault harness reach the store."""

    store: TreeStore
    predictors: PredictorRegistry
    evidence: JobEvidence
    allocation: Allocation
    intake: Intake
    instructions: Instructions
    sweeper: Sweeper
    trees: Trees
    stats: JobStatistics
    jobs: Jobs
    predictions: Predictions
    readiness: Readiness
    budget: StoreBudget


def build_engine(
    store: TreeStore,
    predictors: PredictorRegistry,
    settings: Settings,
    metrics: Metrics,
    *,
    clock: Clock = time.time,
) -> Engine:
    completion = Completion(store, metrics, settings.evidence_window)
    stage2 = Stage2(store, predictors, settings, metrics, completion, clock)
    evidence = JobEvidence(store, settings.evidence_half_life_steps)
    budget = StoreBudget(store, metrics, settings.store_max_bytes)
    return Engine(
        store=store,
        predictors=predictors,
        evidence=evidence,
        allocation=Allocation(store, predictors, evidence, budget, metrics, clock),
        intake=Intake(store, predictors.featurizer, settings, metrics, stage2, completion, clock),
        instructions=Instructions(store, settings, metrics, clock),
        sweeper=Sweeper(store, settings, stage2, completion, clock),
        trees=Trees(store, settings, completion, clock),
        stats=JobStatistics(store, settings, evidence, metrics),
        jobs=Jobs(store, predictors),
        predictions=Predictions(store, predictors),
        readiness=Readiness(store, predictors, metrics),
        budget=budget,
    )
