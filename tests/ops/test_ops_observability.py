"""The Grafana dashboard and the alert rules against the metrics the service really exports."""

from __future__ import annotations

import json
import re
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
    METRIC_NAME_PATTERN,
    REPO_ROOT,
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
RUNBOOK = REPO_ROOT / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/trace-rollout/trace-rollout/blob/main/docs/runbook.md"

#: Where every dashboard query looks: the variables a Grafana user picks the deployment with.
SCOPE_FILTERS = {"cluster": ("=~", "$cluster"), "namespace": ("=~", "$namespace")}
JOB_FILTER = ("=~", "$training_job")

_SELECTOR = re.compile(rf"(?<![A-Za-z0-9_:])({METRIC_NAME_PATTERN})\s*(?:\{{([^}}]*)\}})?")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_AGGREGATION = re.compile(
    r"\b(sum|min|max|avg|count|group|stddev|stdvar|topk|bottomk|quantile|count_values)\s*"
    r"(?:(by|without)\s*\(([^)]*)\)\s*)?\("
)


def metric_selectors(expression: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """Every selector of one of the service's metrics in a PromQL expression, with its label matchers
    by label."""
    return [
        (name, {label: (operator, value) for label, operator, value in _MATCHER.findall(matchers or "")})
        for name, matchers in _SELECTOR.findall(expression)
    ]


def aggregations(expression: str) -> list[tuple[str, str | None, list[str]]]:
    """Every aggregation of a PromQL expression: operator, ``by``/``without`` (or None), its labels."""
    return [
        (operator, modifier or None, [label.strip() for label in labels.split(",") if label.strip()])
        for operator, modifier, labels in _AGGREGATION.findall(expression)
    ]


def markdown_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown document."""
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def dashboard_rows(dashboard: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The panels under each row, by the row's title: a collapsed row holds its own, an open row the
    panels placed below it and above the next row."""
    rows = sorted(
        (panel for panel in dashboard["panels"] if panel["type"] == "row"),
        key=lambda row: row["gridPos"]["y"],
    )
    grouped: dict[str, list[dict[str, Any]]] = {row["title"]: list(row.get("panels", [])) for row in rows}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        above = [row for row in rows if row["gridPos"]["y"] < panel["gridPos"]["y"]]
        assert above, f"panel {panel['title']!r} sits above every row"
        grouped[above[-1]["title"]].append(panel)
    return grouped


def firing_cases() -> dict[str, list[dict[str, Any]]]:
    """The expected alerts of every promtool test case that expects some, by alert name."""
    cases: dict[str, list[dict[str, Any]]] = {}
    for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            if case.get("exp_alerts"):
                cases.setdefault(case["alertname"], []).extend(case["exp_alerts"])
    return cases


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


def test_metric_name_extraction_strips_histogram_suffixes() -> None:
    expression = (
        'histogram_quantile(0.99, sum by (le) (rate(trace_stage2_duration_seconds_bucket{le!=""}[5m])))'
        " / on() trace_store_up"
        " + sum by (http_route) (rate(http_server_request_duration_seconds_count[5m]))"
    )
    assert metric_names_in(expression) == {
        "trace_stage2_duration_seconds",
        "trace_store_up",
        "http_server_request_duration_seconds",
    }


def test_dashboard_queries_use_only_exported_metrics(dashboard: dict[str, Any]) -> None:
    used = set().union(*map(metric_names_in, dashboard_expressions(dashboard)))
    assert used, "the dashboard has no trace_ queries"
    assert used <= registered_metric_names(), used - registered_metric_names()


def test_dashboard_shows_every_exported_metric(dashboard: dict[str, Any]) -> None:
    used = set().union(*map(metric_names_in, dashboard_expressions(dashboard)))
    assert registered_metric_names() <= used, registered_metric_names() - used


def test_alert_aggregations_keep_namespace() -> None:
    """Two deployments watched by one Prometheus (staging and production) never mix in an alert."""
    for rule in alert_rules(prometheus_rule_spec()):
        for operator, modifier, labels in aggregations(rule["expr"]):
            assert modifier == "by" and "namespace" in labels, (rule["alert"], operator, modifier, labels)


def test_every_alert_links_its_runbook_section() -> None:
    anchors = markdown_anchors(RUNBOOK.read_text())
    for rule in alert_rules(prometheus_rule_spec()):
        url = rule["annotations"].get("runbook_url", "")
        page, _, anchor = url.partition("#")
        assert page == RUNBOOK_URL, (rule["alert"], url)
        assert anchor == rule["alert"].lower(), (rule["alert"], url)
        assert anchor in anchors, f"docs/runbook.md has no heading for {rule['alert']}"


def test_every_alert_has_a_firing_test_case() -> None:
    """alert_rules_test.yaml makes every alert fire at least once, namespace and runbook included."""
    cases = firing_cases()
    for rule in alert_rules(prometheus_rule_spec()):
        expected = cases.get(rule["alert"])
        assert expected, f"no promtool case in {ALERT_TESTS.name} where {rule['alert']} fires"
        assert any("namespace" in alert.get("exp_labels", {}) for alert in expected), rule["alert"]
        for alert in expected:
            assert alert.get("exp_labels", {}).get("severity") == rule["labels"]["severity"], rule["alert"]
            runbook = alert.get("exp_annotations", {}).get("runbook_url")
            assert runbook and runbook == rule["annotations"].get("runbook_url"), rule["alert"]


def test_alert_rules_use_only_exported_metrics() -> None:
    used = set().union(*(metric_names_in(rule["expr"]) for rule in alert_rules(prometheus_rule_spec())))
    assert used, "the alert rules have no trace_ queries"
    assert used <= registered_metric_names(), used - registered_metric_names()


def test_dashboard_is_portable_and_filters_by_job(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "trace-rollout"
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "cluster", "namespace", "training_job"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("cluster", "namespace", "training_job"):
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["datasource"]["uid"] == "${datasource}"
        assert variable["definition"] == variable["query"]["query"]
        assert variable["definition"].startswith("label_values(trace_")
        assert variable["definition"].endswith(f", {name})")
        assert metric_names_in(variable["definition"]) <= registered_metric_names()
        # Several or all; All is `.*`, which also matches a series without the label (no cluster label
        # in a single-cluster Prometheus).
        assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*"
    # Each variable offers only the values of the choices made before it.
    assert 'cluster=~"$cluster"' in variables["namespace"]["definition"]
    assert 'cluster=~"$cluster", namespace=~"$namespace"' in variables["training_job"]["definition"]

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


def test_selector_parsing() -> None:
    expression = (
        'sum(rate(trace_a_total{namespace=~"$namespace", status=~"5.."}[5m])) / sum(rate(trace_a_total[5m]))'
        " and max by (namespace, le) (trace_b)"
        ' or http_server_c_count{http_route="/v1/expand"}'
    )
    assert metric_selectors(expression) == [
        ("trace_a_total", {"namespace": ("=~", "$namespace"), "status": ("=~", "5..")}),
        ("trace_a_total", {}),
        ("trace_b", {}),
        ("http_server_c_count", {"http_route": ("=", "/v1/expand")}),
    ]
    assert aggregations(expression) == [
        ("sum", None, []),
        ("sum", None, []),
        ("max", "by", ["namespace", "le"]),
    ]
    assert markdown_anchors("# Run book\n\n## TraceRolloutUp\n### What (it) means\n") == {
        "run-book",
        "tracerolloutup",
        "what-it-means",
    }


def test_every_dashboard_query_is_scoped_by_namespace_and_job(dashboard: dict[str, Any]) -> None:
    """Staging and production never share a graph: every selector of every panel filters by the
    cluster and namespace variables, and by the training job wherever the series has that label."""
    registry = CollectorRegistry()
    populate(Metrics(registry))
    per_job = {
        sample.name
        for family in registry.collect()
        for sample in family.samples
        if "training_job" in sample.labels
    }
    assert per_job, "no series carries training_job"
    checked = 0
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            selectors = metric_selectors(target["expr"])
            assert selectors, (panel["title"], target["expr"])
            for name, matchers in selectors:
                for label, expected in SCOPE_FILTERS.items():
                    assert matchers.get(label) == expected, (panel["title"], name, label)
                if name in per_job:
                    assert matchers.get("training_job") == JOB_FILTER, (panel["title"], name)
                checked += 1
    assert checked


def test_dashboard_panels_sit_under_their_row(dashboard: dict[str, Any]) -> None:
    rows = dashboard_rows(dashboard)
    assert list(rows) == [
        "Requests",
        "Allocation and expansion",
        "Instructions",
        "Budget",
        "Outcomes",
        "TRACE vs control",
        "Predictor",
        "Store",
    ]
    prefixes = {"Predictor": "trace_predictor_", "Store": "trace_store_"}
    for title, panels in rows.items():
        assert panels, f"row {title!r} is empty"
        for panel in panels:
            used = set().union(*map(metric_names_in, (target["expr"] for target in panel["targets"])))
            for row, prefix in prefixes.items():
                # A panel about the predictor or the store only is in that row, and that row holds
                # nothing else.
                if all(name.startswith(prefix) for name in used):
                    assert title == row, f"{panel['title']!r} belongs under {row!r}, not {title!r}"
                if title == row:
                    assert all(name.startswith(prefix) for name in used), (title, panel["title"])


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
        metrics.http_duration.labels("POST", route, str(status)).observe(0.004)
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
    for arm in ("policy", "control"):
        for family in metrics.arm_families:
            family.labels("run-a", arm).inc(3)
    for unit in ("bare_rollout", "turn"):
        for bound, value in (("estimate", 1.2), ("low", 0.9), ("high", 1.6)):
            metrics.gain_ratio.labels("run-a", unit, bound).set(value)
    metrics.trust_slope.labels("run-a").set(0.8)
    metrics.policy_share.labels("run-a").set(0.9)
    metrics.deep_branch_share.labels("run-a").set(0.7)
    metrics.control_brier_skill.labels("run-a").set(0.1)
    metrics.observe_predictor("run-a", version=2, brier=0.2, ece=0.05, spearman=0.4)
    metrics.predictor_examples.labels("run-a").inc(100)
    metrics.predictor_resident.set(1)
    metrics.predictor_evictions.inc()
    metrics.predictor_train_duration.observe(0.3)
    metrics.predictor_load_failures.inc(0)
    metrics.store_errors.labels("apply_events").inc()
    metrics.store_up.set(1)
    metrics.store_bytes.set(700e6)
    metrics.store_budget_bytes.set(1e9)
    metrics.store_full_refusals.inc(0)
    for kind, size in (("published", 6.5e6), ("set_down", 6.7e6), ("memory", 150e6)):
        metrics.predictor_bytes.labels("run-a", kind).set(size)


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

    def wait_until_ready(self, server: subprocess.Popen[bytes], deadline_seconds: float) -> None:
        """Polls ``/-/ready`` until Prometheus answers 200: while it starts it refuses connections, then
        answers 503 ("Service Unavailable", not JSON) to every API call."""
        deadline = time.monotonic() + deadline_seconds
        while True:
            try:
                with urllib.request.urlopen(f"{self.base_url}/-/ready", timeout=10) as response:
                    if response.status == 200:
                        return
            except OSError:  # not listening yet (URLError), or still starting (HTTPError 503)
                pass
            if server.poll() is not None:
                raise RuntimeError(f"prometheus exited with {server.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus was not ready within {deadline_seconds} s")
            time.sleep(0.2)

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
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{exporter.server_port}"],
                        # What the Prometheus Operator adds from the target's namespace; no cluster label,
                        # as in a single-cluster Prometheus.
                        "labels": {"namespace": "production"},
                    }
                ],
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
        # Generous deadlines: on a busy machine Prometheus takes long to start and to scrape.
        prometheus.wait_until_ready(server, 180)
        prometheus.wait_for('count_over_time(up{job="trace-rollout"}[1m]) >= 3', 180)
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
        .replace('"$training_job"', '"(run-a|run-b)"')
        .replace('"$namespace"', '"(production|staging)"')
        .replace('"$cluster"', '".*"')  # All: matches the series without a cluster label
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

    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    offered = {}
    for name in ("cluster", "namespace", "training_job"):
        selector = grafana_to_promql(variables[name]["definition"])[len("label_values(") : -len(f", {name})")]
        values = scraping_prometheus.get(f"/api/v1/label/{name}/values", **{"match[]": selector})
        assert values["status"] == "success", (name, values.get("error"))
        offered[name] = values["data"]
    assert offered == {"cluster": [], "namespace": ["production"], "training_job": ["run-a"]}

    for expression in dashboard_expressions(dashboard):
        answer = scraping_prometheus.query(grafana_to_promql(expression))
        assert answer["status"] == "success", (expression, answer.get("error"))
        assert answer["data"]["result"], f"no data for {expression}"
        # Another namespace's dashboard shows nothing of this one.
        elsewhere = scraping_prometheus.query(
            grafana_to_promql(expression.replace('"$namespace"', '"elsewhere"'))
        )
        assert elsewhere["status"] == "success", (expression, elsewhere.get("error"))
        assert not elsewhere["data"]["result"], f"{expression} shows another namespace"
    for rule in alert_rules(prometheus_rule_spec()):
        answer = scraping_prometheus.query(rule["expr"])
        assert answer["status"] == "success", (rule["alert"], answer.get("error"))
