"""The policy registry: for each policy of the contract (``trace_proto.Policy``), its Stage 1 rule, its
Stage 2 rule and what they need.  The one place the service, the benchmarks and the demo look a policy
up (docs/allocation.md, "Policies").

A rule is a pure function over a small typed record: :class:`RootInputs` for Stage 1 (bare rollouts per
prompt, 0 = skip; never more than the budget, within the rollout and prompt limits) and
:class:`PrefixInputs` for one Stage 2 round of one tree (continuations per candidate prefix; never more
than the round's share).  A rule declares the optional inputs it reads (:class:`Need`); a caller supplies
those and nothing else is required of it.  A new input is one more optional field of the record.

Decisions the copies this replaces disagreed on:

* Knapsack's success estimate is Ṽ at the roots, as for PCL and TRACE: an A/B of policies then compares
  rules on the same estimate (the service's predictor already updates on the prompt's own outcomes; the
  benchmark's history-only posterior is Knapsack RL's estimate of success from earlier epochs).
* DAPO filters in Stage 2: a tree whose bare rollouts all agree gets no continuations (its share is
  returned), the others an even spread; ``keeps_only_mixed_groups`` tells a trainer (or a benchmark
  standing in for one) that DAPO also drops the all-equal groups from its batch.
* The baselines' Stage 2 rules (random, even) see every candidate prefix: that a subtree already holds
  both outcomes is TRACE Stage 2's knowledge, which the ablations replace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from trace_proto import Policy
from trace_service.allocation._validate import FloatArray, IntArray, check_limits
from trace_service.allocation.policies import (
    dapo_keep,
    greso_keep,
    knapsack_weight,
    pcl_roots,
    random_branching,
    uniform_roots,
)
from trace_service.allocation.reserve import Sharing
from trace_service.allocation.stage1 import allocate_roots, allocate_roots_exact
from trace_service.allocation.stage2 import expand_prefixes, spread_evenly

BoolArray = npt.NDArray[np.bool_]

#: Knapsack is solved exactly (the dynamic programme) up to this many cells, prompts × budget × m_max;
#: above it by the production solver, within one block of the optimum.
KNAPSACK_EXACT_CELLS = 20_000_000
#: GRESO keeps a prompt after k zero-variance groups in a row with probability this ** k.
GRESO_KEEP_PROBABILITY = 0.1


class Need(StrEnum):
    """An optional input a rule reads; the caller must supply it for the policies that list it."""

    ROOT_PREDICTIONS = "root_predictions"  # Ṽ at every prompt (RootInputs.predicted)
    FRESHNESS = "freshness"  # the learned ρ of the joint objective (RootInputs.freshness)
    ZERO_VARIANCE_STREAKS = "zero_variance_streaks"  # RootInputs.zero_variance_streak
    PREFIX_PREDICTIONS = "prefix_predictions"  # Ṽ at every candidate prefix (PrefixInputs.predicted)
    BARE_OUTCOMES = "bare_outcomes"  # the tree's bare group (PrefixInputs.bare_successes, bare_trials)
    RNG = "rng"  # a random generator (RootInputs.rng, PrefixInputs.rng)


#: Needs that mean asking the predictor.
PREDICTOR_NEEDS = frozenset({Need.ROOT_PREDICTIONS, Need.PREFIX_PREDICTIONS})


@dataclass(frozen=True)
class RootInputs:
    """What a Stage 1 rule may read about one step's pool of ``n_prompts`` prompts.

    The budget and limits are the request's; the optional fields are supplied when the policy's rules
    need them (:attr:`PolicyRules.needs`), arrays one entry per prompt in pool order.
    """

    n_prompts: int
    budget: int
    min_rollouts: int = 2
    max_rollouts: int = 64
    max_prompts: int | None = None
    expansion: float = 0.0
    predicted: FloatArray | None = None
    freshness: float | None = None
    zero_variance_streak: IntArray | None = None
    rng: np.random.Generator | None = None

    def __post_init__(self) -> None:
        for name in ("predicted", "zero_variance_streak"):
            value = getattr(self, name)
            if value is not None and np.shape(value) != (self.n_prompts,):
                raise ValueError(f"{name} must have shape ({self.n_prompts},), got {np.shape(value)}")


@dataclass(frozen=True)
class PrefixInputs:
    """What a Stage 2 rule may read about one round of one tree: the candidate prefixes' observed
    outcomes and blocked mask (``allocation.tree.prefix_candidates``), the round's share ``budget``,
    and ``fallback`` (spread what TRACE's greedy cannot place, or return it).
    """

    budget: int
    outcome: FloatArray
    blocked: BoolArray
    fallback: bool = True
    predicted: FloatArray | None = None
    bare_successes: int | None = None
    bare_trials: int | None = None
    rng: np.random.Generator | None = None

    def __post_init__(self) -> None:
        shape = np.shape(self.outcome)
        for name in ("blocked", "predicted"):
            value = getattr(self, name)
            if value is not None and np.shape(value) != shape:
                raise ValueError(f"{name} must have the outcome's shape {shape}, got {np.shape(value)}")

    @property
    def n_candidates(self) -> int:
        return int(np.size(self.outcome))


@dataclass(frozen=True)
class PrefixPlacement:
    """A Stage 2 round's continuations per candidate, and how many of them TRACE's fallback placed."""

    counts: IntArray
    fallback_units: int = 0


_Value = TypeVar("_Value")


def _given(value: _Value | None, need: Need, rule: str) -> _Value:
    if value is None:
        raise ValueError(f"the {rule} rule needs {need.value}, which was not supplied")
    return value


# --- Stage 1 rules ---------------------------------------------------------------------------------


def _joint_roots(inputs: RootInputs) -> IntArray:
    """TRACE Stage 1, the joint objective: ``max Σ_i V_root(Ṽ_i, m_i)`` with ``z₁ = v(1 − ρ(1 − v))^N``,
    ``z₀ = (1 − v)(1 − ρv)^N`` at the learned freshness ρ (``stage1``)."""
    return allocate_roots(
        _given(inputs.predicted, Need.ROOT_PREDICTIONS, "joint"),
        inputs.budget,
        min_rollouts=inputs.min_rollouts,
        max_rollouts=inputs.max_rollouts,
        max_prompts=inputs.max_prompts,
        expansion=inputs.expansion,
        freshness=_given(inputs.freshness, Need.FRESHNESS, "joint"),
    ).counts


def _trace_roots(inputs: RootInputs) -> IntArray:
    """TRACE Stage 1 as the paper has it: ``max Σ_i 1 − Ṽ_i^m_i − (1 − Ṽ_i)^m_i``, the expected mixed
    groups of the bare rollouts (``stage1``)."""
    return allocate_roots(
        _given(inputs.predicted, Need.ROOT_PREDICTIONS, "trace"),
        inputs.budget,
        min_rollouts=inputs.min_rollouts,
        max_rollouts=inputs.max_rollouts,
        max_prompts=inputs.max_prompts,
    ).counts


def _uniform_roots(inputs: RootInputs) -> IntArray:
    """GRPO: the budget dealt evenly over the first ``min(n, max_prompts, ⌊M/m_min⌋)`` prompts."""
    return uniform_roots(
        inputs.n_prompts,
        inputs.budget,
        min_rollouts=inputs.min_rollouts,
        max_rollouts=inputs.max_rollouts,
        max_prompts=inputs.max_prompts,
    )


def _greso_roots(inputs: RootInputs) -> IntArray:
    """GRESO: uniform over the prompts kept with probability ``keep_probability ** streak``."""
    keep = greso_keep(
        _given(inputs.zero_variance_streak, Need.ZERO_VARIANCE_STREAKS, "greso"),
        _given(inputs.rng, Need.RNG, "greso"),
        keep_probability=GRESO_KEEP_PROBABILITY,
    )
    return uniform_roots(
        inputs.n_prompts,
        inputs.budget,
        min_rollouts=inputs.min_rollouts,
        max_rollouts=inputs.max_rollouts,
        max_prompts=inputs.max_prompts,
        keep=keep,
    )


def _pcl_roots(inputs: RootInputs) -> IntArray:
    """PCL: the prompts with Ṽ closest to ½, each ``clip(⌊M / min(n, max_prompts)⌋, m_min, m_max)``."""
    batch = check_limits(
        inputs.n_prompts, inputs.budget, inputs.min_rollouts, inputs.max_rollouts, inputs.max_prompts
    )
    per_prompt = int(np.clip(inputs.budget // max(batch, 1), inputs.min_rollouts, inputs.max_rollouts))
    return pcl_roots(
        _given(inputs.predicted, Need.ROOT_PREDICTIONS, "pcl"),
        inputs.budget,
        rollouts_per_prompt=per_prompt,
        max_prompts=inputs.max_prompts,
    )


def _knapsack_roots(inputs: RootInputs) -> IntArray:
    """Knapsack RL: ``max Σ_i w_i V_root(Ṽ_i, m_i)`` with ``w = Ṽ(1 − Ṽ)²``, exactly while the dynamic
    programme has at most :data:`KNAPSACK_EXACT_CELLS` cells."""
    v = _given(inputs.predicted, Need.ROOT_PREDICTIONS, "knapsack")
    cells = inputs.n_prompts * inputs.budget * inputs.max_rollouts
    solver = allocate_roots_exact if cells <= KNAPSACK_EXACT_CELLS else allocate_roots
    return solver(
        v,
        inputs.budget,
        min_rollouts=inputs.min_rollouts,
        max_rollouts=inputs.max_rollouts,
        max_prompts=inputs.max_prompts,
        weight=knapsack_weight(v),
    ).counts


# --- Stage 2 rules ---------------------------------------------------------------------------------


def _trace_prefixes(inputs: PrefixInputs) -> PrefixPlacement:
    """TRACE Stage 2: the greedy on ``Σ_c 1 − q_c^K_c`` over the unblocked candidates (``stage2``)."""
    expansion = expand_prefixes(
        _given(inputs.predicted, Need.PREFIX_PREDICTIONS, "trace"),
        inputs.outcome,
        inputs.budget,
        blocked=inputs.blocked,
        fallback=inputs.fallback,
    )
    return PrefixPlacement(expansion.counts, expansion.fallback_units)


def _random_prefixes(inputs: PrefixInputs) -> PrefixPlacement:
    """TreePO: each continuation at a uniformly random candidate (a multinomial draw)."""
    rng = _given(inputs.rng, Need.RNG, "random")
    return PrefixPlacement(random_branching(inputs.n_candidates, inputs.budget, rng))


def _even_prefixes(inputs: PrefixInputs) -> PrefixPlacement:
    """Uniform Stage 2: the share dealt round-robin over the candidates, earlier ones first."""
    return PrefixPlacement(spread_evenly(np.ones(inputs.n_candidates, dtype=bool), inputs.budget))


def _even_if_mixed_prefixes(inputs: PrefixInputs) -> PrefixPlacement:
    """DAPO: nothing for a tree whose bare rollouts all agree (``0 < s < n`` fails), else even."""
    successes = _given(inputs.bare_successes, Need.BARE_OUTCOMES, "even_if_mixed")
    trials = _given(inputs.bare_trials, Need.BARE_OUTCOMES, "even_if_mixed")
    if not dapo_keep(successes, trials):
        return PrefixPlacement(np.zeros(inputs.n_candidates, dtype=np.int64))
    return _even_prefixes(inputs)


# --- the registry ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RootRule:
    """A Stage 1 rule: its name, the optional inputs it reads, and the rule.  ``equal_groups``: every
    prompt it keeps gets the same count (±1), the budget over at most ``max_prompts`` prompts, so a
    caller that wants groups of n asks for ``max_prompts = ⌊M/n⌋``."""

    name: str
    needs: frozenset[Need]
    counts: Callable[[RootInputs], IntArray]
    equal_groups: bool = False


@dataclass(frozen=True)
class PrefixRule:
    """A Stage 2 rule: its name, the optional inputs it reads, and the rule."""

    name: str
    needs: frozenset[Need]
    place: Callable[[PrefixInputs], PrefixPlacement]


JOINT_ROOTS = RootRule("joint", frozenset({Need.ROOT_PREDICTIONS, Need.FRESHNESS}), _joint_roots)
TRACE_ROOTS = RootRule("trace", frozenset({Need.ROOT_PREDICTIONS}), _trace_roots)
UNIFORM_ROOTS = RootRule("uniform", frozenset(), _uniform_roots, equal_groups=True)
GRESO_ROOTS = RootRule(
    "greso", frozenset({Need.ZERO_VARIANCE_STREAKS, Need.RNG}), _greso_roots, equal_groups=True
)
PCL_ROOTS = RootRule("pcl", frozenset({Need.ROOT_PREDICTIONS}), _pcl_roots, equal_groups=True)
KNAPSACK_ROOTS = RootRule("knapsack", frozenset({Need.ROOT_PREDICTIONS}), _knapsack_roots)

TRACE_PREFIXES = PrefixRule("trace", frozenset({Need.PREFIX_PREDICTIONS}), _trace_prefixes)
RANDOM_PREFIXES = PrefixRule("random", frozenset({Need.RNG}), _random_prefixes)
EVEN_PREFIXES = PrefixRule("even", frozenset(), _even_prefixes)
EVEN_IF_MIXED_PREFIXES = PrefixRule("even_if_mixed", frozenset({Need.BARE_OUTCOMES}), _even_if_mixed_prefixes)


#: ``trace_joint``'s sharing: a tree keeps half its continuations (contrast inside a mixed tree) and pools
#: the rest; a tree whose bare rollouts agree branches from first turns.
JOINT_SHARING = Sharing(kept=0.5, agreeing_depth=1)


@dataclass(frozen=True)
class PolicyRules:
    """One policy: its Stage 1 rule, its Stage 2 rule, whether its trainer keeps only mixed groups, how
    its trees share one continuation budget per allocation (``sharing``, ``reserve``: a tree whose bare
    rollouts already disagree leaves its pooled part to those whose bare rollouts agree; None: each
    tree spends its own share), and whether its Stage 1 reads Ṽ through the job's trust map
    (``calibrated``, ``allocation.trust``: fitted to the job's recent bare groups, so that a predictor with no
    skill on the job yields uniform's allocation) or as the predictor gives it, and whether the job's
    evidence chooses how deep its trees branch (``shaped``, ``allocation.split.decide_shape``: a share of
    them branch from first turns only)."""

    roots: RootRule
    prefixes: PrefixRule
    keeps_only_mixed_groups: bool = False
    sharing: Sharing | None = None
    calibrated: bool = False
    shaped: bool = False

    @property
    def needs(self) -> frozenset[Need]:
        return self.roots.needs | self.prefixes.needs


POLICIES: Mapping[Policy, PolicyRules] = MappingProxyType(
    {
        Policy.TRACE: PolicyRules(TRACE_ROOTS, TRACE_PREFIXES, calibrated=True, shaped=True),
        # The paper's rules read the predictor as it is.
        Policy.TRACE_PAPER: PolicyRules(TRACE_ROOTS, TRACE_PREFIXES),
        Policy.TRACE_JOINT: PolicyRules(JOINT_ROOTS, TRACE_PREFIXES, sharing=JOINT_SHARING, calibrated=True),
        Policy.TRACE_SHARED: PolicyRules(JOINT_ROOTS, TRACE_PREFIXES, sharing=Sharing(), calibrated=True),
        Policy.TRACE_ROOT: PolicyRules(TRACE_ROOTS, RANDOM_PREFIXES, calibrated=True),
        Policy.TRACE_PREFIX: PolicyRules(UNIFORM_ROOTS, TRACE_PREFIXES),
        Policy.UNIFORM: PolicyRules(UNIFORM_ROOTS, EVEN_PREFIXES),
        Policy.DAPO: PolicyRules(UNIFORM_ROOTS, EVEN_IF_MIXED_PREFIXES, keeps_only_mixed_groups=True),
        Policy.GRESO: PolicyRules(GRESO_ROOTS, EVEN_PREFIXES),
        Policy.PCL: PolicyRules(PCL_ROOTS, EVEN_PREFIXES),
        Policy.KNAPSACK: PolicyRules(KNAPSACK_ROOTS, EVEN_PREFIXES),
        Policy.TREEPO: PolicyRules(UNIFORM_ROOTS, RANDOM_PREFIXES),
    }
)
