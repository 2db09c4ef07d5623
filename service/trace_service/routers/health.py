from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from trace_proto import Health, Ready
from trace_proto.v1 import paths
from trace_service.deps import MetricsDep, SettingsDep, StoreDep

router = APIRouter(tags=["operations"])


@router.get(paths.HEALTH, response_model=Health)
async def healthz() -> Health:
    """Liveness: the process answers (no dependency is checked)."""
    return Health()


@router.get(paths.READY, response_model=Ready, responses={503: {"model": Ready, "description": "Not ready"}})
async def readyz(store: StoreDep, metrics: MetricsDep) -> JSONResponse:
    """Readiness: the tree store answers and a predictor is loaded."""
    try:
        store_up = await store.ping()
    except (RedisError, OSError):
        store_up = False
    metrics.store_up.set(int(store_up))
    ready = Ready(ready=store_up, store=store_up, predictor=True)
    return JSONResponse(ready.model_dump(mode="json"), status_code=200 if store_up else 503)


@router.get(paths.METRICS, include_in_schema=False)
async def metrics(request: Request, settings: SettingsDep) -> Response:
    port = settings.metrics_port
    if port:  # kept off the port trainers reach
        raise HTTPException(404, f"metrics are served on port {port}")
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
