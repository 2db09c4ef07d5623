"""Service settings, from the environment (prefix ``TRACE_``) or from arguments."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from trace_service.lifecycle import DEFAULT_SUCCESS_THRESHOLD

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
LogFormat = Literal["text", "json"]


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRACE_", env_file=None, extra="ignore")

    # Store
    store_url: str = Field(default="", description="redis://… or rediss://…; empty: the embedded store.")
    store_cluster: bool = Field(default=False, description="The store URL names a Redis Cluster node.")
    data_dir: str = Field(
        default="trace-data",
        description="Without a store URL: where the embedded store (a redis-server of the service's own) "
        "keeps its append-only file, so that trees, stats and the predictor survive a restart; empty: "
        "in memory only, lost on restart.",
    )
    store_heal_seconds: float = Field(
        default=30.0,
        gt=0,
        description="With the embedded store: the service starts its redis-server again whenever it exits; "
        "if it cannot for this long, /healthz fails so that the orchestrator restarts the service.",
    )
    store_connect_seconds: float = Field(
        default=60.0,
        gt=0,
        description="With a store URL: `trace-rollout serve` waits this long for the store to answer at "
        "start, then stops with one line saying why (an orchestrator restarts it).",
    )
    store_prefix: str = "trace"
    store_max_bytes: int = Field(
        default=0,
        ge=0,
        description="The store's byte budget: once it holds this much (Redis's used_memory), new "
        "allocations are answered 503 while the trees in flight finish.  0: 90% of Redis's maxmemory "
        "when it has one, else no budget.",
    )
    tree_ttl_seconds: int = Field(
        default=7 * 24 * 3600, ge=60, description="Trees expire this long after their last update."
    )
    tree_retention_seconds: int = Field(
        default=3600,
        ge=60,
        description="A finished tree that its trainer has read (GET /v1/trees/{id}) and its job's "
        "predictor has learned from expires this long after the later of the two (sooner if its TTL "
        "says so): long enough for a trainer that failed a step to read it again; job statistics keep "
        "their sums, the predictor its own compact training data.  A tree in flight is never cut short.",
    )
    job_ttl_seconds: int = Field(default=30 * 24 * 3600, ge=60)
    idempotency_ttl_seconds: int = Field(default=24 * 3600, ge=60)

    # API
    auth_tokens: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="Bearer tokens; empty: no auth."
    )
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    lease_seconds: float = Field(
        default=120.0, gt=0, description="Instruction lease before it is offered again."
    )
    decision_lease_seconds: float = Field(default=30.0, gt=0, description="Claim on a Stage 2 decision.")
    success_threshold: float = Field(
        default=DEFAULT_SUCCESS_THRESHOLD, description="A reward at or above it is a success."
    )
    stats_steps: int = Field(
        default=100, ge=1, description="Most recent steps reported by job stats (and its gain estimate)."
    )
    evidence_window: int = Field(
        default=1024,
        ge=1,
        description="A job's most recent groups kept of each arm (control trees, policy trees): its trust "
        "map is fitted to both, its calibration on control prompts to the first (older ones are "
        "forgotten: the policy moves on).",
    )
    evidence_half_life_steps: float = Field(
        default=4.0,
        gt=0.0,
        description="How fast a job's evidence of its gain over uniform ages: a step's trees weigh half as "
        "much in the split of the budget this many steps later (the policy and the predictor move on).",
    )

    # Predictor
    predictor_device: str = Field(default="auto", description="auto, cpu or cuda[:n].")
    predictor_feature_dim: int = Field(
        default=0, ge=0, description="Length of client feature vectors; 0: none."
    )
    predictor_checkpoint: str = Field(
        default="", description="Weights every new job's predictor starts from, if set (else untrained)."
    )
    predictor_max_jobs: int = Field(
        default=16,
        ge=1,
        description="Jobs whose own predictor this replica keeps in memory; beyond it (or beyond "
        "TRACE_PREDICTOR_MEMORY_BYTES) the least recently used is written to the store (about 10 MB "
        "on the default architecture) and loaded back on its next request.",
    )
    predictor_memory_bytes: int = Field(
        default=2 << 30,
        ge=0,
        description="Bytes the jobs' predictors may hold in this replica's memory together, by each one's "
        "estimate (about 150 MB of weights, gradients and optimiser moments on the default architecture, "
        "plus its training data; the process's resident memory grows by up to twice that per job, "
        "allocator slack included); beyond it the least recently used is set down.  0: no bound but "
        "TRACE_PREDICTOR_MAX_JOBS.",
    )
    trainer: bool = Field(
        default=True,
        description="Train jobs' predictors, up to this replica's share of the jobs that want training, "
        "each while this replica holds the job's trainer lease; false: serve only, loading the weights "
        "trainer replicas publish (on CPUs, training beside serving costs latency).",
    )
    train_interval_seconds: float = Field(default=2.0, gt=0)
    train_steps_per_round: int = Field(default=50, ge=1)
    torch_threads: int = Field(
        default=0,
        ge=0,
        description="torch intra-op threads; 0: one when the predictor runs on the CPU, torch's default "
        "on a GPU.",
    )

    # Ops
    log_level: Annotated[LogLevel, BeforeValidator(_upper)] = Field(
        default="INFO", description="DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)."
    )
    log_format: LogFormat = Field(
        default="text", description="text, or json: one object per line with the request id."
    )
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="Serve /metrics on this port only; 0: on the main port."
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Interface of the metrics port; `trace-rollout serve` sets it to its --host unless "
        "this is set.",
    )
    sweep_interval_seconds: float = Field(default=5.0, gt=0)
    shutdown_seconds: float = Field(
        default=8.0,
        gt=0,
        description="At SIGTERM, the time given to setting down the predictors this replica trains (all "
        "at once); a job not set down by then keeps its last state in the store and has the trees it "
        "learned from since queued again.  Keep it under the orchestrator's grace period (30 s).",
    )

    @field_validator("predictor_device")
    @classmethod
    def _usable_device(cls, value: str) -> str:
        # Imported here: torch is only needed once a device is named, not for `--help`.
        from trace_service.predictor.model import resolve_device

        resolve_device(value)  # a ValueError names the problem (unknown, or CUDA without CUDA)
        return value

    @field_validator("auth_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            tokens = [token.strip() for token in value.split(",") if token.strip()]
            if value.strip() and not tokens:  # a value that means to set tokens must not turn auth off
                raise ValueError(f"{value!r} holds no token; leave it empty to run without auth")
            return tokens
        return value
