"""OpenTelemetry traces of the service: off unless the standard ``OTEL_*`` variables ask for them.

Tracing is on when ``OTEL_SDK_DISABLED`` is not ``true`` and either ``OTEL_TRACES_EXPORTER`` names an
exporter (``otlp``, or ``console`` to print spans on stdout; ``none``: off) or, that variable unset, an
OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``).  It
needs the ``tracing`` extra; asked for without it, the service logs one warning and runs untraced.

Traced, each request is a server span (a child of the caller's span when the request carries a
``traceparent`` header) with its Redis commands as child spans; health probes and ``/metrics`` are not
traced, nor are the background loops (the sweeper, the predictor's rounds), which would otherwise send a
trace of their own every few seconds per replica.  Spans leave in batches (``OTEL_BSP_*``) through the
OTLP exporter over HTTP/protobuf, configured by its own ``OTEL_EXPORTER_OTLP_*`` variables, sampled as
``OTEL_TRACES_SAMPLER`` says; ``service.name`` is ``trace-rollout`` unless ``OTEL_SERVICE_NAME`` or
``OTEL_RESOURCE_ATTRIBUTES`` names another.

Nothing here imports OpenTelemetry until tracing is asked for: the service runs without the extra.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from trace_proto.v1 import paths
from trace_service import __version__

if TYPE_CHECKING:
    from fastapi import FastAPI
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.trace import TracerProvider

logger = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "trace-rollout"
#: Probes and scrapes, left out of the traces; matched against the whole URL, so that a tree whose id
#: is "healthz" is still traced.
UNTRACED_URLS = ",".join(rf"^[a-z]+://[^/]+{path}$" for path in (paths.HEALTH, paths.READY, paths.METRICS))
EXPORTERS = ("otlp", "console")
INSTALL_HINT = "pip install 'trace-rollout[tracing]'"
#: What the service imports of the tracing extra.
EXTRA_MODULES = (
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.instrumentation.fastapi",
    "opentelemetry.instrumentation.redis",
)


def requested_exporters() -> list[str]:
    """The span exporters the ``OTEL_*`` variables ask for (the module's rule); empty: tracing is off."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not named:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    return [name for name in (part.strip() for part in named.split(",")) if name and name != "none"]


class Tracing:
    """The app's tracing, made by :func:`setup_tracing`: off (no provider), or the provider its requests
    report to.  The lifespan calls :meth:`start` and :meth:`stop` and runs its background loops in
    :meth:`untraced`."""

    def __init__(
        self,
        provider: TracerProvider | None = None,
        *,
        redis: RedisInstrumentor | None = None,
        owned: SdkTracerProvider | None = None,
        warnings: tuple[str, ...] = (),
    ) -> None:
        self.provider = provider
        self._redis = redis
        self._owned = owned
        # Logged at start, not when the app is built: only then is logging configured (uvicorn's).
        self._warnings = warnings

    def start(self) -> None:
        """Log what the ``OTEL_*`` variables asked for that cannot be done; trace the Redis commands."""
        for warning in self._warnings:
            logger.warning("%s", warning)
        if self._redis is not None:
            self._redis.instrument(tracer_provider=self.provider)

    def untraced(self) -> contextlib.AbstractContextManager[None]:
        """A context in which nothing is traced; tasks created in it keep it."""
        if self._redis is None:
            return contextlib.nullcontext()
        from opentelemetry.instrumentation.utils import suppress_instrumentation

        return suppress_instrumentation()

    def stop(self) -> None:
        """Stop tracing Redis; flush and close the provider made from the ``OTEL_*`` variables (one handed
        to :func:`setup_tracing` is its owner's to close)."""
        if self._redis is not None:
            self._redis.uninstrument()
        if self._owned is not None:
            self._owned.shutdown()


def setup_tracing(app: FastAPI, provider: TracerProvider | None = None) -> Tracing:
    """Trace ``app``'s requests to ``provider``, or, without one, as the ``OTEL_*`` variables say."""
    owned: SdkTracerProvider | None = None
    warnings: tuple[str, ...] = ()
    if provider is None:
        exporters = requested_exporters()
        known = [name for name in dict.fromkeys(exporters) if name in EXPORTERS]
        warnings = tuple(
            f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} ignored (this service has "
            f"{', '.join(EXPORTERS)})"
            for name in exporters
            if name not in EXPORTERS
        )
        if not known:
            return Tracing(warnings=warnings)
        if (missing := _missing_module()) is not None:
            warning = (
                f"the OTEL_* variables ask for traces but the tracing extra is not installed ({missing} "
                f"is missing; {INSTALL_HINT}): running without tracing"
            )
            return Tracing(warnings=(warning,))
        provider = owned = _provider_from_environment(known)
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    # The ASGI "receive" and "send" events would add two spans per request, each saying nothing.
    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=provider, excluded_urls=UNTRACED_URLS, exclude_spans=["receive", "send"]
    )
    return Tracing(provider, redis=RedisInstrumentor(), owned=owned, warnings=warnings)


def _missing_module() -> str | None:
    """The first module of the tracing extra that cannot be imported; None when all can (the SDK and
    its exporter may be there without the rest, brought by another package)."""
    for name in EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


def _provider_from_environment(exporters: list[str]) -> SdkTracerProvider:
    """A provider that batches spans to ``exporters``, its resource described by the environment."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    made: dict[str, Callable[[], SpanExporter]] = {"otlp": OTLPSpanExporter, "console": ConsoleSpanExporter}
    # The environment's service name and attributes win over the defaults.
    defaults = Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME, SERVICE_VERSION: __version__})
    resource = Resource.create(dict(defaults.merge(OTELResourceDetector().detect()).attributes))
    provider = SdkTracerProvider(resource=resource)
    for name in exporters:
        provider.add_span_processor(BatchSpanProcessor(made[name]()))
    return provider


def _span_ids_source() -> Callable[[], tuple[str, str] | None]:
    try:
        from opentelemetry import trace
    except ImportError:  # without OpenTelemetry no span is ever active
        return lambda: None

    def active_span_ids() -> tuple[str, str] | None:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return format(context.trace_id, "032x"), format(context.span_id, "016x")

    return active_span_ids


#: The trace and span ids (hex, as OTLP backends show them) of the span active here; None outside one.
active_span_ids = _span_ids_source()
