"""`GET /v1/predictor` and `POST /v1/predict`: a job's success predictor."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from trace_proto import DEFAULT_JOB, PredictorInfo, PredictRequest, PredictResponse
from trace_proto.v1 import paths
from trace_proto.v1.limits import JOB_PATTERN
from trace_service.deps import EvidenceDep, PredictionsDep, PredictorsDep
from trace_service.parsing.body import documented, validated
from trace_service.routers.responses import ERRORS

router = APIRouter(tags=["predictor"])

JobQuery = Annotated[str, Query(pattern=JOB_PATTERN, description="The job whose predictor to describe.")]


@router.get(paths.PREDICTOR, response_model=PredictorInfo, responses=ERRORS)
async def predictor_info(
    predictors: PredictorsDep, evidence: EvidenceDep, job: JobQuery = DEFAULT_JOB
) -> PredictorInfo:
    """The job's predictor: version, examples seen and held-out quality (Brier, ECE, Spearman overall and
    by depth), its calibration on the job's control prompts and the trust map Stage 1 applies.  A job
    that has learned nothing yet is served by the clean predictor (version 0)."""
    return await evidence.describe(await (await predictors.get(job)).info())


@router.post(
    paths.PREDICT, response_model=PredictResponse, responses=ERRORS, openapi_extra=documented(PredictRequest)
)
async def predict(request: Request, predictions: PredictionsDep) -> PredictResponse:
    """Ṽ(H) for given histories by the job's predictor (debugging and offline evaluation)."""
    body = await validated(request, PredictRequest, "histories")
    return await predictions.predict(body.job, body.histories)
