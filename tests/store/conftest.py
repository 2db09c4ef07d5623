"""The store contract suite's fixture: a fresh store on each backend (``store_url``: the embedded
fakeredis and a real redis-server), kept apart from other tests by its own key prefix."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from trace_service.store import TreeStore, connect


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[TreeStore]:
    tree_store = TreeStore(
        connect(store_url),
        prefix=f"contract-{uuid.uuid4().hex[:12]}",
        tree_ttl=600,
        job_ttl=1_200,
        idempotency_ttl=300,
    )
    try:
        yield tree_store
    finally:
        await tree_store.aclose()
