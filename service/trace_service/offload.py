"""The rule for when CPU work leaves the event loop: by the number of items it covers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")
#: Items (nodes, turns, prompts) from which CPU work leaves the event loop for a worker thread; below
#: it the hand-off costs more than the work, and the loop is free again within a millisecond or two.
INLINE_ITEMS = 256


async def off_loop(size: int, work: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """``work(*args)``: in a worker thread when ``size`` items make it long enough to stall the loop.

    The thread gives the interpreter back at every switch interval (the service sets it to 0.5 ms),
    so work made of many short steps never holds the loop for long; one long call into C would, which
    is why large bodies and trees are read and written in parts.
    """
    if size <= INLINE_ITEMS:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)


async def release(size: int, holder: list[Any]) -> None:
    """Empty ``holder``, which holds the caller's last references to what it holds, in a worker thread
    when ``size`` items make freeing them long enough to stall the loop (a 100,000-node tree: a
    quarter of a second).  The caller gives up its own names for them first (``del``)."""
    await off_loop(size, holder.clear)
