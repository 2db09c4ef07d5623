from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from trace_proto import ErrorResponse, Health, Ready
from trace_proto.v1 import paths
from trace_service.deps import ReadinessDep, SettingsDep
from trace_service.store.embedded import EmbeddedRedis

router = APIRouter(tags=["operations"])


@router.get(
    paths.HEALTH,
    response_model=Health,
    responses={503: {"model": ErrorResponse, "description": "The embedded store cannot be brought back"}},
)
async def healthz(request: Request, settings: SettingsDep) -> Health:
    """Liveness: the process answers.  An external store is not checked (restarting the service does
    not bring a lost Redis back); the embedded store's own redis-server is, once the service has failed
    to start it again for `store_heal_seconds`."""
    embedded: EmbeddedRedis | None = request.app.state.embedded_store
    if embedded is not None and (down := embedded.down_for()) > settings.store_heal_seconds:
        raise HTTPException(
            503, f"the embedded store's redis-server has been down for {down:.0f} s; see {embedded.data_dir}"
        )
    return Health()


@router.get(paths.READY, response_model=Ready, responses={503: {"model": Ready, "description": "Not ready"}})
async def readyz(readiness: ReadinessDep) -> JSONResponse:
    """Readiness: the tree store answers and a predictor is loaded."""
    ready = await readiness.check()
    return JSONResponse(ready.model_dump(mode="json"), status_code=200 if ready.ready else 503)


@router.get(paths.METRICS, include_in_schema=False)
async def metrics(request: Request, settings: SettingsDep) -> Response:
    port = settings.metrics_port
    if port:  # kept off the port trainers reach
        raise HTTPException(404, f"metrics are served on port {port}")
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
