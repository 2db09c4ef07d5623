"""Shared by the fault tests: replica settings for the load of `trace_lab.load` (the one `bench/load.py`
runs too), the audit's verdict, and a store call that fails once."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from support import make_settings

from trace_lab.load import FAULT_TOLERANT_SETTINGS, Audit
from trace_service.settings import Settings
from trace_service.store import RedisClient, TreeStore


def new_prefix() -> str:
    return f"fault-{uuid.uuid4().hex[:12]}"


def replica_settings(store_url: str, prefix: str, **overrides: object) -> Settings:
    """An in-process replica configured like the service processes under the load (short leases), on the
    key prefix it shares with its peers."""
    values: dict[str, object] = {
        name.removeprefix("TRACE_").lower(): value for name, value in FAULT_TOLERANT_SETTINGS.items()
    }
    return make_settings(store_url, **{**values, "store_prefix": prefix, **overrides})


def process_settings(prefix: str) -> dict[str, str]:
    """The environment of a `trace-rollout serve` process that shares `prefix` with in-process replicas."""
    return {**FAULT_TOLERANT_SETTINGS, "TRACE_STORE_PREFIX": prefix}


def assert_clean(audit: Audit) -> None:
    """Nothing lost or invented, nothing applied twice, no budget over-spent, every tree finished."""
    expected = dataclasses.replace(
        audit, lost=0, phantom=0, over_accepted=0, miscounted=0, overspent=0, unexpected_rejections=0, open=0
    )
    assert audit == expected
    assert audit.events > 0 and audit.trees > 0


def fail_once(monkeypatch: pytest.MonkeyPatch, store: TreeStore | RedisClient, method: str) -> None:
    """`method` of the store (or of its Redis client) raises a Redis connection error on its next call,
    then works again: what a replica sees when Redis drops the connection at that moment, and what its
    peers see when the replica dies there."""
    original = getattr(store, method)
    calls = 0

    async def failing(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RedisConnectionError(f"injected: the store went away during {method}")
        return await original(*args, **kwargs)

    monkeypatch.setattr(store, method, failing)
