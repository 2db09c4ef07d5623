"""The engine's components wired on the in-memory embedded store (``engine_support.Wired``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from engine_support import Wired, wire
from support import make_settings


@pytest.fixture
async def wired() -> AsyncIterator[Wired]:
    async with wire(make_settings()) as wired:
        yield wired
