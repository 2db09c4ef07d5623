"""The workload families by name: `FAMILIES[name](seed, prompts, **overrides)` builds one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from trace_client.sim.base import Workload
from trace_client.sim.config import SimConfig
from trace_client.sim.family_config import MathConfig, MultihopConfig, ToolcallConfig
from trace_client.sim.math_reasoning import MathWorkload
from trace_client.sim.multihop import MultihopWorkload
from trace_client.sim.toolcall import ToolcallWorkload
from trace_client.sim.workload import SimWorkload


class WorkloadFactory(Protocol):
    def __call__(self, seed: int, prompts: int | None = None, **overrides: Any) -> Workload: ...


def _factory(build: Callable[[Any, int], Workload], default: Any) -> WorkloadFactory:
    """A factory that replaces `prompts` (when given) and any other config fields in the default."""

    def make(seed: int, prompts: int | None = None, **overrides: Any) -> Workload:
        if prompts is not None:
            overrides["prompts"] = prompts
        return build(dataclasses.replace(default, **overrides), seed)

    return make


FAMILIES: dict[str, WorkloadFactory] = {
    "react": _factory(SimWorkload, SimConfig()),
    "math": _factory(MathWorkload, MathConfig()),
    "multihop": _factory(MultihopWorkload, MultihopConfig()),
    "toolcall": _factory(ToolcallWorkload, ToolcallConfig()),
}


def make_workload(family: str, seed: int, prompts: int | None = None) -> Workload:
    """The named family's workload with its default config (and `prompts` tasks when given)."""
    try:
        factory = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown workload family {family!r}; known: {sorted(FAMILIES)}") from None
    return factory(seed, prompts)
