"""The engine suite's wiring: its components on the in-memory embedded store, with a clock the test
moves; no HTTP, no server, no redis-server."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch
from prometheus_client import CollectorRegistry

from trace_service.engine import Engine, build_engine
from trace_service.metrics import Metrics
from trace_service.predictor import PredictorConfig
from trace_service.predictor.job_predictors import PredictorRegistry
from trace_service.settings import Settings
from trace_service.store import TreeStore, connect


@dataclass
class ManualClock:
    now: float

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Wired:
    engine: Engine
    store: TreeStore
    metrics: Metrics
    settings: Settings
    clock: ManualClock
    registry: CollectorRegistry

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A metric's current value (0 when the series does not exist yet)."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0


def predictors_of(store: TreeStore, metrics: Metrics, settings: Settings) -> PredictorRegistry:
    """A replica's predictors on ``store``, as the app builds them (on the CPU)."""
    return PredictorRegistry(
        store,
        metrics,
        PredictorConfig(device="cpu", feature_dim=settings.predictor_feature_dim),
        capacity=settings.predictor_max_jobs,
        success_threshold=settings.success_threshold,
        train_steps=settings.train_steps_per_round,
    )


@contextlib.asynccontextmanager
async def wire(settings: Settings) -> AsyncIterator[Wired]:
    """The engine on a fresh store (in memory unless the settings name a Redis), with a clock the test
    moves."""
    torch.set_num_threads(1)
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    store = TreeStore(connect(settings.store_url), prefix=settings.store_prefix)
    clock = ManualClock(time.time())
    engine = build_engine(store, predictors_of(store, metrics, settings), settings, metrics, clock=clock)
    try:
        yield Wired(engine, store, metrics, settings, clock, registry)
    finally:
        await store.aclose()
