"""One live service (embedded store) shared by a module's driver tests; each test uses its own job."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from driver_support import quiet_settings

from trace_lab.local import ThreadedService
from trace_lab.sim import SimConfig, SimWorkload
from trace_lab.sim.workers import SimAgent


@pytest.fixture(scope="module")
def live() -> Iterator[ThreadedService]:
    with ThreadedService.from_settings(quiet_settings()) as service:
        yield service


@pytest.fixture
def workload() -> SimWorkload:
    return SimWorkload(SimConfig(prompts=64), seed=3)


@pytest.fixture
def agent(workload: SimWorkload) -> SimAgent:
    return SimAgent(workload, np.random.default_rng(7))
