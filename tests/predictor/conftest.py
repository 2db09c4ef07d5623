"""Fixtures shared by the predictor tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from predictor_synthetic import SyntheticTask


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def synthetic_task() -> SyntheticTask:
    return SyntheticTask.create(seed=1234)
