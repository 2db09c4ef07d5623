"""A job's predictor and its deletion over HTTP: `GET /v1/predictor?job=`, `predictor_from`,
`DELETE /v1/jobs/{job}`, and the clear errors around them."""

from __future__ import annotations

import time

import httpx
import pytest
from support import rollout

from trace_client import TraceClient
from trace_client.errors import TraceValidationError
from trace_lab.local import ThreadedService
from trace_proto import AllocateRequest, Policy, PromptIn


def finished_step(client: TraceClient, job: str, step: int = 0, **fields: object) -> None:
    """One step of ``job`` whose trees all complete (no continuations), half their rollouts succeeding."""
    request = AllocateRequest.model_validate(
        {
            "job": job,
            "step": step,
            "budget": 16,
            "expansion": 0.0,
            "policy": Policy.UNIFORM,
            "prompts": [PromptIn(prompt_id=f"p{i}", text=f"task {i}") for i in range(4)],
            **fields,
        }
    )
    allocation = client.allocate(request)
    client.expand(
        [
            event
            for tree in allocation.trees
            for j in range(tree.rollouts)
            for event in rollout(tree.tree_id, None, 2, float(j % 2))
        ]
    )


def trained(client: TraceClient, job: str) -> int:
    """The job's predictor version once its trees have been trained on."""
    deadline = time.monotonic() + 30
    while (version := client.predictor_info(job).version) == 0:
        assert time.monotonic() < deadline, f"job {job!r} never trained"
        time.sleep(0.1)
    return version


def test_each_job_has_its_own_predictor_and_a_deleted_job_has_none(service: ThreadedService) -> None:
    with TraceClient(service.url) as client:
        finished_step(client, "first")
        assert trained(client, "first") >= 1
        untouched = client.predictor_info("second")
        assert (untouched.job, untouched.version, untouched.examples_seen) == ("second", 0, 0)
        # A new job may start from the first's weights; nothing flows back.
        finished_step(client, "second", predictor_from="first")
        assert client.predictor_info("second").version >= client.predictor_info("first").version

        deleted = client.delete_job("first")
        assert deleted.job == "first" and deleted.keys_deleted > 0
        assert client.predictor_info("first").version == 0
        assert client.delete_job("first").keys_deleted == 0  # a retry finds nothing left
        assert client.predictor_info("second").version >= 1
        assert client.job_stats("second").steps


def test_starting_from_a_job_without_a_predictor_is_a_clear_error(service: ThreadedService) -> None:
    with (
        TraceClient(service.url) as client,
        pytest.raises(TraceValidationError, match="'nobody', which has no trained predictor"),
    ):
        finished_step(client, "new", predictor_from="nobody")


@pytest.mark.parametrize(
    ("method", "path", "message"),
    [
        ("GET", "/v1/predictor?job=a%20b", "String should match pattern"),
        ("GET", "/v1/predictor?jobs=x", "unknown query parameter"),
        ("DELETE", "/v1/jobs/-bad", "String should match pattern"),
    ],
)
def test_a_bad_job_name_is_refused_with_a_message(
    service: ThreadedService, method: str, path: str, message: str
) -> None:
    answer = httpx.request(method, f"{service.url}{path}")
    assert answer.status_code == 422 and message in answer.text
