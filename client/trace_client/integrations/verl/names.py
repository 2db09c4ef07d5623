"""The names TRACE's pieces meet on inside verl: its registry name, the batch row fields the manager writes
for the agent loop, and the trajectory fields the agent loop stores in TransferQueue for the replay buffer
and the estimator. Kept apart so that each writer and reader names them from one place."""

from __future__ import annotations

from typing import Final

#: The estimator's and the agent loop's name in verl's registries, and the config section's.
TRACE: Final = "trace"

#: Row fields the manager adds to the batch (they reach the agent loop and TransferQueue).
TREE_FIELD: Final = "trace_tree"
PROMPT_ID_FIELD: Final = "trace_prompt_id"
#: verl's own per-row fields: the rollout count and the agent loop that runs the row.
ROLLOUT_N_FIELD: Final = "__rollout_n__"
AGENT_NAME_FIELD: Final = "agent_name"

#: verl's TransferQueue partition of the training trajectories.
TRAIN_PARTITION: Final = "train"
#: A path's per-token tree advantages, stored with the trajectory in TransferQueue.
ADVANTAGES_FIELD: Final = "trace_advantages"
#: verl's weights versions of a trajectory (`extra_fields`), which its step metrics require.
WEIGHTS_FIELDS: Final = ("min_global_steps", "max_global_steps")
#: `extra_fields` of a TRACE path (written by the agent loop, read by the step's figures).
REWARD_FIELD: Final = "trace_reward"
TREE_ID_FIELD: Final = "trace_tree_id"
LEAF_ID_FIELD: Final = "trace_leaf_id"
TREE_MIXED_FIELD: Final = "trace_tree_mixed"
CONTINUATION_FIELD: Final = "trace_continuation"
TRUNCATED_FIELD: Final = "trace_truncated"
