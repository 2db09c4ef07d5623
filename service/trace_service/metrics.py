"""Every Prometheus metric the service exports, in one place.

Conventions (https://prometheus.io/docs/practices/naming): the ``trace_`` prefix, base units (seconds),
``_total`` for counters, and labels with small bounded value sets only (never a tree, prompt, node or
worker id). Histograms, not summaries, so that quantiles can be aggregated over replicas.

Each app builds its own ``Metrics(registry)`` so that tests can create many apps in one process. The
service runs one process per container and scales by replicas, so prometheus-client's multiprocess mode
is not used.

Store-wide quantities (the instruction backlog, the effective ratio, the predictor's diagnostics) are
the same whichever replica reports them: aggregate them over replicas with ``max``, not ``sum``.
"""

from __future__ import annotations

import math
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

EXPAND_OUTCOMES: Final = ("accepted", "duplicate", "rejected")

# Whole HTTP requests: from a sub-millisecond probe to a multi-second allocation over a large pool.
HTTP_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Allocation and expansion work: the service level objective sits at a few milliseconds.
FAST_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# One online training round of the predictor: tens of milliseconds to minutes.
TRAINING_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

METRIC_NAMES: Final[frozenset[str]] = frozenset(
    {
        "trace_http_requests_total",
        "trace_http_request_duration_seconds",
        "trace_allocate_duration_seconds",
        "trace_allocate_prompts_total",
        "trace_expand_events_total",
        "trace_expand_batch_duration_seconds",
        "trace_stage2_duration_seconds",
        "trace_instructions_issued_total",
        "trace_instruction_backlog",
        "trace_instruction_lease_expiries_total",
        "trace_budget_promised_rollouts_total",
        "trace_budget_spent_rollouts_total",
        "trace_budget_fallback_rollouts_total",
        "trace_budget_unspent_rollouts_total",
        "trace_trees_completed_total",
        "trace_effective_ratio",
        "trace_predictor_version",
        "trace_predictor_examples_total",
        "trace_predictor_brier_score",
        "trace_predictor_calibration_error",
        "trace_predictor_spearman",
        "trace_predictor_train_duration_seconds",
        "trace_predictor_load_failures_total",
        "trace_store_errors_total",
        "trace_store_up",
    }
)
"""The names PromQL uses for every metric: counters with ``_total``, histograms without the
``_bucket``/``_count``/``_sum`` suffixes."""


def _gauge_value(figure: float | None) -> float:
    """An undefined figure is exported as NaN: 0 would read as a perfect Brier score or calibration."""
    return math.nan if figure is None else figure


