from __future__ import annotations

from fastapi import APIRouter, Request

from trace_proto import PredictorInfo, PredictRequest, PredictResponse
from trace_proto.v1 import paths
from trace_service.deps import PredictionsDep, PredictorDep
from trace_service.routers.body import documented, validated
from trace_service.routers.responses import ERRORS

router = APIRouter(tags=["predictor"])


@router.get(paths.PREDICTOR, response_model=PredictorInfo, responses=ERRORS)
async def predictor_info(predictor: PredictorDep) -> PredictorInfo:
    """Version, examples seen and held-out quality (Brier, ECE, Spearman overall and by depth)."""
    return await predictor.info()


@router.post(
    paths.PREDICT, response_model=PredictResponse, responses=ERRORS, openapi_extra=documented(PredictRequest)
)
async def predict(request: Request, predictions: PredictionsDep) -> PredictResponse:
    """Ṽ(H) for given histories (debugging and offline evaluation)."""
    body = await validated(request, PredictRequest, "histories")
    return await predictions.predict(body.job, body.histories)
