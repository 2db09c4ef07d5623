"""What the engine's components share: the errors they raise, their clock, fresh ids, and the rule for
when CPU work leaves the event loop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
#: Seconds since the epoch; leases, claims and timestamps all read one, which tests may move.
Clock = Callable[[], float]

_P = ParamSpec("_P")
_R = TypeVar("_R")
#: Items (nodes, turns, prompts) from which CPU work leaves the event loop for a worker thread; below
#: it the hand-off costs more than the work, and the loop is free again within a millisecond or two.
_INLINE_ITEMS = 256


class NotFoundError(LookupError):
    """An unknown tree or job."""


class IdempotencyConflictError(ValueError):
    """An idempotency key reused for a different request (answered 422, as payment APIs do)."""


async def off_loop(size: int, work: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """``work(*args)``: in a worker thread when ``size`` items make it long enough to stall the loop."""
    if size <= _INLINE_ITEMS:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)


def fresh_ids(count: int) -> list[str]:
    """``count`` random 128-bit ids in hex, from one draw of the OS's randomness (uuid4 per id cost a
    noticeable share of allocating a thousand trees)."""
    raw = os.urandom(16 * count).hex()
    return [raw[32 * i : 32 * (i + 1)] for i in range(count)]
