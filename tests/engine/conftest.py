"""The engine's components wired on the in-memory embedded store (``engine_support.Wired``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import torch
from engine_support import ManualClock, Wired
from prometheus_client import CollectorRegistry
from support import make_settings

from trace_service.engine import build_engine
from trace_service.metrics import Metrics
from trace_service.runtime import PredictorRuntime, build_predictor
from trace_service.store import TreeStore, connect


@pytest.fixture
async def wired() -> AsyncIterator[Wired]:
    torch.set_num_threads(1)
    settings = make_settings()
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    store = TreeStore(connect(""), prefix=settings.store_prefix)
    model = build_predictor("cpu", settings.predictor_feature_dim, "")
    runtime = PredictorRuntime(
        model,
        store,
        metrics,
        success_threshold=settings.success_threshold,
        train_steps=settings.train_steps_per_round,
    )
    clock = ManualClock(time.time())
    engine = build_engine(store, runtime, settings, metrics, clock=clock)
    yield Wired(engine, store, metrics, settings, clock, registry)
    await store.aclose()
