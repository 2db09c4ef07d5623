"""Dependencies as Annotated aliases: handlers declare the component they use, tests override it.

They are ``async def`` although they never await: FastAPI runs a plain ``def`` dependency in a worker
thread, a thread hand-off on every request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from trace_service.engine import (
    Allocation,
    Engine,
    Instructions,
    Intake,
    JobEvidence,
    Jobs,
    JobStatistics,
    Predictions,
    Readiness,
    Trees,
)
from trace_service.predictor.job_predictors import PredictorRegistry
from trace_service.settings import Settings


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


async def get_allocation(request: Request) -> Allocation:
    return _engine(request).allocation


async def get_intake(request: Request) -> Intake:
    return _engine(request).intake


async def get_instructions(request: Request) -> Instructions:
    return _engine(request).instructions


async def get_trees(request: Request) -> Trees:
    return _engine(request).trees


async def get_stats(request: Request) -> JobStatistics:
    return _engine(request).stats


async def get_jobs(request: Request) -> Jobs:
    return _engine(request).jobs


async def get_predictions(request: Request) -> Predictions:
    return _engine(request).predictions


async def get_predictors(request: Request) -> PredictorRegistry:
    return _engine(request).predictors


async def get_evidence(request: Request) -> JobEvidence:
    return _engine(request).evidence


async def get_readiness(request: Request) -> Readiness:
    return _engine(request).readiness


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


AllocationDep = Annotated[Allocation, Depends(get_allocation)]
IntakeDep = Annotated[Intake, Depends(get_intake)]
InstructionsDep = Annotated[Instructions, Depends(get_instructions)]
TreesDep = Annotated[Trees, Depends(get_trees)]
StatsDep = Annotated[JobStatistics, Depends(get_stats)]
JobsDep = Annotated[Jobs, Depends(get_jobs)]
PredictionsDep = Annotated[Predictions, Depends(get_predictions)]
PredictorsDep = Annotated[PredictorRegistry, Depends(get_predictors)]
EvidenceDep = Annotated[JobEvidence, Depends(get_evidence)]
ReadinessDep = Annotated[Readiness, Depends(get_readiness)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
