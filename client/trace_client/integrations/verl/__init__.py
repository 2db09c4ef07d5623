"""TRACE in verl's v1 trainer (`trainer.use_v1: true`, verl 0.9.1): the stock trainer, in any of its modes
(`sync`, `colocate_async`, `separate_async`), trains on TRACE's trees with TRACE's per-turn advantages,
and logs TRACE's figures with its own.

What is registered, and where verl calls it:

1. `TraceAgentLoopManager` (`actor_rollout_ref.rollout.agent.agent_loop_manager_class`). The trainer
   hands it every prompt batch it dispatches (a step's, and in the asynchronous modes the warm-up
   batches and the refills of evicted groups); it sends the batch to `/v1/allocate` as the pool, with its
   share of the step's budget and a stable
   `prompt_id` per row (verl's `uid` is new every step, so it cannot key the predictor), and sets each
   row's `__rollout_n__` (verl's per-prompt rollout count) to the tree's bare rollouts, 0 for a prompt
   TRACE skipped. The row's `agent_name` becomes `trace` and the tree's allocation travels with it.
2. `TraceAgentLoop` (agent loop `trace`). verl runs one session per bare rollout. The sessions of one
   prompt share one tree: the first to arrive runs it with `RolloutDriver.run_tree` (bare rollouts,
   Stage 2 continuations) and each session returns the root-to-leaf paths that start at its own bare
   rollout, so a continuation is one more trajectory (`{uid}_{session}_{k}`) of the prompt's group.
   Each path's `rm_scores` hold its leaf reward at its last token, as verl's own loops write them, so
   verl's reward panels chart rewards; TRACE's per-token advantages go in the path's own field
   `trace_advantages`. A path longer than `rollout.response_length` is cut to it (verl's own loops do
   the same), and counted in `extra_fields["trace_truncated"]`.
3. `TraceReplayBuffer` (`trainer.v1.sampler.custom_sampler`, in `replay_buffer`): verl's sync replay
   buffer, which also returns TRACE's figures with the batch (verl logs them under `trace/`) and names
   each sampled row by its TransferQueue key in the row's `uid`; `TraceReplayBufferAsync` is the same
   over verl's asynchronous buffer (staleness control, refills), for the asynchronous modes.
4. The advantage estimator `trace` (`algorithm.adv_estimator: trace`), registered with verl's estimator
   registry when this module is imported: verl passes it the rows' `uid` as `index`, and it returns
   each row's `trace_advantages`, so the actor trains on exactly the tree's advantages.

`trace_overrides(mode=...)` gives the Hydra overrides that switch this on; `TraceSettings` documents the
`trace.*` keys. The default turn is a chunk of at most `trace.turn_tokens` generated tokens (so a
single-answer task still gets branch points inside its answer) scored by verl's reward function
(`reward.custom_reward_function`, else verl's rule-based `default_compute_score`); override
`TraceAgentLoop.next_turn` and `score` for a tool-using agent.

Limits: the estimator ignores the rewards, so `algorithm.use_kl_in_reward` would change nothing the
actor trains on; the overrides turn it off. One driver runs per agent-loop worker process, all trees of
a step under one job: an instruction that a worker claims for another worker's tree (only after an
answer was lost) waits for the service's `lease_seconds`.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any, Final

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf, open_dict
from tensordict import NonTensorData, NonTensorStack, TensorDict
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1 import AgentLoopManagerTQ

from trace_client import AsyncTraceClient, TraceClient
from trace_client.adapters.trajectories import TokenTrajectory, token_trajectories
from trace_client.driver import DriverConfig, FinishedTree, History, RolloutDriver, TurnResult, TurnTokens
from trace_client.errors import TraceError
from trace_client.integrations.verl.replay_buffer import (
    ALLOCATIONS,
    CONTINUATION_FIELD,
    LEAF_ID_FIELD,
    REWARD_FIELD,
    TRACE_METRICS,
    TRAIN_PARTITION,
    TREE_ID_FIELD,
    TREE_MIXED_FIELD,
    TRUNCATED_FIELD,
    AllocationFigures,
    TraceReplayBuffer,
    TraceReplayBufferAsync,
)
from trace_proto import (
    DEFAULT_CONTROL_SHARE,
    AllocateRequest,
    AllocateResponse,
    JobStats,
    Policy,
    PredictorInfo,
    PromptIn,
    TreeAllocation,
    TreeNode,
    TreeResponse,
)

logger = logging.getLogger(__name__)

#: The estimator's and the agent loop's name in verl's registries.
TRACE: Final = "trace"
#: Row fields the manager adds to the batch (they reach the agent loop and TransferQueue).
TREE_FIELD: Final = "trace_tree"
PROMPT_ID_FIELD: Final = "trace_prompt_id"
#: verl's own per-row fields: the rollout count and the agent loop that runs the row.
ROLLOUT_N_FIELD: Final = "__rollout_n__"
AGENT_NAME_FIELD: Final = "agent_name"
#: A path's per-token tree advantages, stored with the trajectory in TransferQueue.
ADVANTAGES_FIELD: Final = "trace_advantages"
#: verl's weights versions of a trajectory (`extra_fields`), which its step metrics require.
WEIGHTS_FIELDS: Final = ("min_global_steps", "max_global_steps")
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


# --- the advantage estimator ---------------------------------------------------------------------------


def trace_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray[Any, Any] | Sequence[str] | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl advantage estimator `trace`: each row's TRACE advantages, `A = trace_advantages · response_mask`,
    and the returns equal A. The rewards are not used: the tree's advantages already hold them.

    verl passes the rows' `uid` as `index`; `TraceReplayBuffer` has set each to the row's TransferQueue
    key, under which the path's `trace_advantages` are stored. A row with no loss token (verl's padding
    rows) gets 0 without a look-up.
    """
    advantages = torch.zeros_like(token_level_rewards)
    trained = [row for row in range(advantages.shape[0]) if bool(response_mask[row].any())]
    if trained:
        if index is None:
            raise ValueError("the trace estimator needs the rows' uid (verl passes it as index)")
        for row, values in zip(trained, path_advantages([str(index[row]) for row in trained]), strict=True):
            width = min(values.numel(), advantages.shape[1])
            advantages[row, :width] = values[:width]
    advantages = advantages * response_mask
    return advantages, advantages.clone()


