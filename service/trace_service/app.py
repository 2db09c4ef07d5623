"""The application factory: ``create_app(settings)`` and the lifespan that owns the store, the
predictor and the background tasks.  Run with ``trace-rollout serve`` or
``uvicorn trace_service.app:create_app --factory``."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from redis.exceptions import RedisError

from trace_proto import API_VERSION, AllocateRequest, ExpandRequest, PredictRequest
from trace_service import __version__
from trace_service.engine import Engine, build_engine
from trace_service.errors import install_error_handlers
from trace_service.metrics import Metrics
from trace_service.middleware import (
    AuthMiddleware,
    BodyLimitMiddleware,
    MetricsMiddleware,
    RequestContextMiddleware,
)
from trace_service.predictor import PredictorConfig
from trace_service.predictor.job_predictors import PredictorRegistry
from trace_service.routers import allocate, expand, health, predictor, trees
from trace_service.settings import Settings
from trace_service.store import TreeStore, connect
from trace_service.store.embedded import EmbeddedRedis, embedded_redis
from trace_service.telemetry import setup_tracing

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

logger = logging.getLogger(__name__)

#: Seconds a thread holding the GIL runs before another that waits for it may take it.
_SWITCH_INTERVAL = 0.0005
#: The cyclic collector's thresholds: allocations before a young collection, then young collections
#: before a middle one and middle ones before a full one (CPython's defaults: 700, 10, 10).
_GC_THRESHOLDS = (10_000, 10, 100)


async def _every(
    seconds: float, work: Callable[[], Awaitable[object]], name: str, stop: asyncio.Event, metrics: Metrics
) -> None:
    """Run ``work`` at a fixed interval until ``stop`` is set; a failed round is logged, never fatal.

    The stop event, not only cancellation, ends the loop: a store client that swallows a cancellation
    (fakeredis does) must not keep the shutdown waiting.
    """
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)
        if stop.is_set():
            return
        try:
            await work()
        except (RedisError, OSError) as error:
            metrics.store_errors.labels(name).inc()
            logger.warning("%s: store unavailable: %s", name, error)
        except Exception:
            logger.exception("%s failed", name)


def create_app(
    settings: Settings | None = None,
    *,
    store: TreeStore | None = None,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """Build the service.  ``store`` injects a ready store (tests); otherwise the settings name one.
    ``tracer_provider`` traces the app to a provider of the caller's (tests, a process that sets up
    OpenTelemetry itself); otherwise the ``OTEL_*`` variables decide (`trace_service.telemetry`)."""
    settings = settings or Settings()
    registry = _collector_registry()
    metrics = Metrics(registry)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tracing.start()
        tree_store, embedded = await _open_store(settings, store)
        predictors = await _predictor_registry(settings, tree_store, metrics)
        engine = build_engine(tree_store, predictors, settings, metrics, clock=app.state.clock)
        app.state.engine = engine
        metrics_server = (
            start_http_server(settings.metrics_port, settings.metrics_host, registry=registry)[0]
            if settings.metrics_port
            else None
        )
        restore_runtime = _tune_runtime()
        stop = asyncio.Event()
        app.state.embedded_store = embedded
        with tracing.untraced():  # the loops' tasks keep this context: a replica's own rounds go untraced
            tasks = _start_loops(settings, engine, predictors, embedded, stop, metrics)
        try:
            yield
        finally:
            await _stop_loops(stop, tasks)
            with contextlib.suppress(RedisError, OSError):
                await predictors.close(settings.shutdown_seconds)  # what it trains is written down
            if store is None:
                await tree_store.aclose()
            if embedded is not None:
                await embedded.stop()
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
            restore_runtime()
            tracing.stop()

    app = FastAPI(
        dependencies=[Depends(reject_unknown_query)],
        title="trace-rollout",
        version=__version__,
        summary="TRACE rollout allocation: spend an RLVR rollout budget where outcomes are likely mixed.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.registry = registry
    app.state.metrics = metrics
    # The clock leases, claims and timestamps run on, read when the app starts (a test may set its own).
    app.state.clock = time.time
    app.state.embedded_store = None
    _include_routers(app)
    install_error_handlers(app)
    _add_middleware(app, settings, metrics)
    tracing = setup_tracing(app, tracer_provider)
    auth_required = bool(settings.auth_tokens)
    app.openapi = lambda: openapi_document(app, auth_required=auth_required)  # type: ignore[method-assign]
    return app


def _collector_registry() -> CollectorRegistry:
    """A registry of the app's own, with what operators look for beside the service's metrics:
    process_*, python_info, python_gc_*."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def _include_routers(app: FastAPI) -> None:
    for router in (allocate.router, expand.router, trees.router, predictor.router, health.router):
        app.include_router(router)


def _add_middleware(app: FastAPI, settings: Settings, metrics: Metrics) -> None:
    # Outermost first: the request id exists before anything can fail; metrics see every answer.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, tokens=[token.get_secret_value() for token in settings.auth_tokens])
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(RequestContextMiddleware)


