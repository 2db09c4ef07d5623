"""The `trace.*` section of verl's config and the Hydra overrides that switch TRACE on in verl's v1
trainer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import resources
from typing import Final

from omegaconf import DictConfig, OmegaConf

from trace_client.driver import DriverConfig
from trace_client.integrations.verl.names import TRACE
from trace_client.integrations.verl.replay_buffer import TraceReplayBuffer, TraceReplayBufferAsync
from trace_proto import DEFAULT_CONTROL_SHARE

#: The longest job name the service takes (JOB_PATTERN).
MAX_JOB_LENGTH: Final = 128
#: The agent-loop registry file shipped with this package (verl's `agent_loop_config_path`).
AGENT_LOOPS_FILE: Final = "agent_loops.yaml"
#: verl's v1 trainer modes (`trainer.v1.trainer_mode`) and the replay buffer TRACE samples with in each.
SAMPLERS: Final[Mapping[str, type[TraceReplayBuffer]]] = {
    "sync": TraceReplayBuffer,
    "colocate_async": TraceReplayBufferAsync,
    "separate_async": TraceReplayBufferAsync,
}


@dataclass(frozen=True)
class TraceSettings:
    """The `trace.*` section of verl's config (on the command line: `++trace.<key>=...`).

    Args:
        url: The trace-rollout service.
        token: Its bearer token, if it needs one (else the client reads `TRACE_TOKEN`).
        job: The service's job name (default: `trainer.experiment_name`, made a valid job name).
        budget: Bare rollouts per step (default: `data.train_batch_size × rollout.n`, GRPO's count); a
            batch of another size than `data.train_batch_size` (an asynchronous trainer's warm-up or
            refill) gets its share, at least `min_rollouts`.
        expansion: Stage 2 continuations per bare rollout a prompt may branch.
        policy: `trace` or `uniform` (the same budget spread evenly: the baseline).
        control_share: The share of the budget spent on control trees, the random sample of uniform's
            allocation the job's gain (`trace/gain/*`) is measured on and Stage 1's trust is fitted to.
        min_rollouts / max_rollouts: Bare rollouts of a selected prompt.
        prompt_id_key: The row field that names a prompt across steps (default: `data_source` and
            `index` together, else a hash of the prompt's messages).
        turn_tokens: The default turn: at most this many generated tokens.
        max_turns: A rollout that has not ended after this many turns fails.
        concurrency: Rollouts in flight at once in one agent-loop worker.
        tree_timeout: Seconds one tree may take; past it the tree is closed with what it has.
        agent_loop: The registered agent loop that runs the trees (`trace`, or a subclass of
            `TraceAgentLoop` registered under another name, such as the dry run's `trace_sim`).
        predictor_metrics: Ask the service for its predictor's quality (`GET /v1/predictor`, one call
            a step) for the `trace/predictor/*` metrics; the version is logged either way.
        gain_metrics: Ask the service for the job's gain over uniform (`GET /v1/jobs/{job}/stats`, one
            call a step) for the `trace/gain/*` and `trace/control/*` metrics.
    """

    url: str = "http://localhost:8000"
    token: str | None = None
    job: str | None = None
    budget: int | None = None
    expansion: float = 1.0
    policy: str = "trace"
    control_share: float = DEFAULT_CONTROL_SHARE
    min_rollouts: int = 2
    max_rollouts: int = 16
    prompt_id_key: str | None = None
    turn_tokens: int = 256
    max_turns: int = 64
    concurrency: int = 64
    tree_timeout: float = 3600.0
    agent_loop: str = TRACE
    predictor_metrics: bool = True
    gain_metrics: bool = True

    @classmethod
    def from_config(cls, config: DictConfig) -> TraceSettings:
        section = config.get(TRACE) or {}
        container = (
            OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else section
        )
        if not isinstance(container, dict):
            raise ValueError(f"the trace section must be a mapping, got {container!r}")
        values = {str(key): value for key, value in container.items()}
        known = {item.name for item in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown trace settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)

    def job_name(self, config: DictConfig) -> str:
        """`job`, else the experiment name with what a job name cannot hold replaced by '-'."""
        if self.job:
            return self.job
        name = str(config.trainer.get("experiment_name") or "verl")
        cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "-" for c in name)
        return ("verl-" + cleaned if not cleaned[0].isalnum() else cleaned)[:MAX_JOB_LENGTH]

    def batch_budget(self, config: DictConfig, prompts: int) -> int:
        """The bare rollouts of a batch of `prompts` rows: the step's budget, pro rata."""
        train_batch_size = int(config.data.train_batch_size)
        step = self.budget
        if step is None:
            step = train_batch_size * int(config.actor_rollout_ref.rollout.n)
        if prompts == train_batch_size:
            return step
        return max(self.min_rollouts, round(step * prompts / train_batch_size))

    def driver_config(self) -> DriverConfig:
        return DriverConfig(
            concurrency=self.concurrency, max_turns=self.max_turns, step_timeout=self.tree_timeout
        )


def agent_loops_file() -> str:
    """The absolute path of the agent-loop registry file that lists `trace` for verl's workers."""
    return str(resources.files(__package__).joinpath(AGENT_LOOPS_FILE))


def trace_overrides(
    url: str = "http://localhost:8000", *, mode: str = "sync", **settings: object
) -> list[str]:
    """The Hydra overrides for `python -m verl.trainer.main_ppo` that train with TRACE in verl's trainer
    mode `mode` (`sync`, `colocate_async` or `separate_async`).

    `settings` are further `trace.*` keys (see `TraceSettings`), e.g. `expansion=1.0`.
    """
    if mode not in SAMPLERS:
        raise ValueError(f"unknown trainer mode {mode!r}; verl's v1 trainer has {sorted(SAMPLERS)}")
    known = {item.name for item in fields(TraceSettings)}
    for name in settings:
        if name not in known:
            raise ValueError(f"unknown trace setting {name!r}")
    sampler = SAMPLERS[mode]
    overrides = [
        "trainer.use_v1=true",
        f"trainer.v1.trainer_mode={mode}",
        f"trainer.v1.sampler.custom_sampler.path=pkg://{sampler.__module__}",
        f"trainer.v1.sampler.custom_sampler.name={sampler.__name__}",
        f"algorithm.adv_estimator={TRACE}",
        "algorithm.use_kl_in_reward=false",
        f"++actor_rollout_ref.rollout.agent.agent_loop_manager_class={__package__}.TraceAgentLoopManager",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loops_file()}",
        f"++trace.url={url}",
    ]
    overrides += [f"++trace.{name}={_hydra_value(value)}" for name, value in settings.items()]
    return overrides


def _hydra_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