def path_advantages(keys: Sequence[str]) -> list[torch.Tensor]:
    """The stored `trace_advantages` of the trajectories with these TransferQueue keys."""
    unnamed = [key for key in keys if len(key.rsplit("_", 2)) != 3]
    if unnamed:
        raise ValueError(
            f"rows whose uid is not their trajectory key ({unnamed[:3]}): the trace estimator needs "
            "TraceReplayBuffer as verl's sampler (trainer.v1.sampler.custom_sampler; trace_overrides sets it)"
        )
    data = tq.kv_batch_get(keys=list(keys), partition_id=TRAIN_PARTITION, select_fields=[ADVANTAGES_FIELD])
    return list(data[ADVANTAGES_FIELD].unbind(0))


def register_trace_estimator() -> None:
    """Register `trace_advantages` as verl's estimator `trace` (done on import; calling again is a no-op)."""
    if core_algos.ADV_ESTIMATOR_REGISTRY.get(TRACE) is not trace_advantages:
        core_algos.register_adv_est(TRACE)(trace_advantages)


register_trace_estimator()


# --- settings and overrides ------------------------------------------------------------------------------


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
        f"++actor_rollout_ref.rollout.agent.agent_loop_manager_class={__name__}.TraceAgentLoopManager",
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


# --- the manager: one allocation per step ----------------------------------------------------------------


