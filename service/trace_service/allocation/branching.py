"""One Stage 2 round of one tree, from its targets to its continuations per prefix (pure, no I/O).

The service's Stage 2 (``trace_service.engine.stage2_rounds``) runs every round through these functions, and
the benchmarks' simulated trees call the same ones, so a change to a round's rule is made once:

1. :func:`branch_depth`: how deep the tree may branch: the request's ``max_branch_depth``, and for a
   policy that shares its continuations, no deeper than its ``agreeing_depth`` while the tree's bare
   rollouts agree (``Sharing.branch_depth``);
2. :func:`round_candidates`: the prefixes within that depth (``allocation.tree.prefix_candidates``);
3. :func:`can_branch`: whether the tree has one, which is what a sharing policy's reserve asks before
   a tree draws from it (``Reserve.draw``);
4. :func:`place_round`: the round's share over those candidates by the policy's Stage 2 rule, reading
   Ṽ at each candidate when the rule needs it (``PolicyRules.prefixes``).
"""

from __future__ import annotations

import numpy as np

from trace_service.allocation import PolicyRules, PrefixInputs, PrefixPlacement, is_mixed
from trace_service.allocation._validate import FloatArray
from trace_service.allocation.tree import PrefixCandidates, TreeTargets, prefix_candidates


def branch_depth(
    rules: PolicyRules, requested: int | None, bare_successes: int, bare_trials: int
) -> int | None:
    """The deepest prefix a tree with this bare group may branch from (None: any)."""
    if rules.sharing is None:
        return requested
    agrees = not is_mixed(bare_successes, bare_trials)
    return rules.sharing.branch_depth(agrees=agrees, requested=requested)


def round_candidates(
    targets: TreeTargets, rules: PolicyRules, requested: int | None, bare_successes: int, bare_trials: int
) -> PrefixCandidates:
    """The tree's branching candidates within :func:`branch_depth`, in node order."""
    return prefix_candidates(targets, branch_depth(rules, requested, bare_successes, bare_trials))


def can_branch(candidates: PrefixCandidates) -> bool:
    """Whether a continuation could start anywhere in the tree: some candidate is not already mixed."""
    return bool(np.any(~candidates.blocked))


def place_round(
    rules: PolicyRules,
    candidates: PrefixCandidates,
    share: int,
    *,
    predicted: FloatArray | None,
    bare_successes: int,
    bare_trials: int,
    fallback: bool,
    rng: np.random.Generator,
) -> PrefixPlacement:
    """The round's ``share`` over ``candidates`` by the policy's Stage 2 rule: continuations per
    candidate, summing to at most ``share`` (what it does not place goes back: ``fallback`` false, or
    nowhere to go).  ``predicted`` is Ṽ at the candidates, required when the rule reads it."""
    if candidates.nodes.size == 0 or share <= 0:
        return PrefixPlacement(np.zeros(candidates.nodes.size, dtype=np.int64))
    return rules.prefixes.place(
        PrefixInputs(
            budget=share,
            outcome=candidates.outcome,
            blocked=candidates.blocked,
            fallback=fallback,
            predicted=predicted,
            bare_successes=bare_successes,
            bare_trials=bare_trials,
            rng=rng,
        )
    )