class Metrics:
    """The service's collectors, registered on ``registry``.

    Counters are declared by their ``_total`` name; prometheus-client exports them under that name.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

        self.http_requests = Counter(
            "trace_http_requests_total",
            "HTTP requests answered, by route template, method and status code.",
            ["route", "method", "status"],
            registry=registry,
        )
        self.http_duration = Histogram(
            "trace_http_request_duration_seconds",
            "Time from receiving an HTTP request to sending its response, by route template and method.",
            ["route", "method"],
            buckets=HTTP_BUCKETS,
            registry=registry,
        )

        self.allocate_duration = Histogram(
            "trace_allocate_duration_seconds",
            "Time to compute one allocation (prediction and Stage 1), by allocation policy.",
            ["policy"],
            buckets=FAST_BUCKETS,
            registry=registry,
        )
        self.allocate_prompts = Counter(
            "trace_allocate_prompts_total",
            "Prompts allocated, by job and decision: active (given rollouts) or skipped (given none).",
            ["job", "decision"],
            registry=registry,
        )

        self.expand_events = Counter(
            "trace_expand_events_total",
            "Expand events received, by outcome: accepted, duplicate (already seen) or rejected.",
            ["outcome"],
            registry=registry,
        )
        self.expand_duration = Histogram(
            "trace_expand_batch_duration_seconds",
            "Time to apply one batch of expand events and compute the instructions it triggers.",
            buckets=FAST_BUCKETS,
            registry=registry,
        )
        self.stage2_duration = Histogram(
            "trace_stage2_duration_seconds",
            "Time of one Stage 2 decision: scoring a tree's prefixes and placing its continuations.",
            buckets=FAST_BUCKETS,
            registry=registry,
        )

        self.instructions_issued = Counter(
            "trace_instructions_issued_total",
            "Branching instructions issued, by job.",
            ["job"],
            registry=registry,
        )
        self.instruction_backlog = Gauge(
            "trace_instruction_backlog",
            "Instructions queued in the store whose continuations have not all started, by job "
            "(store-wide: aggregate over replicas with max).",
            ["job"],
            registry=registry,
        )
        self.instruction_lease_expiries = Counter(
            "trace_instruction_lease_expiries_total",
            "Instruction leases that expired before the claiming worker started them, by job.",
            ["job"],
            registry=registry,
        )

        self.budget_promised = Counter(
            "trace_budget_promised_rollouts_total",
            "Rollouts promised to trees, by job and kind: bare (from the root) or continuation.",
            ["job", "kind"],
            registry=registry,
        )
        self.budget_spent = Counter(
            "trace_budget_spent_rollouts_total",
            "Promised rollouts that finished with a scored leaf, by job and kind.",
            ["job", "kind"],
            registry=registry,
        )
        self.budget_fallback = Counter(
            "trace_budget_fallback_rollouts_total",
            "Continuation rollouts placed by the fallback rule instead of the predictor, by job.",
            ["job"],
            registry=registry,
        )
        self.budget_unspent = Counter(
            "trace_budget_unspent_rollouts_total",
            "Promised rollouts never spent because their tree was closed first, by job.",
            ["job"],
            registry=registry,
        )

        self.trees_completed = Counter(
            "trace_trees_completed_total",
            "Trees completed, by job and whether their leaves mixed successes and failures.",
            ["job", "mixed"],
            registry=registry,
        )
        self.effective_ratio = Gauge(
            "trace_effective_ratio",
            "Share of the active prompts of the latest completed step whose tree is mixed, by job "
            "(store-wide: aggregate over replicas with max).",
            ["job"],
            registry=registry,
        )

        self.predictor_version = Gauge(
            "trace_predictor_version",
            "Version of the predictor weights this replica serves (0 before the first training round).",
            registry=registry,
        )
        self.predictor_examples = Counter(
            "trace_predictor_examples_total",
            "Training examples (prefixes with their recursive targets) the predictor was trained on.",
            registry=registry,
        )
        self.predictor_brier_score = Gauge(
            "trace_predictor_brier_score",
            "Brier score of the served predictor on held-out trees (NaN while undefined).",
            registry=registry,
        )
        self.predictor_calibration_error = Gauge(
            "trace_predictor_calibration_error",
            "Expected calibration error of the served predictor on held-out trees (NaN while undefined).",
            registry=registry,
        )
        self.predictor_spearman = Gauge(
            "trace_predictor_spearman",
            "Spearman rank correlation of predictions and targets on held-out trees (NaN while undefined).",
            registry=registry,
        )
        self.predictor_train_duration = Histogram(
            "trace_predictor_train_duration_seconds",
            "Time of one online training round of the predictor.",
            buckets=TRAINING_BUCKETS,
            registry=registry,
        )
        self.predictor_load_failures = Counter(
            "trace_predictor_load_failures_total",
            "Failed attempts to load published predictor weights.",
            registry=registry,
        )

        self.store_errors = Counter(
            "trace_store_errors_total",
            "Tree store operations that failed, by operation.",
            ["operation"],
            registry=registry,
        )
        self.store_up = Gauge(
            "trace_store_up",
            "1 when this replica's last tree store check succeeded, 0 otherwise.",
            registry=registry,
        )

        # Series with a fixed label set exist from the start, so that rate() sees their first increase.
        for outcome in EXPAND_OUTCOMES:
            self.expand_events.labels(outcome=outcome)
        self.observe_predictor(version=0, brier=None, ece=None, spearman=None)

    def observe_predictor(
        self, version: int, brier: float | None, ece: float | None, spearman: float | None
    ) -> None:
        """Publish the served predictor's version and held-out quality; ``None`` means undefined."""
        self.predictor_version.set(version)
        self.predictor_brier_score.set(_gauge_value(brier))
        self.predictor_calibration_error.set(_gauge_value(ece))
        self.predictor_spearman.set(_gauge_value(spearman))