def stable_prompt_id(row: Mapping[str, Any], key: str | None = None) -> str:
    """The name of a batch row's prompt that stays the same from step to step.

    `key` names the row field that holds it; by default `data_source` and `index` (verl's
    `extra_info.index`) together when the row has an index, else a hash of the prompt's messages.
    """
    if key is not None:
        return str(_plain(row[key]))
    if "index" in row and "data_source" in row:
        return f"{_plain(row['data_source'])}:{_plain(row['index'])}"
    messages = json.dumps(_plain(row["raw_prompt"]), sort_keys=True, default=str)
    return "sha1:" + hashlib.sha1(messages.encode()).hexdigest()


def prompt_text(row: Mapping[str, Any]) -> str | None:
    """The prompt's messages as one text, for the service's predictor."""
    messages = _plain(row.get("raw_prompt"))
    if not isinstance(messages, list):
        return None
    return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


@dataclass(frozen=True)
class TreeTicket:
    """What a batch row carries to the agent loop: the tree allocated for it, in its job and step."""

    job: str
    step: int
    prompt: PromptIn
    tree: TreeAllocation

    def dumps(self) -> str:
        return json.dumps(
            {
                "job": self.job,
                "step": self.step,
                "prompt": self.prompt.model_dump(mode="json"),
                "tree": self.tree.model_dump(mode="json"),
            }
        )

    @classmethod
    def loads(cls, text: str) -> TreeTicket:
        data = json.loads(text)
        return cls(
            data["job"],
            data["step"],
            PromptIn.model_validate(data["prompt"]),
            TreeAllocation.model_validate(data["tree"]),
        )


@dataclass(frozen=True)
class BatchAllocation:
    """One step's allocation over a batch: per row its prompt's stable id and its tree's ticket (None for
    a prompt TRACE skipped, and for the second and later rows of a prompt the batch repeats), and the
    service's answer."""

    prompt_ids: list[str]
    tickets: list[TreeTicket | None]
    response: AllocateResponse


def allocate_batch(batch: TensorDict, config: DictConfig, client: TraceClient, step: int) -> BatchAllocation:
    """Allocate the batch's share of its step's budget with the batch's prompts as the pool."""
    settings = TraceSettings.from_config(config)
    rows = [_row(batch, i) for i in range(len(batch))]
    ids = [stable_prompt_id(row, settings.prompt_id_key) for row in rows]
    pool: dict[str, PromptIn] = {}
    for prompt_id, row in zip(ids, rows, strict=True):
        pool.setdefault(prompt_id, PromptIn(prompt_id=prompt_id, text=prompt_text(row)))
    request = AllocateRequest(
        job=settings.job_name(config),
        step=step,
        budget=settings.batch_budget(config, len(rows)),
        expansion=settings.expansion,
        min_rollouts=settings.min_rollouts,
        max_rollouts=settings.max_rollouts,
        policy=Policy(settings.policy),
        control_share=settings.control_share,
        prompts=list(pool.values()),
    )
    allocation = client.allocate(request)
    trees = {tree.prompt_id: tree for tree in allocation.trees}
    tickets: list[TreeTicket | None] = []
    for prompt_id in ids:
        tree = trees.pop(prompt_id, None)
        tickets.append(
            None if tree is None else TreeTicket(allocation.job, allocation.step, pool[prompt_id], tree)
        )
    return BatchAllocation(ids, tickets, allocation)


class TraceAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent-loop manager, with one TRACE allocation per prompt batch it dispatches.

    Validation batches pass through unchanged (they run the configured default agent loop).
    """

    def __init__(self, config: DictConfig, *args: Any, **kwargs: Any) -> None:
        agent = config.actor_rollout_ref.rollout.agent
        if not agent.get("agent_loop_config_path"):
            with open_dict(config):
                agent.agent_loop_config_path = agent_loops_file()
        super().__init__(config, *args, **kwargs)
        settings = TraceSettings.from_config(config)
        self.trace_client = TraceClient(settings.url, token=settings.token or None)

    def generate_sequences(self, prompts: TensorDict) -> None:
        if "validate" not in prompts or not _plain(prompts["validate"]):
            allocation = annotate_batch(prompts, self.config, self.trace_client)
            # v1's manager returns nothing to the trainer: the step's figures reach verl's metrics
            # through the replay buffer (see `replay_buffer`)
            figures = AllocationFigures.of(allocation.response, self.predictor_info(), self.job_stats())
            ALLOCATIONS.publish(allocation.response.step, figures, groups=len(allocation.prompt_ids))
        super().generate_sequences(prompts)

    def job_stats(self) -> JobStats | None:
        """The job's statistics (its gain over uniform), when `trace.gain_metrics` asks for them; a
        failed call costs the step its figures, not the training."""
        settings = TraceSettings.from_config(self.config)
        if not settings.gain_metrics:
            return None
        try:
            return self.trace_client.job_stats(settings.job_name(self.config))
        except TraceError as error:
            logger.warning("no trace/gain metrics this step: %s", error)
            return None

    def predictor_info(self) -> PredictorInfo | None:
        """The job's predictor's quality figures, when `trace.predictor_metrics` asks for them; a failed
        call costs the step its figures, not the training."""
        settings = TraceSettings.from_config(self.config)
        if not settings.predictor_metrics:
            return None
        try:
            return self.trace_client.predictor_info(settings.job_name(self.config))
        except TraceError as error:
            logger.warning("no trace/predictor metrics this step: %s", error)
            return None


def annotate_batch(batch: TensorDict, config: DictConfig, client: TraceClient) -> BatchAllocation:
    """Allocate the batch's step and write, per row, its rollout count, agent loop, prompt id and ticket.

    A skipped row gets 0 rollouts: verl registers it, runs nothing and the replay buffer finds an empty
    group (no trajectory, no update).
    """
    step = int(_plain(batch["global_steps"])) if "global_steps" in batch else 0
    allocation = allocate_batch(batch, config, client, step)
    tickets = allocation.tickets
    default_agent = config.actor_rollout_ref.rollout.agent.default_agent_loop
    tree_agent = TraceSettings.from_config(config).agent_loop
    batch[ROLLOUT_N_FIELD] = torch.tensor([0 if t is None else t.tree.rollouts for t in tickets])
    batch[AGENT_NAME_FIELD] = NonTensorStack.from_list(
        [default_agent if t is None else tree_agent for t in tickets]
    )
    batch[TREE_FIELD] = NonTensorStack.from_list(["" if t is None else t.dumps() for t in tickets])
    batch[PROMPT_ID_FIELD] = NonTensorStack.from_list(allocation.prompt_ids)
    return allocation


# --- the agent loop: one tree per prompt, one bare rollout per session ----------------------------------


class TraceAgentLoopOutput(AgentLoopOutput):
    """An `AgentLoopOutput` of one root-to-leaf path. `as_dict` (what verl stores) holds the path's
    reward in `rm_scores`, at the last response token as verl's own outputs do, and TRACE's per-token
    advantages (0 off the loss mask) in `trace_advantages`, which the `trace` estimator returns."""

    path_reward: float
    token_advantages: list[float]

    def as_dict(self) -> dict[str, Any]:
        output: dict[str, Any] = super().as_dict()
        advantages = torch.tensor(output.pop("token_advantages"), dtype=torch.float32)
        output[ADVANTAGES_FIELD] = advantages * output["response_mask"]
        # not from reward_score: verl copies a session's last reward_score onto its other outputs,
        # and every path of a session (a bare rollout and its continuations) has its own reward
        reward = output.pop("path_reward")
        rm_scores = torch.zeros_like(output["response_mask"], dtype=torch.float32)
        if len(rm_scores):
            rm_scores[-1] = reward
        output["rm_scores"] = rm_scores
        return output


def path_output(
    trajectory: TokenTrajectory,
    response_length: int,
    *,
    continuation: bool = False,
    tree_mixed: bool = False,
    weights_versions: tuple[int, int] | None = None,
) -> TraceAgentLoopOutput:
    """One root-to-leaf path as verl's agent-loop output, cut to `response_length` tokens.

    `continuation`: the path ends in a Stage 2 continuation; `tree_mixed`: its tree is mixed;
    `weights_versions`: the first and last weights version that generated it (verl's
    `min_global_steps` / `max_global_steps`).
    """
    keep = min(len(trajectory.response_ids), response_length)
    logprobs = None if trajectory.logprobs is None else list(trajectory.logprobs[:keep])
    extra_fields: dict[str, Any] = {
        REWARD_FIELD: trajectory.reward,
        LEAF_ID_FIELD: trajectory.leaf_id,
        TREE_ID_FIELD: trajectory.group,
        TREE_MIXED_FIELD: tree_mixed,
        CONTINUATION_FIELD: continuation,
        TRUNCATED_FIELD: len(trajectory.response_ids) - keep,
        # verl copies the last output's reward info onto a session's other outputs
        "reward_extra_info": {},
    }
    if weights_versions is not None:
        extra_fields.update(zip(WEIGHTS_FIELDS, weights_versions, strict=True))
    return TraceAgentLoopOutput(
        prompt_ids=list(trajectory.prompt_ids),
        response_ids=list(trajectory.response_ids[:keep]),
        response_mask=list(trajectory.loss_mask[:keep]),
        response_logprobs=logprobs,
        # set, so that verl's reward workers do not score the path again
        reward_score=trajectory.reward,
        num_turns=trajectory.turns,
        metrics=AgentLoopMetrics(),
        path_reward=trajectory.reward,
        token_advantages=list(trajectory.advantages[:keep]),
        extra_fields=extra_fields,
    )


def continuation_leaves(tree: TreeResponse) -> set[str]:
    """The leaves whose path passes through a Stage 2 continuation (a node an instruction started)."""
    nodes = {node.node_id: node for node in tree.nodes}
    leaves: set[str] = set()
    for leaf in tree.nodes:
        if leaf.reward is None:
            continue
        node: TreeNode | None = leaf
        while node is not None:
            if node.instruction_id is not None:
                leaves.add(leaf.node_id)
                break
            node = nodes.get(node.parent_id) if node.parent_id is not None else None
    return leaves


def session_outputs(
    finished: FinishedTree,
    prompt_ids: Sequence[int],
    response_length: int,
    *,
    weights_versions: tuple[int, int] | None = None,
) -> list[list[TraceAgentLoopOutput]]:
    """The tree's paths as verl outputs, grouped by the bare rollout they start at (in node order)."""
    roots = [node.node_id for node in finished.tree.nodes if node.parent_id is None]
    sessions: list[list[TraceAgentLoopOutput]] = [
        [] for _ in range(max(finished.allocation.rollouts, len(roots)))
    ]
    index = {root: k for k, root in enumerate(roots)}
    continuations = continuation_leaves(finished.tree)
    for trajectory in token_trajectories([finished], lambda _: prompt_ids):
        output = path_output(
            trajectory,
            response_length,
            continuation=trajectory.leaf_id in continuations,
            tree_mixed=finished.tree.mixed,
            weights_versions=weights_versions,
        )
        sessions[index[trajectory.root_id]].append(output)
    return sessions


