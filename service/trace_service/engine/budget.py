"""The store's byte budget: measured in the background, checked before new work.

Only new work is refused at the budget (``POST /v1/allocate`` answers 503 with the figures): trees
already allocated keep taking their events, deciding their rounds and finishing, so a full store never
strands a tree in flight.  Below the budget, retention by need (``TreeStore.retain_tree``) is what
frees the store as trainers read their trees and the predictors learn from them.
"""

from __future__ import annotations

import logging

from trace_service.metrics import Metrics
from trace_service.store import TreeStore

logger = logging.getLogger(__name__)

#: The share of Redis's maxmemory that is the budget when none is configured: new work stops before
#: Redis itself refuses writes (or evicts keys), so the trees in flight still have room to finish.
MAXMEMORY_SHARE = 0.9


class StoreFullError(RuntimeError):
    """New work refused: the store holds its byte budget (answered 503, with a Retry-After)."""


class StoreBudget:
    """The store's size as last measured against its budget (``TRACE_STORE_MAX_BYTES``, else a share
    of Redis's maxmemory; none when neither is set)."""

    def __init__(self, store: TreeStore, metrics: Metrics, budget: int) -> None:
        self.store = store
        self.metrics = metrics
        self.configured = budget
        self.used = 0
        self.budget = budget

    async def measure(self) -> None:
        """Read the store's size (``TreeStore.memory``) and report it with the budget."""
        used, maxmemory = await self.store.memory()
        self.used = used
        self.budget = self.configured or int(MAXMEMORY_SHARE * maxmemory)
        self.metrics.store_bytes.set(used)
        self.metrics.store_budget_bytes.set(self.budget)

    def check_new_work(self) -> None:
        """:class:`StoreFullError` when the store holds its budget."""
        if self.budget and self.used >= self.budget:
            self.metrics.store_full_refusals.inc()
            raise StoreFullError(
                f"the tree store is full: it holds {self.used:,} bytes of its {self.budget:,}-byte budget, "
                "so new allocations wait while the trees in flight finish; finished trees are freed "
                "once read and learned from (TRACE_TREE_RETENTION_SECONDS), or raise "
                "TRACE_STORE_MAX_BYTES or Redis's maxmemory"
            )
