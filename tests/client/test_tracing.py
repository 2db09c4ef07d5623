"""`instrument_tracing`: a client's calls become spans whose context travels to the service in a
`traceparent` header, retries included, on the blocking and the asyncio client; without the extra it
says which to install."""

from __future__ import annotations

import sys

import httpx
import pytest

from trace_client import AsyncTraceClient, TraceClient, instrument_tracing
from trace_proto import Health

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

HEALTHY = Health().model_dump_json().encode()


def recording_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_each_attempt_is_a_span_whose_context_the_service_receives() -> None:
    provider, exporter = recording_provider()
    sent: list[str] = []  # the traceparent of each attempt (a retry sends the same request object again)

    def flaky(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["traceparent"])
        return httpx.Response(503 if len(sent) == 1 else 200, content=HEALTHY)

    client = TraceClient(
        "http://trace.test",
        transport=httpx.MockTransport(flaky),
        sleep=lambda _: None,
    )
    with instrument_tracing(client, tracer_provider=provider):
        client.health()
    spans = exporter.get_finished_spans()
    assert len(spans) == len(sent) == 2
    # traceparent: version-trace id-parent span id-flags
    assert [traceparent.split("-")[1:3] for traceparent in sent] == [
        [f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"] for span in spans
    ]


async def test_the_asyncio_client_and_its_copies_are_traced() -> None:
    provider, exporter = recording_provider()
    sent: list[httpx.Request] = []

    def healthy(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, content=HEALTHY)

    async with instrument_tracing(
        AsyncTraceClient("http://trace.test", transport=httpx.MockTransport(healthy)),
        tracer_provider=provider,
    ) as client:
        await client.health()
        await client.with_options(timeout=5.0).health()
    assert len(exporter.get_finished_spans()) == 2
    assert all("traceparent" in request.headers for request in sent)


def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.instrumentation.httpx", None)
    with (
        TraceClient(
            "http://trace.test", transport=httpx.MockTransport(lambda _: httpx.Response(200))
        ) as client,
        pytest.raises(ModuleNotFoundError, match=r"trace-rollout\[tracing\]"),
    ):
        instrument_tracing(client)
