"""OpenTelemetry tracing (the `tracing` extra): a traced client's call and the service's handling of it
are one trace, the store's commands inside it; the OTEL_* variables alone switch tracing on and export
it; without the extra the service says so once and runs untraced."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi import FastAPI
from support import make_settings, rollout

from trace_client import TraceClient, instrument_tracing
from trace_lab.local import LOOPBACK, ThreadedService
from trace_proto import AllocateRequest, PromptIn
from trace_service.app import create_app
from trace_service.telemetry import requested_exporters, setup_tracing

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

HTTPX_SCOPE = "opentelemetry.instrumentation.httpx"
REDIS_SCOPE = "opentelemetry.instrumentation.redis"
OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


@pytest.fixture(autouse=True)
def no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the OTEL_* variables it means; none leak in from the machine."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def allocation() -> AllocateRequest:
    return AllocateRequest(
        step=0, budget=4, expansion=1.0, prompts=[PromptIn(prompt_id="p1", text="prove it")]
    )


def url_of(span: ReadableSpan) -> str:
    attributes = span.attributes or {}
    return str(attributes.get("url.full", attributes.get("http.url", "")))


def scope_of(span: ReadableSpan) -> str:
    return span.instrumentation_scope.name if span.instrumentation_scope is not None else ""


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_a_traced_call_and_the_service_handling_it_are_one_trace(store_url: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(make_settings(store_url), tracer_provider=provider)
    with ThreadedService(app) as service, TraceClient(service.url) as client:
        instrument_tracing(client, tracer_provider=provider)
        tree = client.allocate(allocation()).trees[0]
        client.expand(rollout(tree.tree_id, None, 2, 1.0))
        client.health()
    spans = exporter.get_finished_spans()  # the service has stopped: every span has ended

    calls = [span for span in spans if scope_of(span) == HTTPX_SCOPE]
    assert all(span.parent is None for span in calls)
    (expand_client,) = [span for span in calls if url_of(span).endswith("/v1/expand")]
    trace_id = expand_client.context.trace_id
    trace = [span for span in spans if span.context.trace_id == trace_id]
    (server,) = [span for span in trace if span.kind is SpanKind.SERVER]
    assert server.name == "POST /v1/expand"
    assert parent_id(server) == expand_client.context.span_id  # the traceparent header crossed the wire
    store_spans = [span for span in trace if scope_of(span) == REDIS_SCOPE]
    assert store_spans, "the expand's store commands are in its trace"
    assert {parent_id(span) for span in store_spans} == {server.context.span_id}
    assert {span.context.span_id for span in trace} == {
        expand_client.context.span_id,
        server.context.span_id,
        *(span.context.span_id for span in store_spans),
    }
    # The probe is traced by the client only, and the background loops (0.2 s apart here) not at all.
    assert len(calls) == 3
    assert sorted(span.name for span in spans if span.kind is SpanKind.SERVER) == [
        "POST /v1/allocate",
        "POST /v1/expand",
    ]
    assert all(parent_id(span) is not None for span in spans if span not in calls)


class Collector:
    """An OTLP/HTTP trace receiver on a loopback port: the export requests it was sent."""

    def __init__(self) -> None:
        received: list[ExportTraceServiceRequest] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    received.append(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.received = received
        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.url = f"http://{LOOPBACK}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Collector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def spans(self) -> Iterator[tuple[dict[str, str], str]]:
        """Each span received: its resource's string attributes and its name."""
        for request in self.received:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        yield resource, span.name


@pytest.mark.parametrize("service_name", [None, "trace-rollout-canary"])
def test_the_otel_variables_alone_export_the_requests(
    monkeypatch: pytest.MonkeyPatch, service_name: str | None
) -> None:
    with Collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        if service_name is not None:
            monkeypatch.setenv("OTEL_SERVICE_NAME", service_name)
        with ThreadedService(create_app(make_settings())) as service, TraceClient(service.url) as client:
            client.allocate(allocation())
            client.ready()
        # Stopping the service flushed its batches.
        spans = list(collector.spans())
    names = {name for _, name in spans}
    assert "POST /v1/allocate" in names
    assert "GET /readyz" not in names
    assert {resource["service.name"] for resource, _ in spans} == {service_name or "trace-rollout"}


@pytest.mark.parametrize(
    ("environment", "exporters"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp, console"}, ["otlp", "console"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, []),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp"}, []),
    ],
)
def test_which_variables_switch_tracing_on(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], exporters: list[str]
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert requested_exporters() == exporters


def test_without_the_extra_one_warning_and_no_tracing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setitem(sys.modules, "opentelemetry.instrumentation.fastapi", None)
    tracing = setup_tracing(FastAPI())
    with caplog.at_level(logging.WARNING, logger="trace_service.telemetry"):
        tracing.start()
        with tracing.untraced():
            pass
        tracing.stop()
    assert tracing.provider is None
    (warning,) = caplog.messages
    assert "tracing extra is not installed" in warning and "trace-rollout[tracing]" in warning


def test_an_unknown_exporter_is_named_in_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    tracing = setup_tracing(FastAPI())
    with caplog.at_level(logging.WARNING, logger="trace_service.telemetry"):
        tracing.start()
    assert tracing.provider is None
    assert caplog.messages == [
        "OTEL_TRACES_EXPORTER: unknown exporter 'zipkin' ignored (this service has otlp, console)"
    ]
