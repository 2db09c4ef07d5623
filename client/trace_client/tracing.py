"""Opt-in OpenTelemetry for the clients: `instrument_tracing(client)` makes each HTTP attempt of the
client a span and sends its context along (the `traceparent` header), so that the service's spans of
the call join the caller's trace.  It needs the `tracing` extra; nothing imports OpenTelemetry until it
is called.

    client = instrument_tracing(TraceClient("http://trace-rollout:8000"))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from trace_client.client import AsyncTraceClient, TraceClient

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

ClientT = TypeVar("ClientT", TraceClient, AsyncTraceClient)


def instrument_tracing(client: ClientT, *, tracer_provider: TracerProvider | None = None) -> ClientT:
    """Trace ``client``'s calls to ``tracer_provider`` (by default the global one) and return ``client``.

    Each attempt, a retry included, is a span of its own.  Copies made by `with_options` send through
    the same HTTP client, so they are traced too; an `http_client` handed to the client is instrumented
    itself, for every user of it.

    Raises:
        ModuleNotFoundError: the `tracing` extra is not installed.
    """
    try:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    except ModuleNotFoundError as missing:
        raise ModuleNotFoundError(
            f"instrument_tracing needs the tracing extra ({missing.name} is missing): "
            "pip install 'trace-rollout[tracing]'",
            name=missing.name,
        ) from missing
    HTTPXClientInstrumentor.instrument_client(client._http, tracer_provider=tracer_provider)
    return client
