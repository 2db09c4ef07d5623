"""Test support: settings for tests and events to send.  The service on them
(`ThreadedService.from_settings`), servers and Redis come from `trace_lab.local`, the harness that
tests, benchmarks and the demo share."""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator

from trace_proto import ExpandEvent
from trace_service.app import create_app
from trace_service.engine import Engine
from trace_service.settings import Settings


def make_settings(store_url: str = "", **overrides: object) -> Settings:
    """Settings for a test: its own key prefix (tests share redis-servers), fast background loops."""
    values: dict[str, object] = {
        "store_url": store_url,
        "data_dir": "",  # the embedded store in memory: tests that need it durable give a directory
        "store_prefix": f"test-{uuid.uuid4().hex[:12]}",
        "train_interval_seconds": 0.2,
        "sweep_interval_seconds": 0.2,
        "torch_threads": 1,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running_engine(store_url: str = "", **settings: object) -> AsyncIterator[Engine]:
    """The app's engine in this test's event loop, its sweeper slowed so that the test drives it."""
    app = create_app(make_settings(store_url, sweep_interval_seconds=3600, **settings))
    async with app.router.lifespan_context(app):
        yield app.state.engine


_ids = itertools.count()


def turn(
    tree_id: str,
    parent: str | None,
    *,
    done: bool = False,
    reward: float | None = None,
    instruction: str | None = None,
) -> ExpandEvent:
    n = next(_ids)
    return ExpandEvent(
        event_id=f"e{n}",
        tree_id=tree_id,
        node_id=f"n{n}",
        parent_id=parent,
        text=f"turn {n}",
        done=done,
        reward=reward,
        instruction_id=instruction,
    )


def rollout(
    tree_id: str, start: str | None, turns: int, reward: float, instruction: str | None = None
) -> list[ExpandEvent]:
    """A chain of turns from ``start``; the last one scored."""
    events = []
    parent = start
    for t in range(turns):
        last = t == turns - 1
        event = turn(
            tree_id,
            parent,
            done=last,
            reward=reward if last else None,
            instruction=instruction if t == 0 else None,
        )
        events.append(event)
        parent = event.node_id
    return events
