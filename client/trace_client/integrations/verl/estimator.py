"""The advantage estimator `trace` (`algorithm.adv_estimator: trace`), registered with verl's estimator
registry when this module is imported (the package imports it): verl passes it the rows' `uid` as
`index`, and it returns each row's `trace_advantages`, so the actor trains on exactly the tree's
advantages.

The estimator ignores the rewards, so `algorithm.use_kl_in_reward` would change nothing the actor trains
on; `trace_overrides` turns it off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from verl.trainer.ppo import core_algos

from trace_client.integrations.verl.names import ADVANTAGES_FIELD, TRACE, TRAIN_PARTITION


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
