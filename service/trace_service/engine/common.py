"""What the engine's components share: the errors they raise, their clock, fresh ids."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
#: Seconds since the epoch; leases, claims and timestamps all read one, which tests may move.
Clock = Callable[[], float]


class NotFoundError(LookupError):
    """An unknown tree or job."""


class IdempotencyConflictError(ValueError):
    """An idempotency key reused for a different request (answered 422, as payment APIs do)."""


def fresh_ids(count: int) -> list[str]:
    """``count`` random 128-bit ids in hex, from one draw of the OS's randomness (uuid4 per id cost a
    noticeable share of allocating a thousand trees)."""
    raw = os.urandom(16 * count).hex()
    return [raw[32 * i : 32 * (i + 1)] for i in range(count)]
