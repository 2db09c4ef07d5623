"""The Grafana dashboard and the alert rules against the metrics the service really exports."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ops_support import (
    alert_rules,
    dashboard_expressions,
    dashboard_panels,
    find_tool,
    load_dashboard,
    metric_names_in,
    prometheus_rule_spec,
    registered_metric_names,
)
from prometheus_client import CollectorRegistry, start_http_server

from trace_lab.local import free_port
from trace_service.metrics import Metrics

ALERT_TESTS = Path(__file__).with_name("alert_rules_test.yaml")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


def test_metric_name_extraction_strips_histogram_suffixes() -> None:
    expression = (
        'histogram_quantile(0.99, sum by (le) (rate(trace_stage2_duration_seconds_bucket{le!=""}[5m])))'
        " / on() trace_store_up"
    )
    assert metric_names_in(expression) == {"trace_stage2_duration_seconds", "trace_store_up"}


def test_dashboard_queries_use_only_exported_metrics(dashboard: dict[str, Any]) -> None:
    used = set().union(*map(metric_names_in, dashboard_expressions(dashboard)))
    assert used, "the dashboard has no trace_ queries"
    assert used <= registered_metric_names(), used - registered_metric_names()


def test_dashboard_shows_every_exported_metric(dashboard: dict[str, Any]) -> None:
    used = set().union(*map(metric_names_in, dashboard_expressions(dashboard)))
    assert registered_metric_names() <= used, registered_metric_names() - used


def test_alert_rules_use_only_exported_metrics() -> None:
    used = set().union(*(metric_names_in(rule["expr"]) for rule in alert_rules(prometheus_rule_spec())))
    assert used, "the alert rules have no trace_ queries"
    assert used <= registered_metric_names(), used - registered_metric_names()


def test_dashboard_is_portable_and_filters_by_job(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "trace-rollout"
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["training_job"]["type"] == "query"
    assert "label_values(trace_" in variables["training_job"]["definition"]

    panels = list(dashboard_panels(dashboard))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["targets"], panel.get("title")
        # No hard-coded data source UID: the dashboard must import into any Grafana.
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
    job_scoped = [expression for expression in dashboard_expressions(dashboard) if "job=~" in expression]
    assert all('training_job=~"$training_job"' in expression for expression in job_scoped)
    assert job_scoped


def promtool_or_skip() -> str:
    promtool = find_tool("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return promtool


@pytest.fixture
def rule_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(prometheus_rule_spec()))
    return path


def test_promtool_accepts_the_rules(rule_file: Path) -> None:
    promtool = promtool_or_skip()
    result = subprocess.run(
        [promtool, "check", "rules", str(rule_file)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_fire_when_they_should(rule_file: Path) -> None:
    promtool = promtool_or_skip()
    tests = shutil.copy(ALERT_TESTS, rule_file.parent)
    result = subprocess.run(
        [promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def populate(metrics: Metrics) -> None:
    """One sample of every series the dashboard asks for, as a running service would produce."""
    for route, status in (("/v1/allocate", 200), ("/v1/expand", 200), ("/v1/expand", 500)):
        metrics.http_requests.labels(route, "POST", str(status)).inc()
        metrics.http_duration.labels(route, "POST").observe(0.004)
    metrics.allocate_duration.labels("trace").observe(0.002)
    for decision in ("active", "skipped"):
        metrics.allocate_prompts.labels("run-a", decision).inc(4)
    metrics.expand_duration.observe(0.001)
    metrics.stage2_duration.observe(0.0005)
    metrics.instructions_issued.labels("run-a").inc(3)
    metrics.instruction_backlog.labels("run-a").set(2)
    metrics.instruction_lease_expiries.labels("run-a").inc()
    for kind in ("bare", "continuation"):
        metrics.budget_promised.labels("run-a", kind).inc(8)
        metrics.budget_spent.labels("run-a", kind).inc(6)
    metrics.budget_fallback.labels("run-a").inc()
    metrics.budget_unspent.labels("run-a").inc(2)
    for mixed in ("true", "false"):
        metrics.trees_completed.labels("run-a", mixed).inc()
    metrics.effective_ratio.labels("run-a").set(0.5)
    metrics.observe_predictor(version=2, brier=0.2, ece=0.05, spearman=0.4)
    metrics.predictor_examples.inc(100)
    metrics.predictor_train_duration.observe(0.3)
    metrics.predictor_load_failures.inc(0)
    metrics.store_errors.labels("apply_events").inc()
    metrics.store_up.set(1)


class Prometheus:
    """A throwaway Prometheus server on loopback, queried through its HTTP API."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def get(self, path: str, **parameters: str) -> dict[str, Any]:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(parameters)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                answer: dict[str, Any] = json.load(response)
        except urllib.error.HTTPError as error:  # a bad query is a 400 with the parser's message
            answer = json.load(error)
        return answer

    def query(self, expression: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=expression)

    def wait_for(self, expression: str, deadline_seconds: float) -> None:
        """Polls until ``expression`` returns a sample: Prometheus scrapes on its own clock."""
        deadline = time.monotonic() + deadline_seconds
        while not self.query(expression).get("data", {}).get("result"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression} returned nothing within {deadline_seconds} s")
            time.sleep(0.2)


@pytest.fixture
def scraping_prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    binary = find_tool("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (Debian package prometheus)")
    metrics = Metrics(CollectorRegistry())
    populate(metrics)
    exporter, exporter_thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        # Same job name and label handling (no honor_labels) as the ServiceMonitor.
        "scrape_configs": [
            {
                "job_name": "trace-rollout",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter.server_port}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        prometheus = Prometheus(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while True:
            try:
                prometheus.wait_for('count_over_time(up{job="trace-rollout"}[1m]) >= 3', 30)
                break
            except OSError:  # the server is not listening yet
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        yield prometheus
    finally:
        server.terminate()
        server.wait(timeout=30)
        exporter.shutdown()
        exporter_thread.join(timeout=10)


def grafana_to_promql(expression: str) -> str:
    """Replaces the Grafana variables the dashboard uses by what Grafana would send."""
    return (
        expression.replace("$__rate_interval", "1m")
        .replace("$__range", "1m")
        .replace('"$training_job"', '"run-a|run-b"')
    )


@pytest.mark.slow
def test_real_prometheus_answers_every_query(
    scraping_prometheus: Prometheus, dashboard: dict[str, Any]
) -> None:
    label_values = "/api/v1/label/training_job/values"
    jobs = scraping_prometheus.get(label_values, **{"match[]": "trace_allocate_prompts_total"})
    assert jobs["data"] == ["run-a"], "the training run's label must arrive as the service wrote it"
    scrape_jobs = scraping_prometheus.get(
        "/api/v1/label/job/values", **{"match[]": "trace_allocate_prompts_total"}
    )
    assert scrape_jobs["data"] == ["trace-rollout"], "job stays the scrape job, without honor_labels"

    for expression in dashboard_expressions(dashboard):
        answer = scraping_prometheus.query(grafana_to_promql(expression))
        assert answer["status"] == "success", (expression, answer.get("error"))
        assert answer["data"]["result"], f"no data for {expression}"
    for rule in alert_rules(prometheus_rule_spec()):
        answer = scraping_prometheus.query(rule["expr"])
        assert answer["status"] == "success", (rule["alert"], answer.get("error"))
