"""The metrics module: one registry per app, Prometheus naming conventions, exposition."""

from __future__ import annotations

import math

import pytest
from ops_support import exported_metric_names
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trace_service.metrics import METRIC_NAMES, OTHER_HTTP_METHOD, Metrics, http_method_label

# Identifiers with unbounded value sets would make one series per tree, prompt or worker.
UNBOUNDED_LABELS = {"tree_id", "prompt_id", "node_id", "instruction_id", "event_id", "worker_id", "path"}
#: Named by the OpenTelemetry semantic conventions rather than with the ``trace_`` prefix.
SEMCONV_NAMES = {"http_server_request_duration_seconds"}


def sample_values(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every exposed sample by name and sorted labels, read back from the text exposition format."""
    exposition = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def test_two_apps_get_independent_metrics() -> None:
    first, second = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    first.instructions_issued.labels("run-a").inc(3)

    assert (
        sample_values(first.registry)[("trace_instructions_issued_total", (("training_job", "run-a"),))] == 3
    )
    assert ("trace_instructions_issued_total", (("training_job", "run-a"),)) not in sample_values(
        second.registry
    )


def test_one_registry_cannot_hold_two_sets() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Metrics(registry)


def test_metric_names_lists_exactly_the_registered_metrics() -> None:
    assert exported_metric_names(Metrics(CollectorRegistry()).registry) == METRIC_NAMES


def test_names_follow_prometheus_conventions() -> None:
    registry = Metrics(CollectorRegistry()).registry
    for family in registry.collect():
        assert family.name.startswith("trace_") or family.name in SEMCONV_NAMES, family.name
        assert family.documentation.endswith("."), f"{family.name} needs a help text"
        if family.type == "counter":
            # prometheus-client strips `_total` from a counter's family name and adds it to the sample.
            assert not family.name.endswith("_total")
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), f"{family.name}: durations in seconds"
        assert not any(unit in family.name for unit in ("_milliseconds", "_ms", "_minutes")), family.name


def test_no_label_has_an_unbounded_value_set() -> None:
    metrics = Metrics(CollectorRegistry())
    label_names = {
        name: set(collector._labelnames)  # no public accessor for a collector's label names
        for name, collector in vars(metrics).items()
        if hasattr(collector, "_labelnames")
    }
    assert label_names["http_duration"] == {"http_request_method", "http_route", "http_response_status_code"}
    for name, labels in label_names.items():
        assert not labels & UNBOUNDED_LABELS, name


def test_fixed_outcome_series_exist_before_the_first_event() -> None:
    values = sample_values(Metrics(CollectorRegistry()).registry)
    for outcome in ("accepted", "duplicate", "rejected"):
        assert values[("trace_expand_events_total", (("outcome", outcome),))] == 0


def test_a_jobs_predictor_figures_are_nan_until_defined() -> None:
    metrics = Metrics(CollectorRegistry())
    job = (("training_job", "run-a"),)
    metrics.observe_predictor("run-a", version=4, brier=0.18, ece=None, spearman=0.42)
    values = sample_values(metrics.registry)
    assert values[("trace_predictor_version", job)] == 4
    assert values[("trace_predictor_brier_score", job)] == pytest.approx(0.18)
    assert math.isnan(values[("trace_predictor_calibration_error", job)])
    assert values[("trace_predictor_spearman", job)] == pytest.approx(0.42)
    for source in ("network", "history"):  # a source not measured yet is NaN, not absent
        assert math.isnan(values[("trace_predictor_prior_log_likelihood", (("source", source), *job))])
    assert not [
        key
        for key in values
        if key[0] == "trace_predictor_version" and key != ("trace_predictor_version", job)
    ]


def test_histograms_count_observations_in_seconds() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.expand_duration.observe(0.003)
    metrics.http_duration.labels("POST", "/v1/expand", "200").observe(0.004)
    values = sample_values(metrics.registry)
    assert values[("trace_expand_batch_duration_seconds_bucket", (("le", "0.0025"),))] == 0
    assert values[("trace_expand_batch_duration_seconds_bucket", (("le", "0.005"),))] == 1
    assert values[("trace_expand_batch_duration_seconds_sum", ())] == pytest.approx(0.003)
    request = (
        ("http_request_method", "POST"),
        ("http_response_status_code", "200"),
        ("http_route", "/v1/expand"),
    )
    assert values[("http_server_request_duration_seconds_count", request)] == 1


def test_unknown_http_methods_share_one_label_value() -> None:
    """The semantic convention's known methods are kept, exactly as spelled; any other is ``_OTHER``."""
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"):
        assert http_method_label(method) == method
    for method in ("PROPFIND", "get", "Post", "", "X" * 1000):
        assert http_method_label(method) == OTHER_HTTP_METHOD == "_OTHER"


def test_the_http_histogram_declares_its_unit() -> None:
    """The unit goes out with the family (OpenMetrics' ``# UNIT``), as an OpenTelemetry exporter sends it."""
    families = {family.name: family for family in Metrics(CollectorRegistry()).registry.collect()}
    assert families["http_server_request_duration_seconds"].unit == "seconds"


def test_counters_refuse_negative_increments() -> None:
    metrics = Metrics(CollectorRegistry())
    with pytest.raises(ValueError, match="non-negative"):
        metrics.budget_spent.labels("run-a", "bare").inc(-1)


def test_the_training_run_label_is_not_prometheus_job_label() -> None:
    """Prometheus sets `job` to the scrape job on every series; ours would arrive as `exported_job`."""
    metrics = Metrics(CollectorRegistry())
    metrics.instructions_issued.labels(metrics.job_label("run-a")).inc()
    labels = {key for _, items in sample_values(metrics.registry) for key, _ in items}
    assert "job" not in labels and "training_job" in labels


def test_tracked_jobs_are_capped_and_idle_ones_dropped() -> None:
    now = [0.0]
    metrics = Metrics(CollectorRegistry(), max_jobs=3, job_idle_seconds=60.0, clock=lambda: now[0])
    for index in range(2_000):
        label = metrics.job_label(f"run-{index}")
        metrics.allocate_prompts.labels(label, "active").inc()
        metrics.budget_spent.labels(label, "bare").inc()
    series = [key for key in sample_values(metrics.registry) if key[0] == "trace_allocate_prompts_total"]
    assert sorted(dict(items)["training_job"] for _, items in series) == ["_other", "run-0", "run-1", "run-2"]
    scrape = generate_latest(metrics.registry)
    assert len(scrape) < 40_000, len(scrape)
    now[0] = 30.0
    metrics.job_label("run-1")  # still active
    now[0] = 70.0
    assert metrics.job_label("run-new") == "run-new"  # run-0 and run-2 were idle: room again
    jobs = {dict(items).get("training_job") for _, items in sample_values(metrics.registry)} - {None}
    assert jobs == {"_other", "run-1"}
