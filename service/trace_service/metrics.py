"""Every Prometheus metric the service exports, in one place.

Conventions (https://prometheus.io/docs/practices/naming): the ``trace_`` prefix, base units (seconds),
``_total`` for counters, and labels with small bounded value sets only (never a tree, prompt, node or
worker id). Histograms, not summaries, so that quantiles can be aggregated over replicas.

The one exception to the prefix is HTTP server traffic: ``http_server_request_duration_seconds`` is the
OpenTelemetry semantic convention's ``http.server.request.duration`` as exported to Prometheus (dots to
underscores, unit as suffix), so that dashboards and alerts written for that convention work unchanged.
Its ``_count`` is the number of requests.

The training run is the ``training_job`` label, never ``job``: Prometheus sets ``job`` to the scrape
job on every series, and would rename ours to ``exported_job``. Its values are bounded too: a replica
exports at most ``MAX_TRACKED_JOBS`` jobs at a time (later ones count under ``_other``) and drops the
series of a job idle for ``JOB_IDLE_SECONDS``.

Each app builds its own ``Metrics(registry)`` so that tests can create many apps in one process. The
service runs one process per container and scales by replicas, so prometheus-client's multiprocess mode
is not used.

Store-wide quantities (the instruction backlog, the effective ratio, the predictor's diagnostics) are
the same whichever replica reports them: aggregate them over replicas with ``max``, not ``sum``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

EXPAND_OUTCOMES: Final = ("accepted", "duplicate", "rejected")
#: The label naming a training run, and what bounds its values.
JOB_LABEL: Final = "training_job"
MAX_TRACKED_JOBS: Final = 100
JOB_IDLE_SECONDS: Final = 3600.0
OTHER_JOBS: Final = "_other"

# Whole HTTP requests: from a sub-millisecond probe to a multi-second allocation over a large pool. Kept
# rather than the semantic convention's advised buckets (0.005 … 10 s): those start at 5 ms, and this
# service's objective is a few milliseconds, so its fast requests would all share the first bucket. Ours
# hold every advised bound but 75 ms, 750 ms and 7.5 s, and add 1 ms and 2.5 ms.
HTTP_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: HTTP methods the semantic convention calls known (RFC 9110 and PATCH); any other is ``_OTHER``, so
#: that a client cannot add series by inventing methods.
HTTP_METHODS: Final = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)
OTHER_HTTP_METHOD: Final = "_OTHER"
#: The ``http_route`` of a request no route matched (a 404, or one refused before routing).
UNMATCHED_ROUTE: Final = "unmatched"
# Allocation and expansion work: the service level objective sits at a few milliseconds.
FAST_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# One online training round of the predictor: tens of milliseconds to minutes.
TRAINING_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

#: The prior sources the predictor compares (``trace_service.predictor.Calibration.prior``).
PRIOR_SOURCES: Final = ("network", "history")
#: The kinds of a job's predictor bytes: published weights, set-down state (both in the store), memory.
PREDICTOR_BYTES: Final = ("published", "set_down", "memory")
#: A job's arms: its policy's trees and its control trees (``trace_service.allocation.gain``).
ARMS: Final = ("policy", "control")
#: The gain's units and the bounds of its interval (``trace_gain_ratio``).
GAIN_UNITS: Final = ("bare_rollout", "turn")
GAIN_BOUNDS: Final = ("estimate", "low", "high")

METRIC_NAMES: Final[frozenset[str]] = frozenset(
    {
        "http_server_request_duration_seconds",
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
        "trace_arm_trees_total",
        "trace_arm_mixed_total",
        "trace_arm_bare_rollouts_total",
        "trace_arm_turns_total",
        "trace_gain_ratio",
        "trace_trust_slope",
        "trace_policy_share",
        "trace_deep_branch_share",
        "trace_control_brier_skill",
        "trace_effective_ratio",
        "trace_predictor_version",
        "trace_predictor_examples_total",
        "trace_predictor_brier_score",
        "trace_predictor_calibration_error",
        "trace_predictor_spearman",
        "trace_predictor_prior_log_likelihood",
        "trace_predictor_prior_concentration",
        "trace_predictor_continuation_freshness",
        "trace_predictor_train_duration_seconds",
        "trace_predictor_load_failures_total",
        "trace_predictor_resident_jobs",
        "trace_predictor_evictions_total",
        "trace_predictor_bytes",
        "trace_store_errors_total",
        "trace_store_up",
        "trace_store_bytes",
        "trace_store_budget_bytes",
        "trace_store_full_refusals_total",
    }
)
"""The names PromQL uses for every metric: counters with ``_total``, histograms without the
``_bucket``/``_count``/``_sum`` suffixes."""


def http_method_label(method: str) -> str:
    """The ``http_request_method`` value: the method when known (case-sensitive, as the semantic
    convention asks), else ``_OTHER``."""
    return method if method in HTTP_METHODS else OTHER_HTTP_METHOD


def gauge_value(figure: float | None) -> float:
    """An undefined figure is exported as NaN: 0 would read as a perfect Brier score or calibration."""
    return math.nan if figure is None else figure


class Metrics:
    """The service's collectors, registered on ``registry``.

    Counters are declared by their ``_total`` name; prometheus-client exports them under that name.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        max_jobs: int = MAX_TRACKED_JOBS,
        job_idle_seconds: float = JOB_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self._max_jobs = max_jobs
        self._job_idle_seconds = job_idle_seconds
        self._clock = clock
        self._last_seen: dict[str, float] = {}  # tracked jobs, least recently seen first

        self._declare_http(registry)
        self._declare_requests(registry)
        self._declare_instructions(registry)
        self._declare_budget(registry)
        self._declare_trees(registry)
        self._declare_predictor_quality(registry)
        self._declare_predictor_runtime(registry)
        self._declare_store(registry)
        # Every per-job family and the values of its other labels: what dropping a job's series removes.
        self._job_series = self._per_job_series()

        # Series with a fixed label set exist from the start, so that rate() sees their first increase.
        for outcome in EXPAND_OUTCOMES:
            self.expand_events.labels(outcome=outcome)

    def _declare_http(self, registry: CollectorRegistry) -> None:
        """HTTP server traffic, by the OpenTelemetry semantic convention."""
        self.http_duration = Histogram(
            "http_server_request_duration_seconds",
            "Duration of HTTP server requests, by method, route template and response status code.",
            ["http_request_method", "http_route", "http_response_status_code"],
            unit="seconds",
            buckets=HTTP_BUCKETS,
            registry=registry,
        )

    def _declare_requests(self, registry: CollectorRegistry) -> None:
        """The work of allocations and of expand batches, with their Stage 2 decisions."""
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
            [JOB_LABEL, "decision"],
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

    def _declare_instructions(self, registry: CollectorRegistry) -> None:
        """Branching instructions: issued, queued and leased."""
        self.instructions_issued = Counter(
            "trace_instructions_issued_total",
            "Branching instructions issued, by job.",
            [JOB_LABEL],
            registry=registry,
        )
        self.instruction_backlog = Gauge(
            "trace_instruction_backlog",
            "Instructions queued in the store whose continuations have not all started, by job "
            "(store-wide: aggregate over replicas with max).",
            [JOB_LABEL],
            registry=registry,
        )
        self.instruction_lease_expiries = Counter(
            "trace_instruction_lease_expiries_total",
            "Instruction leases that expired before the claiming worker started them, by job.",
            [JOB_LABEL],
            registry=registry,
        )

    def _declare_budget(self, registry: CollectorRegistry) -> None:
        """Where the rollouts promised to trees went."""
        self.budget_promised = Counter(
            "trace_budget_promised_rollouts_total",
            "Rollouts promised to trees, by job and kind: bare (from the root) or continuation.",
            [JOB_LABEL, "kind"],
            registry=registry,
        )
        self.budget_spent = Counter(
            "trace_budget_spent_rollouts_total",
            "Promised rollouts that finished with a scored leaf, by job and kind.",
            [JOB_LABEL, "kind"],
            registry=registry,
        )
        self.budget_fallback = Counter(
            "trace_budget_fallback_rollouts_total",
            "Continuation rollouts placed by the fallback rule instead of the predictor, by job.",
            [JOB_LABEL],
            registry=registry,
        )
        self.budget_unspent = Counter(
            "trace_budget_unspent_rollouts_total",
            "Promised rollouts never spent because their tree was closed first, by job.",
            [JOB_LABEL],
            registry=registry,
        )

    def _declare_trees(self, registry: CollectorRegistry) -> None:
        """Completed trees: how many mixed, by arm (:meth:`_declare_control`), and the effective ratio."""
        self.trees_completed = Counter(
            "trace_trees_completed_total",
            "Trees completed, by job and whether their leaves mixed successes and failures.",
            [JOB_LABEL, "mixed"],
            registry=registry,
        )
        self._declare_control(registry)
        self.effective_ratio = Gauge(
            "trace_effective_ratio",
            "Share of the active prompts of the latest completed step whose tree is mixed, by job "
            "(store-wide: aggregate over replicas with max).",
            [JOB_LABEL],
            registry=registry,
        )

    def _declare_control(self, registry: CollectorRegistry) -> None:
        """The figures of a job's control trees: what its policy's trees and its control trees yield
        (their ratio is the job's gain over uniform), the service's estimate of that gain, the trust
        Stage 1 puts in the predictor and the predictor's skill on control prompts."""

        def arm_counter(name: str, what: str) -> Counter:
            return Counter(
                name,
                f"{what} of complete trees, by job and arm (policy or control).",
                [JOB_LABEL, "arm"],
                registry=registry,
            )

        self.arm_trees = arm_counter("trace_arm_trees_total", "Count")
        self.arm_mixed = arm_counter("trace_arm_mixed_total", "Mixed ones")
        self.arm_bare_rollouts = arm_counter("trace_arm_bare_rollouts_total", "Scored bare rollouts")
        self.arm_turns = arm_counter("trace_arm_turns_total", "Turns generated")
        self.arm_families = (self.arm_trees, self.arm_mixed, self.arm_bare_rollouts, self.arm_turns)
        self.gain_ratio = Gauge(
            "trace_gain_ratio",
            "The job's mixed groups per unit (bare_rollout or turn) over its control trees', as its stats "
            "last estimated them, with the bounds of the 90% interval (store-wide: aggregate with max).",
            [JOB_LABEL, "unit", "bound"],
            registry=registry,
        )
        self.trust_slope = Gauge(
            "trace_trust_slope",
            "The slope of the trust map Stage 1 read the predictor through at the job's last allocation "
            "(0: uniform's allocation; 1: the predictor as it is).",
            [JOB_LABEL],
            registry=registry,
        )
        self.policy_share = Gauge(
            "trace_policy_share",
            "The share of the job's last allocation meant for the policy's trees (the rest: control trees "
            "with uniform's rules), chosen from the job's evidence of its gain over uniform per turn.",
            [JOB_LABEL],
            registry=registry,
        )
        self.deep_branch_share = Gauge(
            "trace_deep_branch_share",
            "The share of the policy's trees of the job's last allocation that may branch at any depth (the "
            "rest branch from first turns), chosen from the job's evidence of which finds more mixed groups "
            "per turn.",
            [JOB_LABEL],
            registry=registry,
        )
        self.control_brier_skill = Gauge(
            "trace_control_brier_skill",
            "1 − the predictor's Brier score on the job's control prompts over one constant's (NaN while "
            "undefined).",
            [JOB_LABEL],
            registry=registry,
        )

    def _declare_predictor_quality(self, registry: CollectorRegistry) -> None:
        """The served predictor of each job: its version, what it trained on and its held-out quality."""
        self.predictor_version = Gauge(
            "trace_predictor_version",
            "Version of the predictor weights this replica serves (0 before the first training round).",
            [JOB_LABEL],
            registry=registry,
        )
        self.predictor_examples = Counter(
            "trace_predictor_examples_total",
            "Training examples (prefixes with their recursive targets) the predictor was trained on.",
            [JOB_LABEL],
            registry=registry,
        )
        self.predictor_brier_score = Gauge(
            "trace_predictor_brier_score",
            "Brier score of the served predictor on held-out trees (NaN while undefined).",
            [JOB_LABEL],
            registry=registry,
        )
        self.predictor_calibration_error = Gauge(
            "trace_predictor_calibration_error",
            "Expected calibration error of the served predictor on held-out trees (NaN while undefined).",
            [JOB_LABEL],
            registry=registry,
        )
        self.predictor_spearman = Gauge(
            "trace_predictor_spearman",
            "Spearman rank correlation of predictions and targets on held-out trees (NaN while undefined).",
            [JOB_LABEL],
            registry=registry,
        )
        self.predictor_prior_log_likelihood = Gauge(
            "trace_predictor_prior_log_likelihood",
            "Mean log marginal likelihood per held-out group of bare rollouts under each prior source "
            "(network: the predictor's prior; history: one constant for every prompt); the higher is served.",
            [JOB_LABEL, "source"],
            registry=registry,
        )
        self.predictor_prior_concentration = Gauge(
            "trace_predictor_prior_concentration",
            "Concentration κ of the served Beta prior: how far a prompt's own outcomes move its estimate.",
            [JOB_LABEL],
            registry=registry,
        )
        self.predictor_continuation_freshness = Gauge(
            "trace_predictor_continuation_freshness",
            "How often a continuation flips the outcome it branched from, relative to a fresh rollout.",
            [JOB_LABEL],
            registry=registry,
        )

    def _declare_predictor_runtime(self, registry: CollectorRegistry) -> None:
        """What keeping and training jobs' predictors costs a replica."""
        self.predictor_resident = Gauge(
            "trace_predictor_resident_jobs",
            "Jobs whose own predictor this replica keeps in memory (at most TRACE_PREDICTOR_MAX_JOBS).",
            registry=registry,
        )
        self.predictor_bytes = Gauge(
            "trace_predictor_bytes",
            "Bytes of a job's predictor, by kind: its published weights and its set-down state in the "
            "store (as this replica last wrote them), and its estimated size in this replica's memory.",
            [JOB_LABEL, "kind"],
            unit="bytes",
            registry=registry,
        )
        self.predictor_evictions = Counter(
            "trace_predictor_evictions_total",
            "Jobs' predictors set down to the store to make room for another job's.",
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
            "Failed attempts to load a job's published predictor weights or its predictor set down.",
            registry=registry,
        )

    def _declare_store(self, registry: CollectorRegistry) -> None:
        """The tree store's health as this replica sees it."""
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
        self.store_bytes = Gauge(
            "trace_store_bytes",
            "Bytes the tree store holds, as last measured (Redis's used_memory; the in-process store: "
            "the serialised size of its keys).",
            unit="bytes",
            registry=registry,
        )
        self.store_budget_bytes = Gauge(
            "trace_store_budget_bytes",
            "The store's byte budget (TRACE_STORE_MAX_BYTES, else 90% of Redis's maxmemory; 0: none): "
            "at it, new allocations are refused (503) while trees in flight finish.",
            unit="bytes",
            registry=registry,
        )
        self.store_full_refusals = Counter(
            "trace_store_full_refusals",
            "Allocations refused because the store reached its byte budget.",
            registry=registry,
        )

    def _per_job_series(self) -> list[tuple[MetricWrapperBase, tuple[tuple[str, ...], ...]]]:
        """Every family with a ``training_job`` label, with the values of its other labels."""
        return [
            (self.allocate_prompts, (("active",), ("skipped",))),
            (self.instructions_issued, ((),)),
            (self.instruction_backlog, ((),)),
            (self.instruction_lease_expiries, ((),)),
            (self.budget_promised, (("bare",), ("continuation",))),
            (self.budget_spent, (("bare",), ("continuation",))),
            (self.budget_fallback, ((),)),
            (self.budget_unspent, ((),)),
            (self.trees_completed, (("true",), ("false",))),
            *((family, tuple((arm,) for arm in ARMS)) for family in self.arm_families),
            (self.gain_ratio, tuple((u, b) for u in GAIN_UNITS for b in GAIN_BOUNDS)),
            (self.trust_slope, ((),)),
            (self.policy_share, ((),)),
            (self.deep_branch_share, ((),)),
            (self.control_brier_skill, ((),)),
            (self.effective_ratio, ((),)),
            (self.predictor_version, ((),)),
            (self.predictor_examples, ((),)),
            (self.predictor_brier_score, ((),)),
            (self.predictor_calibration_error, ((),)),
            (self.predictor_spearman, ((),)),
            (self.predictor_prior_log_likelihood, tuple((source,) for source in PRIOR_SOURCES)),
            (self.predictor_prior_concentration, ((),)),
            (self.predictor_continuation_freshness, ((),)),
            (self.predictor_bytes, tuple((kind,) for kind in PREDICTOR_BYTES)),
        ]

    def job_label(self, job: str) -> str:
        """The ``training_job`` value for ``job``: itself while tracked (at most ``max_jobs`` at a time),
        else ``_other``.  A job idle for ``job_idle_seconds`` is forgotten and its series dropped."""
        now = self._clock()
        while self._last_seen:
            idle, seen = next(iter(self._last_seen.items()))  # the least recently seen
            if now - seen <= self._job_idle_seconds:
                break  # the rest were seen more recently
            del self._last_seen[idle]
            self._drop_series(idle)
        if job in self._last_seen or len(self._last_seen) < self._max_jobs:
            self._last_seen.pop(job, None)
            self._last_seen[job] = now  # to the end: the most recently seen
            return job
        return OTHER_JOBS

    def forget_job(self, job: str) -> None:
        """Drop a deleted job's series now, rather than once it has been idle long enough."""
        if self._last_seen.pop(job, None) is not None:
            self._drop_series(job)

    def _drop_series(self, job: str) -> None:
        for family, others in self._job_series:
            for rest in others:
                with contextlib.suppress(KeyError):
                    family.remove(job, *rest)

    def observe_predictor(
        self,
        job: str,
        version: int,
        brier: float | None,
        ece: float | None,
        spearman: float | None,
        *,
        prior_log_likelihood: Mapping[str, float] | None = None,
        concentration: float | None = None,
        freshness: float | None = None,
    ) -> None:
        """Publish a job's served predictor's version and held-out quality (``job`` is its label,
        :meth:`job_label`); ``None`` means undefined, and a prior source not measured is NaN."""
        self.predictor_version.labels(job).set(version)
        self.predictor_brier_score.labels(job).set(gauge_value(brier))
        self.predictor_calibration_error.labels(job).set(gauge_value(ece))
        self.predictor_spearman.labels(job).set(gauge_value(spearman))
        measured = prior_log_likelihood or {}
        for source in PRIOR_SOURCES:
            self.predictor_prior_log_likelihood.labels(job, source).set(measured.get(source, math.nan))
        self.predictor_prior_concentration.labels(job).set(gauge_value(concentration))
        self.predictor_continuation_freshness.labels(job).set(gauge_value(freshness))
