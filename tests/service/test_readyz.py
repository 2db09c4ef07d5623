"""GET /readyz over HTTP: 200 with every check true, 503 naming the check that failed."""

from __future__ import annotations

import httpx
import pytest

from trace_lab.local import ThreadedService


def test_readyz_answers_200_when_the_store_and_the_predictor_answer(service: ThreadedService) -> None:
    answer = httpx.get(f"{service.url}/readyz")
    assert (answer.status_code, answer.json()) == (200, {"ready": True, "store": True, "predictor": True})


def test_readyz_answers_503_when_the_predictor_cannot_predict(
    service: ThreadedService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(queries: object) -> None:
        raise RuntimeError("weights on a lost device")

    monkeypatch.setattr(service.app.state.engine.predictors.cold, "predict_versioned", broken)
    answer = httpx.get(f"{service.url}/readyz")
    assert (answer.status_code, answer.json()) == (503, {"ready": False, "store": True, "predictor": False})