class _Trees:
    """Per worker process: the trees in flight, each run once however many of its sessions ask."""

    def __init__(self) -> None:
        self.driver: RolloutDriver | None = None
        self.loops: dict[str, TraceAgentLoop] = {}
        self.runs: dict[str, asyncio.Task[list[list[TraceAgentLoopOutput]]]] = {}
        self.sessions_left: dict[str, int] = {}

    async def outputs(
        self, loop: TraceAgentLoop, ticket: TreeTicket, session: int
    ) -> list[TraceAgentLoopOutput]:
        tree_id = ticket.tree.tree_id
        run = self.runs.get(tree_id)
        if run is None:
            driver = self._driver(loop)
            self.loops[tree_id] = loop
            self.sessions_left[tree_id] = ticket.tree.rollouts
            run = self.runs[tree_id] = asyncio.create_task(loop.run_tree(driver, ticket))
        try:
            sessions = await asyncio.shield(run)
            return sessions[session] if session < len(sessions) else []
        finally:
            self.sessions_left[tree_id] -= 1
            if self.sessions_left[tree_id] <= 0:
                for books in (self.loops, self.runs, self.sessions_left):
                    books.pop(tree_id, None)

    def _driver(self, loop: TraceAgentLoop) -> RolloutDriver:
        if self.driver is None:
            settings = loop.trace_settings
            client = AsyncTraceClient(settings.url, token=settings.token or None)
            self.driver = RolloutDriver(
                client, self._next_turn, score=self._score, config=settings.driver_config()
            )
        return self.driver

    async def _next_turn(self, history: History) -> TurnResult:
        return await self.loops[history.tree_id].next_turn(history)

    async def _score(self, history: History) -> float:
        return await self.loops[history.tree_id].score(history)


