"""TRACE in TRL's `GRPOTrainer` through its `rollout_func` extension point (tested with TRL 1.16.0; 1.12
to 1.15 lack the `unwrap_model_for_generation` argument used here).

    rollout = TraceRollout(TraceSettings(url="http://trace-rollout:8000", job="qwen-gsm8k"), score=check)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[rollout.trace_advantage],
        args=GRPOConfig(..., scale_rewards="none"),
        train_dataset=dataset,
        rollout_func=rollout,
    )

What happens per generation batch (TRL calls `rollout(prompts, trainer)` with `per_device_train_batch_size
× steps_per_generation` prompts, each dataset prompt repeated `num_generations` times):

1. The batch's distinct prompts are the pool of one `/v1/allocate` (`job`, step = `trainer.state
   .global_step`); each prompt is named by a hash of its text or messages, so it keeps its outcome
   history across epochs. A skipped prompt gets no rollout.
2. `RolloutDriver.run_step` runs each tree's bare rollouts with the trainer's model (the turns of all
   rollouts in flight are sampled as one `generate` batch, with the trainer's sampling settings),
   reports every turn to `/v1/expand` and runs the Stage 2 continuations it answers with.
3. The finished trees become rows (`rows.training_rows`): a row is a stretch of one root-to-leaf path
   whose turns share one TRACE advantage, its earlier turns the row's prompt (context), its tool and
   environment tokens masked out through TRL's `env_mask`. A turn shared by several paths is trained
   once. Every token is thus trained with exactly its turn's advantage, which TRL's one-number-per-row
   advantages could not express for a whole path.
4. TRL's batch has a fixed number of rows, `num_generations` per dataset prompt, and its advantage is
   `reward − mean(rewards of the row's group of num_generations rows)`. TRACE's rows are as many as its
   trees make, unevenly per prompt, so they are not tied to their prompt's group: `rows.pack_rows` puts at
   most `num_generations − 1` rows in each group, gives each row its advantage as reward, and fills the
   group with filler rows (one pad token, loss mask 0: never trained) whose rewards bring the group's
   mean to 0. With `scale_rewards="none"` TRL's advantage of each row is then exactly TRACE's. Nothing
   the trees made is dropped: if the rows do not fit, the step fails (`rows.RowCapacityError`); by
   default the budget is the most bare rollouts whose rows always fit (`rows.safe_budget`).

Required trainer settings, checked at every batch: `scale_rewards="none"`, `reward_funcs=
[rollout.trace_advantage]` alone, a loss that weights tokens alike (`loss_type` `dapo`, TRL's default,
`bnpo`, `dr_grpo` or `cispo`), `mask_truncated_completions=False`, no `tools` / `environment_factory`
(the task's tools belong in `next_turn`), no vLLM, and a per-process generation batch of whole groups.

TRL's own `reward` metric is then the mean of the rows' rewards (advantages and balances, 0 per
group), and its group statistics (`frac_reward_zero_std`) describe slot groups, not prompts; the
rollouts' real rewards and counts are logged as `trace/reward`, `trace/trees`,
`trace/skipped_prompts`, `trace/bare_rollouts`, `trace/continuations`, `trace/failed_rollouts`,
`trace/rows` and `trace/row_fill` (rows / room). Each slot's `trace_tree_id`, `trace_prompt_id`,
`trace_node_ids` and `trace_leaf_reward` reach reward functions as TRL's extra fields (None or empty
for a filler); TRL's completion table shows each slot's dataset prompt, not its row's.

Limits: evaluation batches are refused (`eval_strategy="no"`); turns are sampled with the trainer's
model through transformers' `generate`, without sampling log-probabilities (no vLLM; under FSDP
override `generate`); with several processes each allocates its own slice of the batch under the
same job; a rollout that fails (an exception in `next_turn`) is left out of the rows, as every adapter
leaves it, and counted in `trace/failed_rollouts`, while a model that cannot generate fails the step;
the default budget counts the worst case, so `trace/row_fill` usually stays well below 1 (set `budget`
higher, at the risk of a step that does not fit); a row runs its context through the forward pass again.
"""

from trace_client.integrations.trl.rollout import (
    TOKEN_LEVEL_LOSSES,
    CompletionScore,
    TraceRollout,
    TraceSettings,
    TraceStep,
    prompt_text,
    prompt_token_ids,
    stable_prompt_id,
)
from trace_client.integrations.trl.rows import (
    PackedSlot,
    RowCapacityError,
    TrainingRow,
    pack_rows,
    row_capacity,
    rows_per_bare_rollout,
    safe_budget,
    training_rows,
)

__all__ = [
    "TOKEN_LEVEL_LOSSES",
    "CompletionScore",
    "PackedSlot",
    "RowCapacityError",
    "TraceRollout",
    "TraceSettings",
    "TraceStep",
    "TrainingRow",
    "pack_rows",
    "prompt_text",
    "prompt_token_ids",
    "row_capacity",
    "rows_per_bare_rollout",
    "safe_budget",
    "stable_prompt_id",
    "training_rows",
]
