"""The allocation algorithms: pure functions over numpy arrays, no I/O (trainers may import them)."""

from trace_service.allocation.policies import (
    dapo_keep,
    greso_keep,
    knapsack_weight,
    pcl_roots,
    random_branching,
    uniform_roots,
)
from trace_service.allocation.policy_rules import (
    POLICIES,
    Need,
    PolicyRules,
    PrefixInputs,
    PrefixPlacement,
    RootInputs,
)
from trace_service.allocation.reserve import Reserve, Sharing, bare_mixed_chance
from trace_service.allocation.stage1 import (
    RootAllocation,
    allocate_roots,
    allocate_roots_exact,
    repeat_odds,
    root_value,
)
from trace_service.allocation.stage2 import (
    DEFAULT_MIN_GAIN,
    PrefixExpansion,
    continuation_budget,
    expand_prefixes,
    prefix_value,
    repeat_probability,
    round_budgets,
    spread_evenly,
)
from trace_service.allocation.stats import EffectiveRatio, effective_ratio, is_mixed, mixed_groups

__all__ = [
    "DEFAULT_MIN_GAIN",
    "POLICIES",
    "EffectiveRatio",
    "Need",
    "PolicyRules",
    "PrefixExpansion",
    "PrefixInputs",
    "PrefixPlacement",
    "Reserve",
    "RootAllocation",
    "RootInputs",
    "Sharing",
    "allocate_roots",
    "allocate_roots_exact",
    "bare_mixed_chance",
    "continuation_budget",
    "dapo_keep",
    "effective_ratio",
    "expand_prefixes",
    "greso_keep",
    "is_mixed",
    "knapsack_weight",
    "mixed_groups",
    "pcl_roots",
    "prefix_value",
    "random_branching",
    "repeat_odds",
    "repeat_probability",
    "root_value",
    "round_budgets",
    "spread_evenly",
    "uniform_roots",
]