async def _open_store(settings: Settings, store: TreeStore | None) -> tuple[TreeStore, EmbeddedRedis | None]:
    """The injected store, or one on the Redis the settings name, or else on an embedded Redis (started
    here, and returned beside the store)."""
    embedded = None if store or settings.store_url else embedded_redis(settings.data_dir)
    store_url = await embedded.start() if embedded else settings.store_url
    tree_store = store or TreeStore(
        connect(store_url, cluster=settings.store_cluster),
        prefix=settings.store_prefix,
        tree_ttl=settings.tree_ttl_seconds,
        job_ttl=settings.job_ttl_seconds,
        idempotency_ttl=settings.idempotency_ttl_seconds,
        retention=settings.tree_retention_seconds,
    )
    return tree_store, embedded


async def _predictor_registry(settings: Settings, store: TreeStore, metrics: Metrics) -> PredictorRegistry:
    """The jobs' predictors, warm-started from the settings' checkpoint when they name one."""
    checkpoint = settings.predictor_checkpoint
    base = await asyncio.to_thread(Path(checkpoint).read_bytes) if checkpoint else None
    predictors = PredictorRegistry(
        store,
        metrics,
        PredictorConfig(device=settings.predictor_device, feature_dim=settings.predictor_feature_dim),
        capacity=settings.predictor_max_jobs,
        memory_budget=settings.predictor_memory_bytes,
        success_threshold=settings.success_threshold,
        train_steps=settings.train_steps_per_round,
        base=base,
    )
    if settings.torch_threads or predictors.cold.device.type == "cpu":
        import torch

        # A serving replica's forward passes are small: on a CPU, intra-op threads wait on each
        # other (and on the event loop's core) more than they help.
        torch.set_num_threads(settings.torch_threads or 1)
    return predictors


def _tune_runtime() -> Callable[[], None]:
    """Set the cyclic collector and the GIL's switch interval for serving; returns what sets them back."""
    # What exists now (torch, the app, the model: ~300,000 objects) lives as long as the process;
    # kept out of the cyclic collector, it no longer makes every full collection a ~200 ms pause.
    gc.collect()
    gc.freeze()
    # A large tree keeps hundreds of thousands of objects alive while it is worked on, and every full
    # collection meanwhile walks them all (a quarter of a second, in whatever thread runs it). Far
    # fewer collections of the older generations: those pauses become rare.
    thresholds = gc.get_threshold()
    gc.set_threshold(*_GC_THRESHOLDS)
    # CPU work runs in worker threads; the event loop waits for the GIL after each of its
    # system calls, up to the switch interval each time: 0.5 ms instead of 5 keeps /healthz fast.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(_SWITCH_INTERVAL)

    def restore() -> None:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(switch_interval)

    return restore


def _start_loops(
    settings: Settings,
    engine: Engine,
    predictors: PredictorRegistry,
    embedded: EmbeddedRedis | None,
    stop: asyncio.Event,
    metrics: Metrics,
) -> list[asyncio.Task[None]]:
    """The replica's background work until ``stop`` is set: the embedded Redis's supervision, the
    predictors' rounds, the sweeper and the store's measure against its budget."""
    return [
        *([asyncio.create_task(embedded.supervise(stop))] if embedded else []),
        asyncio.create_task(
            _every(
                settings.train_interval_seconds,
                lambda: predictors.refresh(train=settings.trainer),
                "predictor",
                stop,
                metrics,
            )
        ),
        asyncio.create_task(
            _every(settings.sweep_interval_seconds, engine.sweeper.sweep, "sweeper", stop, metrics)
        ),
        asyncio.create_task(
            _every(settings.sweep_interval_seconds, engine.budget.measure, "budget", stop, metrics)
        ),
    ]


async def _stop_loops(stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def reject_unknown_query(request: Request) -> None:
    """A query parameter the route does not take is an error (a typo must not fall back to a default)."""
    if not request.query_params:  # most requests: nothing to check
        return
    route = request.scope.get("route")
    known = _query_names(route.dependant) if isinstance(route, APIRoute) else set()
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        taken = ", ".join(sorted(known)) or "none"
        raise HTTPException(422, f"unknown query parameter(s) {unknown}; this route takes: {taken}")


def _query_names(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for dependency in dependant.dependencies:
        names |= _query_names(dependency)
    return names


#: The OpenAPI name of the bearer-token scheme.
BEARER_SCHEME = "bearer"


def openapi_document(app: FastAPI, *, auth_required: bool = False) -> dict[str, Any]:
    """The OpenAPI document, with the request bodies that routes validate from their bytes (off the
    event loop when large; /v1/expand event by event) described by their models, and the bearer scheme
    on every /v1 operation: required when the service has tokens, optional (``{}`` first) when not."""
    if app.openapi_schema is None:
        document = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        document["info"]["x-api-version"] = API_VERSION
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for model in (AllocateRequest, ExpandRequest, PredictRequest):
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        document["components"]["securitySchemes"] = {
            BEARER_SCHEME: {
                "type": "http",
                "scheme": "bearer",
                "description": "One of the service's TRACE_AUTH_TOKENS. Every /v1 call needs it when the "
                "service was started with tokens; without tokens none is asked for.",
            }
        }
        requirement: list[dict[str, list[str]]] = (
            [{BEARER_SCHEME: []}] if auth_required else [{}, {BEARER_SCHEME: []}]
        )
        for path, operations in document["paths"].items():
            if path.startswith("/v1/"):
                for operation in operations.values():
                    operation["security"] = requirement
        app.openapi_schema = document
    return app.openapi_schema
