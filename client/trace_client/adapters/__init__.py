"""Adapters around the worker driver.

- `trajectories`: finished trees → root-to-leaf paths and token rows with per-turn advantages (what
  every trainer adapter shares).
- `verl`: verl agent-loop outputs and a `DataProto` (verl imported lazily).
- `skyrl`: a SkyRL `GeneratorOutput` and a pass-through advantage estimator (SkyRL imported lazily).

Framework packages are imported only inside the functions that build their objects: the base install
(no torch) can import every module here.
"""

from trace_client.adapters.trajectories import (
    PromptTokens,
    Segment,
    TokenTrajectory,
    TreePath,
    token_trajectories,
    tree_paths,
)

__all__ = ["PromptTokens", "Segment", "TokenTrajectory", "TreePath", "token_trajectories", "tree_paths"]
