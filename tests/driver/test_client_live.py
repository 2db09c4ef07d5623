"""The clients' retry, timeout and error paths over real HTTP: against the real service, and against the
real service behind a gateway that fails on purpose (503 with Retry-After, answers lost after the
service acted, slow answers)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from driver_support import assert_every_promise_kept, quiet_settings, step_request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trace_client import (
    AsyncTraceClient,
    Backoff,
    TraceAuthError,
    TraceClient,
    TraceConnectionError,
    TraceNotFound,
    TraceTimeoutError,
    TraceUnavailable,
)
from trace_client.driver import DriverConfig, RolloutDriver
from trace_lab.local import ThreadedService
from trace_lab.sim import SimWorkload
from trace_lab.sim.workers import SimAgent
from trace_proto import AllocateRequest, ExpandEvent, PromptIn, paths
from trace_service.app import create_app

FAST_RETRIES = Backoff(initial_delay=0.01, max_delay=0.05)

#: What the gateway does with one request: pass it on, refuse it (503), act and lose the answer, stall.
Fault = str | None


@dataclass
class Gateway:
    """Pure ASGI in front of the real app. `plan(method, path, n)` picks the fault for the n-th request
    (0-based) to that path: None passes it on; "refuse" answers 503 with `Retry-After`; "lose" lets the
    service act, then answers 503 instead of its answer; "stall" waits `stall_seconds` first."""

    app: ASGIApp
    plan: Callable[[str, str, int], Fault]
    retry_after: str = "0"
    stall_seconds: float = 1.0
    seen: dict[str, int] = field(default_factory=dict)
    lost_answers: list[bytes] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        count = self.seen.get(path, 0)
        self.seen[path] = count + 1
        fault = self.plan(scope["method"], path, count)
        if fault == "refuse":
            await _unavailable(send, self.retry_after)
        elif fault == "lose":
            body: list[bytes] = []

            async def swallow(message: Message) -> None:
                if message["type"] == "http.response.body":
                    body.append(message.get("body", b""))

            await self.app(scope, receive, swallow)
            self.lost_answers.append(b"".join(body))
            await _unavailable(send, self.retry_after)
        else:
            if fault == "stall":
                await asyncio.sleep(self.stall_seconds)
            await self.app(scope, receive, send)


async def _unavailable(send: Send, retry_after: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [(b"retry-after", retry_after.encode()), (b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": b"busy"})


@pytest.fixture
def gateway_at() -> Iterator[Callable[..., tuple[str, Gateway]]]:
    """`gateway_at(plan, **options)`: a fresh service behind a gateway; returns its URL and the gateway."""
    services: list[ThreadedService] = []

    def start(plan: Callable[[str, str, int], Fault], **options: Any) -> tuple[str, Gateway]:
        gateway = Gateway(create_app(quiet_settings()), plan, **options)
        service = ThreadedService(gateway).__enter__()
        services.append(service)
        return service.url, gateway

    yield start
    for service in services:
        service.__exit__(None, None, None)


def _allocate_request(job: str = "live") -> AllocateRequest:
    return AllocateRequest(
        job=job, step=0, budget=4, prompts=[PromptIn(prompt_id="a"), PromptIn(prompt_id="b")]
    )


def test_503_with_retry_after_is_retried_until_the_service_answers(gateway_at: Any) -> None:
    url, gateway = gateway_at(lambda method, path, n: "refuse" if path == paths.ALLOCATE and n < 2 else None)
    with TraceClient(url, backoff=FAST_RETRIES) as client:
        allocation = client.allocate(_allocate_request())
    assert gateway.seen[paths.ALLOCATE] == 3
    assert sum(tree.rollouts for tree in allocation.trees) == 4


def test_a_lost_allocate_answer_is_retried_without_allocating_twice(gateway_at: Any) -> None:
    url, gateway = gateway_at(lambda method, path, n: "lose" if path == paths.ALLOCATE and n == 0 else None)
    with TraceClient(url, backoff=FAST_RETRIES) as client:
        allocation = client.allocate(_allocate_request())
        (stats,) = client.job_stats("live").steps
    (lost,) = gateway.lost_answers
    assert json.loads(lost)["allocation_id"] == allocation.allocation_id  # the same key, the same answer
    assert stats.active == len(allocation.trees)
    assert stats.budget_promised == 4


async def test_a_lost_expand_answer_counts_every_turn_once(gateway_at: Any) -> None:
    url, gateway = gateway_at(lambda method, path, n: "lose" if path == paths.EXPAND and n == 0 else None)
    async with AsyncTraceClient(url, backoff=FAST_RETRIES) as client:
        allocation = await client.allocate(_allocate_request())
        tree = allocation.trees[0]
        events = [
            ExpandEvent(
                event_id=f"e{j}", tree_id=tree.tree_id, node_id=f"n{j}", done=True, reward=float(j % 2)
            )
            for j in range(tree.rollouts)
        ]
        response = await client.expand(events)
        exported = await client.get_tree(tree.tree_id)
    assert (response.accepted, response.duplicates) == (0, len(events))
    assert json.loads(gateway.lost_answers[0])["accepted"] == len(events)
    assert exported.value == pytest.approx(sum(j % 2 for j in range(tree.rollouts)) / tree.rollouts)
    assert sum(node.visits for node in exported.nodes) == tree.rollouts


def test_an_outage_longer_than_the_retries_raises_unavailable(gateway_at: Any) -> None:
    url, gateway = gateway_at(lambda method, path, n: "refuse")
    with (
        TraceClient(url, backoff=FAST_RETRIES, max_retries=2) as client,
        pytest.raises(TraceUnavailable) as raised,
    ):
        client.predictor_info()
    assert raised.value.status == 503
    assert gateway.seen[paths.PREDICTOR] == 3


def test_a_retry_after_beyond_the_cap_is_waited_for_up_to_the_cap(gateway_at: Any) -> None:
    url, gateway = gateway_at(lambda method, path, n: "refuse", retry_after="3600")
    capped = Backoff(initial_delay=0.01, max_delay=0.05, max_retry_after=0.05)
    started = time.monotonic()
    with TraceClient(url, backoff=capped, max_retries=2) as client, pytest.raises(TraceUnavailable):
        client.predictor_info()
    assert gateway.seen[paths.PREDICTOR] == 3
    assert time.monotonic() - started < 10.0


def test_a_slow_answer_times_out_after_every_retry(gateway_at: Any) -> None:
    url, gateway = gateway_at(lambda method, path, n: "stall", stall_seconds=1.0)
    client = TraceClient(url, backoff=FAST_RETRIES, timeout=0.2, max_retries=1)
    with client, pytest.raises(TraceTimeoutError, match="after 2 attempts"):
        client.predictor_info()
    assert gateway.seen[paths.PREDICTOR] == 2


def test_nothing_listening_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        client = TraceClient(f"http://127.0.0.1:{port}", backoff=FAST_RETRIES, max_retries=1)
        with client, pytest.raises(TraceConnectionError, match="after 2 attempts"):
            client.health()


def test_error_answers_of_the_real_service_carry_status_and_request_id() -> None:
    with ThreadedService(create_app(quiet_settings(auth_tokens="secret"))) as service:
        with TraceClient(service.url, token="secret") as client, pytest.raises(TraceNotFound) as missing:
            client.get_tree("no-such-tree")
        with TraceClient(service.url) as anonymous, pytest.raises(TraceAuthError) as refused:
            anonymous.predictor_info()
    assert missing.value.status == 404 and missing.value.request_id
    assert "no-such-tree" in missing.value.detail
    assert refused.value.status == 401


async def test_the_driver_rides_out_a_flaky_service(
    gateway_at: Any, workload: SimWorkload, agent: SimAgent
) -> None:
    """Every other /v1/expand is lost after the service acted or refused outright: the driver still
    completes every tree, counting every turn once."""
    faults = ("lose", "refuse")
    url, gateway = gateway_at(
        lambda method, path, n: faults[n // 2 % 2] if path == paths.EXPAND and n % 2 else None
    )
    async with AsyncTraceClient(url, backoff=FAST_RETRIES, max_retries=1) as client:
        config = DriverConfig(poll_interval=0.1, batch_events=32)
        result = await RolloutDriver(client, agent.next_turn, config=config).run_step(step_request(workload))
        await assert_every_promise_kept(client, result)
    assert gateway.lost_answers