_TREES = _Trees()


class TraceAgentLoop(AgentLoopBase):
    """verl agent loop `trace`: runs the row's tree (once per prompt) and returns this session's paths.

    The default turn generates at most `trace.turn_tokens` tokens from the server; the rollout ends at
    the end-of-sequence token or when `rollout.response_length` tokens are used. The reward is verl's
    reward function on the decoded response. Subclass and override `next_turn` / `score` (and register
    the subclass in an agent-loop file) for an agent with tools or another reward.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace_settings = TraceSettings.from_config(self.config)
        self.response_length = int(self.rollout_config.response_length)
        self.sampling_params: dict[str, Any] = {}
        self.row: dict[str, Any] = {}
        self.prompt_ids: list[int] = []
        # the weights versions the inference server reported for this tree's turns
        self.weights_versions: set[int] = set()
        self._reward_fn: Any = None

    # verl's TransferQueue worker takes a list (one output per trajectory), though the base annotates one
    async def run(  # type: ignore[override]
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> list[TraceAgentLoopOutput]:
        ticket = TreeTicket.loads(str(_plain(kwargs[TREE_FIELD])))
        self.sampling_params = dict(sampling_params)
        self.row = {key: _plain(value) for key, value in kwargs.items()}
        return await _TREES.outputs(self, ticket, int(kwargs["session_id"]))

    async def run_tree(self, driver: RolloutDriver, ticket: TreeTicket) -> list[list[TraceAgentLoopOutput]]:
        self.prompt_ids = await self.build_prompt_ids()
        finished = await driver.run_tree(ticket.tree, ticket.prompt, job=ticket.job, step=ticket.step)
        return session_outputs(
            finished, self.prompt_ids, self.response_length, weights_versions=self.tree_weights(ticket)
        )

    def tree_weights(self, ticket: TreeTicket) -> tuple[int, int]:
        """The first and last weights version of the tree's turns; verl's step metrics need them on
        every trajectory. A turn that bypasses verl's server reports none: then the version a sync
        step generates with, the previous step's weights."""
        if self.weights_versions:
            return min(self.weights_versions), max(self.weights_versions)
        return max(ticket.step - 1, 0), max(ticket.step - 1, 0)

    async def build_prompt_ids(self) -> list[int]:
        """The prompt's token ids, through verl's tokenization path (chat template; a prompt longer than
        `rollout.prompt_length` keeps its last tokens, as verl's own loops do)."""
        return list(await self.ct_build_initial_tokens(list(self.row["raw_prompt"])))

    async def next_turn(self, history: History) -> TurnResult:
        """One chunk of generated tokens after the history's turns."""
        used = sum(len(turn.tokens.ids) for turn in history.turns if turn.tokens is not None)
        room = self.response_length - used
        asked = max(1, min(self.trace_settings.turn_tokens, room))
        context = [*self.prompt_ids, *(i for turn in history.turns if turn.tokens for i in turn.tokens.ids)]
        params = {**self.sampling_params, "max_tokens": asked}
        # verl routes by request id (sticky sessions): one tree, one replica, whose prefix cache then
        # serves every continuation branched from the tree's turns
        output = await self.server_manager.generate(
            request_id=history.tree_id,
            prompt_ids=context,
            sampling_params=params,
        )
        self.weights_versions.update(
            int(output.extra_fields[name])
            for name in (*WEIGHTS_FIELDS, "global_steps")
            if output.extra_fields.get(name) is not None
        )
        ids = tuple(int(i) for i in output.token_ids)
        tokenizer: Any = self.tokenizer
        eos = tokenizer.eos_token_id
        done = not ids or ids[-1] == eos or len(ids) < asked or used + len(ids) >= self.response_length
        logprobs = tuple(float(x) for x in output.log_probs) if output.log_probs else None
        return TurnResult(
            text=tokenizer.decode(ids, skip_special_tokens=True),
            done=done,
            tokens=TurnTokens(ids, logprobs=logprobs),
        )

    async def score(self, history: History) -> float:
        """verl's reward function on the whole response (`reward.custom_reward_function`, else verl's
        rule-based `default_compute_score` for the row's `data_source`)."""
        ground_truth = (self.row.get("reward_model") or {}).get("ground_truth")
        arguments = (self.row.get("data_source"), self.response_text(history), ground_truth)
        reward = self._reward()
        if inspect.iscoroutinefunction(reward):
            result = await reward(*arguments, extra_info=self.row.get("extra_info"))
        else:  # rule-based scorers (math verification, sandboxes) take a while: off the event loop
            result = await asyncio.to_thread(reward, *arguments, extra_info=self.row.get("extra_info"))
        value = result["score"] if isinstance(result, dict) else result
        return float(value)

    def response_text(self, history: History) -> str:
        """The response decoded in one piece (chunks decoded apart could split a character)."""
        if all(turn.tokens is not None for turn in history.turns):
            tokenizer: Any = self.tokenizer
            ids = [i for turn in history.turns if turn.tokens for i in turn.tokens.ids]
            return str(tokenizer.decode(ids, skip_special_tokens=True))
        return "".join(turn.text or "" for turn in history.turns)

    def _reward(self) -> Any:
        if self._reward_fn is None:
            from verl.trainer.ppo.reward import get_custom_reward_fn
            from verl.utils.reward_score import default_compute_score

            self._reward_fn = get_custom_reward_fn(self.config) or default_compute_score
        return self._reward_fn


# --- small helpers ---------------------------------------------------------------------------------------


def _row(batch: TensorDict, i: int) -> dict[str, Any]:
    """Row `i` of a verl batch as plain values (what the agent-loop worker hands an agent loop)."""
    row: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            row[key] = value[i]
        elif isinstance(value, NonTensorStack):
            row[key] = value[i].data
        elif isinstance(value, NonTensorData):
            row[key] = value.data
    return row


def _plain(value: Any) -> Any:
    """numpy and torch scalars and arrays as Python values, and pandas' NaN (a field a row lacks) as None."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


__all__ = [
    "ADVANTAGES_FIELD",
    "TRACE",
    "TRACE_METRICS",
    "TraceAgentLoop",
    "TraceAgentLoopManager",
    "TraceAgentLoopOutput",
    "TraceReplayBuffer",
    "TraceReplayBufferAsync",
    "TraceSettings",
    "TreeTicket",
    "allocate_batch",
    "annotate_batch",
    "continuation_leaves",
    "path_advantages",
    "path_output",
    "register_trace_estimator",
    "session_outputs",
    "stable_prompt_id",
    "trace_advantages",
    "trace_overrides",
]
