"""The running service answers on the paths the manifests probe and scrape, with the labels the alerts use."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import make_settings

from trace_lab.local import ThreadedService
from trace_service.metrics import METRIC_NAMES


@pytest.fixture(scope="module")
def service() -> Iterator[ThreadedService]:
    with ThreadedService.from_settings(make_settings()) as live:
        yield live


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def post(url: str, body: object) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code


def exposed_names(exposition: str) -> set[str]:
    families = text_string_to_metric_families(exposition)
    return {f"{family.name}_total" if family.type == "counter" else family.name for family in families}


def test_probe_paths_answer(service: ThreadedService) -> None:
    assert get(f"{service.url}/healthz")[0] == 200
    assert get(f"{service.url}/readyz")[0] == 200


def test_metrics_path_serves_every_metric(service: ThreadedService) -> None:
    status, exposition = get(f"{service.url}/metrics")
    assert status == 200
    assert exposed_names(exposition) >= METRIC_NAMES
    # The process, platform and garbage-collector families every Python exporter has.
    standard = {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"}
    assert standard | {"python_gc_objects_collected_total"} <= exposed_names(exposition)


def test_requests_are_labelled_by_route_template(service: ThreadedService) -> None:
    """The latency alert selects http_route="/v1/expand"; the dashboard's job filter needs the job label."""
    post(f"{service.url}/v1/expand", {"events": []})
    allocation = {
        "job": "ops-check",
        "step": 0,
        "budget": 4,
        "prompts": [{"prompt_id": "p0"}, {"prompt_id": "p1"}],
    }
    assert post(f"{service.url}/v1/allocate", allocation) == 200
    samples = [
        sample
        for family in text_string_to_metric_families(get(f"{service.url}/metrics")[1])
        for sample in family.samples
    ]
    routes = {
        s.labels.get("http_route") for s in samples if s.name == "http_server_request_duration_seconds_count"
    }
    assert {"/v1/expand", "/v1/allocate"} <= routes
    jobs = {s.labels.get("training_job") for s in samples if s.name == "trace_allocate_prompts_total"}
    assert "ops-check" in jobs


def request_counts(service: ThreadedService) -> dict[tuple[str, str, str], float]:
    """Requests answered so far, by (method, route, status code) as the HTTP histogram labels them."""
    return {
        (
            s.labels["http_request_method"],
            s.labels["http_route"],
            s.labels["http_response_status_code"],
        ): s.value
        for family in text_string_to_metric_families(get(f"{service.url}/metrics")[1])
        for s in family.samples
        if s.name == "http_server_request_duration_seconds_count"
    }


def call(url: str, method: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code


def test_request_labels_stay_bounded(service: ThreadedService) -> None:
    """Route templates, not paths; methods outside the semantic convention's list are ``_OTHER``; a path
    no route matches is ``unmatched``."""
    before = request_counts(service)
    assert get(f"{service.url}/v1/trees/no-such-tree")[0] == 404
    assert call(f"{service.url}/v1/expand", "PROPFIND") == 405
    assert get(f"{service.url}/no/such/path")[0] == 404
    after = request_counts(service)
    for key in (
        ("GET", "/v1/trees/{tree_id}", "404"),
        ("_OTHER", "/v1/expand", "405"),
        ("GET", "unmatched", "404"),
    ):
        assert after.get(key, 0) - before.get(key, 0) == 1, key
    assert not any("no-such" in route or method == "PROPFIND" for method, route, _ in after)
