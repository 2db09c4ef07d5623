"""Readiness reports what the store and the predictor answer now, each on its own."""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import Wired

from trace_proto import Ready
from trace_service.predictor import Predictive


async def test_a_replica_whose_store_and_predictor_answer_is_ready(wired: Wired) -> None:
    assert await wired.engine.readiness.check() == Ready(ready=True, store=True, predictor=True)
    assert wired.sample("trace_store_up") == 1


async def test_a_predictor_that_fails_makes_the_replica_unready(
    wired: Wired, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(queries: object) -> None:
        raise RuntimeError("weights on a lost device")

    monkeypatch.setattr(wired.engine.predictors.cold, "predict_versioned", broken)
    assert await wired.engine.readiness.check() == Ready(ready=False, store=True, predictor=False)


async def test_a_predictor_that_answers_no_probability_makes_the_replica_unready(
    wired: Wired, monkeypatch: pytest.MonkeyPatch
) -> None:
    def diverged(queries: list[object]) -> tuple[int, Predictive]:
        return 7, Predictive(np.full(len(queries), np.nan), np.ones(len(queries)))

    monkeypatch.setattr(wired.engine.predictors.cold, "predict_versioned", diverged)
    assert await wired.engine.readiness.check() == Ready(ready=False, store=True, predictor=False)


async def test_a_store_that_does_not_answer_makes_the_replica_unready(
    wired: Wired, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down() -> bool:
        raise ConnectionError("connection refused")

    monkeypatch.setattr(wired.store, "ping", down)
    assert await wired.engine.readiness.check() == Ready(ready=False, store=False, predictor=True)
    assert wired.sample("trace_store_up") == 0
