"""trace_client: talk to a trace-rollout service from a trainer or a generation worker.

`TraceClient` (blocking) and `AsyncTraceClient` (asyncio) cover every v1 call; requests and answers
are the `trace_proto` models, errors the `trace_client.errors` hierarchy. The base install needs only
pydantic and httpx: nothing here imports torch, numpy or the service. `instrument_tracing(client)` traces
a client's calls into the service's traces (the `tracing` extra: OpenTelemetry).
"""

from trace_client._core import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, Backoff
from trace_client.client import AsyncTraceClient, TraceClient
from trace_client.errors import (
    TraceAPIError,
    TraceAuthError,
    TraceBadRequest,
    TraceConflict,
    TraceConnectionError,
    TraceError,
    TraceNotFound,
    TraceRateLimited,
    TraceRejectedEventsError,
    TraceResponseError,
    TraceServerError,
    TraceTimeoutError,
    TraceUnavailable,
    TraceValidationError,
)
from trace_client.tracing import instrument_tracing

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "AsyncTraceClient",
    "Backoff",
    "TraceAPIError",
    "TraceAuthError",
    "TraceBadRequest",
    "TraceClient",
    "TraceConflict",
    "TraceConnectionError",
    "TraceError",
    "TraceNotFound",
    "TraceRateLimited",
    "TraceRejectedEventsError",
    "TraceResponseError",
    "TraceServerError",
    "TraceTimeoutError",
    "TraceUnavailable",
    "TraceValidationError",
    "instrument_tracing",
]
