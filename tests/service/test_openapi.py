"""The committed OpenAPI document matches the code, and no generated request makes the server fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from support import make_settings

from trace_lab.local import ThreadedService
from trace_service.cli import openapi_text

OPENAPI = Path(__file__).resolve().parents[2] / "proto" / "openapi.v1.json"

schema = schemathesis.openapi.from_path(OPENAPI)


def test_committed_openapi_document_is_current() -> None:
    assert OPENAPI.read_text() == openapi_text(), (
        "run `trace-rollout openapi` and commit proto/openapi.v1.json"
    )


@pytest.fixture(scope="module")
def fuzzed_service() -> Iterator[ThreadedService]:
    with ThreadedService.from_settings(make_settings("")) as live:
        yield live


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_server_error(
    case: schemathesis.Case, fuzzed_service: ThreadedService
) -> None:
    response = case.call(base_url=fuzzed_service.url)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:500]}"
    if response.status_code >= 400:
        assert response.headers["content-type"][0].startswith("application/problem+json"), response.text[:300]
        assert response.json()["request_id"]


class Workflow(schema.as_state_machine()):  # type: ignore[misc]
    """Stateful runs: allocate, then follow the answer's links to expand, trees, stats, instructions."""

    base_url = ""

    def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, str]:
        return {"base_url": self.base_url}

    def validate_response(self, response: Any, case: schemathesis.Case, *args: Any, **kwargs: Any) -> None:
        assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:500]}"


def test_no_sequence_of_linked_requests_gets_a_server_error(fuzzed_service: ThreadedService) -> None:
    Workflow.base_url = fuzzed_service.url
    Workflow.run(
        settings=settings(
            max_examples=25, stateful_step_count=6, deadline=None, suppress_health_check=list(HealthCheck)
        )
    )
