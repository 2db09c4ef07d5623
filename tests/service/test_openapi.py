"""The committed OpenAPI document matches the code, and no generated request makes the server fail."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from support import make_settings

from trace_lab.local import ThreadedService
from trace_service.app import create_app
from trace_service.cli import openapi_text

OPENAPI = Path(__file__).resolve().parents[2] / "proto" / "openapi.v1.json"

schema = schemathesis.openapi.from_path(OPENAPI)


def test_committed_openapi_document_is_current() -> None:
    assert OPENAPI.read_text() == openapi_text(), (
        "run `trace-rollout openapi` and commit proto/openapi.v1.json"
    )


def test_every_v1_operation_declares_the_bearer_scheme_required_only_when_tokens_are_set() -> None:
    committed = json.loads(OPENAPI.read_text())
    assert committed["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": committed["components"]["securitySchemes"]["bearer"]["description"],
    }
    operations = [
        (path, operation) for path, item in committed["paths"].items() for operation in item.values()
    ]
    for path, operation in operations:
        expected = [{}, {"bearer": []}] if path.startswith("/v1/") else None
        assert operation.get("security") == expected, path
    live = create_app(make_settings(auth_tokens="s3cret")).openapi()
    assert {
        str(operation["security"]) for path, item in live["paths"].items() if path.startswith("/v1/")
        for operation in item.values()
    } == {str([{"bearer": []}])}  # fmt: skip


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
