"""What a liveness check needs of a running service: a thread that probes `/healthz` throughout, request
bodies of hostile shapes, and the requests that build one large tree. `bench/liveness.py` measures with
them at full size, the service's tests at a small one."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx

#: Seconds between two health probes.
PROBE_INTERVAL = 0.02


@dataclass
class HealthProbe:
    """A thread asking `/healthz` every :data:`PROBE_INTERVAL` s; each probe's start and seconds to
    its answer (``timeout`` when none came)."""

    url: str
    timeout: float
    probes: list[tuple[float, float]] = field(default_factory=list)
    failures: int = 0
    _waiting_since: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> HealthProbe:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 5)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout) as client:
            while not self._stop.is_set():
                start = self._waiting_since = time.monotonic()
                try:
                    status = client.get(f"{self.url}/healthz").status_code
                except httpx.HTTPError:
                    status = 0
                self.probes.append((start, time.monotonic() - start))
                self._waiting_since = None
                self.failures += status != 200
                self._stop.wait(PROBE_INTERVAL)

    def slowest(self, start: float, end: float) -> float:
        """The slowest answer among the probes in flight at any time in [start, end]; a probe that is
        still waiting counts for as long as it has waited."""
        waits = [wait for begun, wait in self.probes if begun <= end and begun + wait >= start]
        waiting_since = self._waiting_since
        if waiting_since is not None:
            waits.append(time.monotonic() - waiting_since)
        return max([0.0, *waits])


#: Per route taking a body: what comes before its large array, one good element (``%d`` its index,
#: ``%s`` its filler text) and one bad one.
ROUTES: dict[str, tuple[bytes, bytes, bytes]] = {
    "/v1/expand": (
        b'{"events":[',
        b'{"event_id":"e%d","tree_id":"no-such-tree","node_id":"n","text":"%s"}',
        b'{"event_id":"bad","tree_id":"t","node_id":"n","done":"yes"}',
    ),
    "/v1/allocate": (
        b'{"step":0,"budget":4,"prompts":[',
        b'{"prompt_id":"p%d","text":"%s"}',
        b'{"prompt_id":5}',
    ),
    "/v1/predict": (b'{"histories":[', b'{"prompt_id":"p%d","prompt_text":"%s"}', b'{"prompt_id":5}'),
}


def hostile_bodies(size: int, route: str = "/v1/expand") -> dict[str, bytes]:
    """Bodies for ``route`` of about ``size`` bytes, each of a shape that once cost time out of
    proportion to its size, or that a linear reader must still read to its end."""
    head, good, bad = ROUTES[route]
    count = min(4096, max(1, size // 300))
    filler = b"x" * max(1, size // count - 80)
    elements = [good % (i, filler) for i in range(count - 1)] + [bad]
    return {
        "a string that never closes": head + b'"' + b'\\"' * (size // 2),
        "quotes only": head + b'"' * size,
        "nesting never closed": head + b"[" * size,
        "empty elements": head + b"," * size + b"]}",
        "one bad element among good ones": head + b",".join(elements) + b"]}",
    }


def allocate_one_tree(client: httpx.Client, rollouts: int) -> str:
    """Allocate one prompt exactly ``rollouts`` bare rollouts and no continuations; its tree's id."""
    allocation = client.post(
        "/v1/allocate",
        json={
            "step": 0,
            "budget": rollouts,
            "min_rollouts": rollouts,
            "max_rollouts": rollouts,
            "expansion": 0.0,
            "policy": "uniform",
            "prompts": [{"prompt_id": "large", "text": "a task with many long rollouts"}],
        },
    ).json()
    return str(allocation["trees"][0]["tree_id"])


def turn_events(tree_id: str, depth: int, rollouts: range, *, last: int) -> list[dict[str, object]]:
    """The events of turn ``depth`` (0-based) of each rollout in ``rollouts``; turn ``last`` ends each
    rollout, every other one a success."""
    return [
        {
            "event_id": f"{j}-{depth}",
            "tree_id": tree_id,
            "node_id": f"n{j}-{depth}",
            "parent_id": f"n{j}-{depth - 1}" if depth else None,
            "text": f"turn {depth}: called a tool, observed {j * depth % 97}",
            **({"done": True, "reward": float(j % 2)} if depth == last else {}),
        }
        for j in rollouts
    ]
