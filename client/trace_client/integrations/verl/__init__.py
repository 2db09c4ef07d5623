"""TRACE in verl's v1 trainer (`trainer.use_v1: true`, verl 0.9.1): the stock trainer, in any of its modes
(`sync`, `colocate_async`, `separate_async`), trains on TRACE's trees with TRACE's per-turn advantages,
and logs TRACE's figures with its own.

What is registered, and where verl calls it:

1. `TraceAgentLoopManager` (`actor_rollout_ref.rollout.agent.agent_loop_manager_class`, in `manager`).
   The trainer hands it every prompt batch it dispatches (a step's, and in the asynchronous modes the warm-up
   batches and the refills of evicted groups); it sends the batch to `/v1/allocate` as the pool, with its
   share of the step's budget and a stable
   `prompt_id` per row (verl's `uid` is new every step, so it cannot key the predictor), and sets each
   row's `__rollout_n__` (verl's per-prompt rollout count) to the tree's bare rollouts, 0 for a prompt
   TRACE skipped. The row's `agent_name` becomes `trace` and the tree's allocation travels with it.
2. `TraceAgentLoop` (agent loop `trace`, in `agent_loop`). verl runs one session per bare rollout. The
   sessions of one prompt share one tree: the first to arrive runs it with `RolloutDriver.run_tree`
   (bare rollouts, Stage 2 continuations) and each session returns the root-to-leaf paths that start at
   its own bare rollout, so a continuation is one more trajectory (`{uid}_{session}_{k}`)
   of the prompt's group.
   Each path's `rm_scores` hold its leaf reward at its last token, as verl's own loops write them, so
   verl's reward panels chart rewards; TRACE's per-token advantages go in the path's own field
   `trace_advantages`. A path longer than `rollout.response_length` is cut to it (verl's own loops do
   the same), and counted in `extra_fields["trace_truncated"]`.
3. `TraceReplayBuffer` (`trainer.v1.sampler.custom_sampler`, in `replay_buffer`): verl's sync replay
   buffer, which also returns TRACE's figures with the batch (verl logs them under `trace/`) and names
   each sampled row by its TransferQueue key in the row's `uid`; `TraceReplayBufferAsync` is the same
   over verl's asynchronous buffer (staleness control, refills), for the asynchronous modes.
4. The advantage estimator `trace` (`algorithm.adv_estimator: trace`), registered with verl's estimator
   registry when this package is imported (`estimator`): verl passes it the rows' `uid` as `index`, and
   it returns each row's `trace_advantages`, so the actor trains on exactly the tree's advantages.

`trace_overrides(mode=...)` gives the Hydra overrides that switch this on; `TraceSettings` documents the
`trace.*` keys (both in `settings`). The default turn is a chunk of at most `trace.turn_tokens` generated
tokens (so a single-answer task still gets branch points inside its answer) scored by verl's reward
function (`reward.custom_reward_function`, else verl's rule-based `default_compute_score`); override
`TraceAgentLoop.next_turn` and `score` for a tool-using agent.

Limits: the estimator ignores the rewards, so `algorithm.use_kl_in_reward` would change nothing the
actor trains on; the overrides turn it off. One driver runs per agent-loop worker process, all trees of
a step under one job: an instruction that a worker claims for another worker's tree (only after an
answer was lost) waits for the service's `lease_seconds`.
"""

from trace_client.integrations.verl.agent_loop import (
    TraceAgentLoop,
    TraceAgentLoopOutput,
    continuation_leaves,
    path_output,
    session_outputs,
)
from trace_client.integrations.verl.estimator import (
    path_advantages,
    register_trace_estimator,
    trace_advantages,
)
from trace_client.integrations.verl.manager import (
    BatchAllocation,
    TraceAgentLoopManager,
    TreeTicket,
    allocate_batch,
    annotate_batch,
    prompt_text,
    stable_prompt_id,
)
from trace_client.integrations.verl.names import (
    ADVANTAGES_FIELD,
    AGENT_NAME_FIELD,
    PROMPT_ID_FIELD,
    ROLLOUT_N_FIELD,
    TRACE,
    TREE_FIELD,
)
from trace_client.integrations.verl.replay_buffer import (
    TRACE_METRICS,
    TraceReplayBuffer,
    TraceReplayBufferAsync,
)
from trace_client.integrations.verl.settings import SAMPLERS, TraceSettings, agent_loops_file, trace_overrides

__all__ = [
    "ADVANTAGES_FIELD",
    "AGENT_NAME_FIELD",
    "PROMPT_ID_FIELD",
    "ROLLOUT_N_FIELD",
    "SAMPLERS",
    "TRACE",
    "TRACE_METRICS",
    "TREE_FIELD",
    "BatchAllocation",
    "TraceAgentLoop",
    "TraceAgentLoopManager",
    "TraceAgentLoopOutput",
    "TraceReplayBuffer",
    "TraceReplayBufferAsync",
    "TraceSettings",
    "TreeTicket",
    "agent_loops_file",
    "allocate_batch",
    "annotate_batch",
    "continuation_leaves",
    "path_advantages",
    "path_output",
    "prompt_text",
    "register_trace_estimator",
    "session_outputs",
    "stable_prompt_id",
    "trace_advantages",
    "trace_overrides",
]
