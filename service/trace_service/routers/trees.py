from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from trace_proto import JobDeleted, JobStats, TreeResponse
from trace_proto.v1 import limits, paths
from trace_proto.v1.common import JobName
from trace_service.deps import JobsDep, StatsDep, TreesDep
from trace_service.routers.responses import ERRORS, NOT_FOUND

router = APIRouter(tags=["trees"])

TreeId = Annotated[str, Path(min_length=1, max_length=limits.MAX_ID_LENGTH)]


@router.get(paths.TREE, response_model=TreeResponse, responses={**ERRORS, **NOT_FOUND})
async def get_tree(tree_id: TreeId, trees: TreesDep) -> Response:
    """A tree with per-node visits, successes, value V̂, the prediction used, advantage and reward."""
    return Response(await trees.tree(tree_id), media_type="application/json")


@router.post(paths.TREE_CLOSE, response_model=TreeResponse, responses={**ERRORS, **NOT_FOUND})
async def close_tree(tree_id: TreeId, trees: TreesDep) -> Response:
    """Finish a tree early: it takes no more turns and its outstanding instructions are withdrawn."""
    return Response(await trees.close(tree_id), media_type="application/json")


@router.get(paths.JOB_STATS, response_model=JobStats, responses={**ERRORS, **NOT_FOUND})
async def job_stats(
    job: Annotated[JobName, Path()],
    stats: StatsDep,
    from_step: Annotated[
        int | None, Query(ge=0, le=limits.MAX_STEP, description="The first step reported (inclusive).")
    ] = None,
    to_step: Annotated[
        int | None, Query(ge=0, le=limits.MAX_STEP, description="The last step reported (inclusive).")
    ] = None,
) -> JobStats:
    """Effective ratio, budget accounting and the split between the policy and uniform per training step
    (the most recent steps, within `[from_step, to_step]` when given), and the job's gain over uniform
    over those steps."""
    return await stats.job_stats(job, from_step, to_step)


@router.delete(paths.JOB, response_model=JobDeleted, responses=ERRORS)
async def delete_job(job: Annotated[JobName, Path()], jobs: JobsDep) -> JobDeleted:
    """Delete everything of a job: its trees, its prompts' outcomes, its statistics, its queued
    instructions and its predictor (weights, training data, trainer lease).  A job that held nothing
    answers with ``keys_deleted`` 0."""
    return await jobs.delete(job)
