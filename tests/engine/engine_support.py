"""The engine suite's wiring: its components on the in-memory embedded store, with a clock the test
moves; no HTTP, no server, no redis-server."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from trace_service.engine import Engine
from trace_service.metrics import Metrics
from trace_service.settings import Settings
from trace_service.store import TreeStore


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
