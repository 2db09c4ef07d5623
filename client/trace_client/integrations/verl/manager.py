"""The agent-loop manager: one TRACE allocation per prompt batch verl dispatches, written into the batch
rows that the agent loop runs."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, open_dict
from tensordict import NonTensorStack, TensorDict
from verl.trainer.ppo.v1 import AgentLoopManagerTQ

from trace_client import TraceClient
from trace_client.errors import TraceError
from trace_client.integrations.verl.names import (
    AGENT_NAME_FIELD,
    PROMPT_ID_FIELD,
    ROLLOUT_N_FIELD,
    TREE_FIELD,
)
from trace_client.integrations.verl.replay_buffer import ALLOCATIONS, AllocationFigures
from trace_client.integrations.verl.rows import batch_row, plain_value
from trace_client.integrations.verl.settings import TraceSettings, agent_loops_file
from trace_proto import (
    AllocateRequest,
    AllocateResponse,
    JobStats,
    Policy,
    PredictorInfo,
    PromptIn,
    TreeAllocation,
)

logger = logging.getLogger(__name__)


def stable_prompt_id(row: Mapping[str, Any], key: str | None = None) -> str:
    """The name of a batch row's prompt that stays the same from step to step.

    `key` names the row field that holds it; by default `data_source` and `index` (verl's
    `extra_info.index`) together when the row has an index, else a hash of the prompt's messages.
    """
    if key is not None:
        return str(plain_value(row[key]))
    if "index" in row and "data_source" in row:
        return f"{plain_value(row['data_source'])}:{plain_value(row['index'])}"
    messages = json.dumps(plain_value(row["raw_prompt"]), sort_keys=True, default=str)
    return "sha1:" + hashlib.sha1(messages.encode()).hexdigest()


def prompt_text(row: Mapping[str, Any]) -> str | None:
    """The prompt's messages as one text, for the service's predictor."""
    messages = plain_value(row.get("raw_prompt"))
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
    rows = [batch_row(batch, i) for i in range(len(batch))]
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
        if "validate" not in prompts or not plain_value(prompts["validate"]):
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
    step = int(plain_value(batch["global_steps"])) if "global_steps" in batch else 0
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
