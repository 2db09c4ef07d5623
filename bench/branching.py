"""Stage 2 in the harness: continuations planned from each tree's prefixes by a policy's rules, in
rounds, run on the simulator and grafted onto the step's `Forest`, within the step's budget."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from bench.estimators import Estimator, Query, estimate
from bench.forest import SUCCESS_THRESHOLD, Forest, Ledger, PromptRecord
from trace_lab.sim import RolloutState
from trace_lab.sim.base import Workload
from trace_service.allocation import (
    Need,
    PolicyRules,
    Reserve,
    Sharing,
    continuation_budget,
    is_mixed,
    round_budgets,
)
from trace_service.allocation.branching import can_branch, place_round
from trace_service.allocation.tree import PrefixCandidates
from trace_service.lifecycle import is_success

FloatArray = npt.NDArray[np.float64]


def branch(
    workload: Workload,
    rules: PolicyRules,
    estimator: Estimator,
    forest: Forest,
    history: dict[str, PromptRecord],
    ledger: Ledger,
    rng: np.random.Generator,
    mixed_chance: FloatArray | None,
    *,
    expansion: float,
    rounds: int,
) -> None:
    """Stage 2 by the policy's `rules` (or random branching) over every started tree, in planning
    rounds; a round makes one batched call of the `estimator` and one plan per tree.

    Counting rollouts, tree i gets ⌊m_i·N⌋ continuations (N the `expansion`) split over `rounds`, each
    round run as one simulator batch; for a policy whose trees share their continuations
    (`PolicyRules.sharing`, given each tree's `mixed_chance`) each tree gets the part of its share it
    keeps and its draw from the step's reserve instead, the trees deciding in pool order
    (`shared_draws`).
    Counting turns, tree i's allowance is its share of the turns left (in proportion to m_i; shares
    are not pooled, though a sharing policy's depth rule still holds); a round plans as many
    continuations as the allowance buys at the expected cost of the tree's candidates. Planned
    continuations start in waves, each admitted only while its worst case (running to max_turns) fits
    the step's turns left; a new round is planned when every planned one has run, and branching ends
    when a round plans nothing or nothing more fits.
    """
    started = [trials > 0 for trials in forest.bare_trials]
    if ledger.turn_budget is None:
        shares = [continuation_budget(planned, expansion) for planned in forest.planned]
        sharing = rules.sharing
        if mixed_chance is not None and sharing is not None:
            shares = shared_draws(forest, shares, mixed_chance, sharing)
        units = [round_budgets(share, rounds) for share in shares]
        for round_index in range(rounds):
            budgets = [tree_units[round_index] for tree_units in units]
            planned = plan_round(rules, estimator, forest, history, started, budgets, workload, rng, ledger)
            _run_continuations(workload, forest, planned, ledger, rng)
        return

    shares = [count if is_started else 0 for count, is_started in zip(forest.planned, started, strict=True)]
    turns_left = ledger.turns_left
    allowance = [turns_left * share // max(sum(shares), 1) for share in shares]
    pending: list[tuple[int, int]] = []
    while True:
        if not pending:
            pending = plan_round(rules, estimator, forest, history, started, allowance, workload, rng, ledger)
        wave, pending = _admit(forest, pending, ledger.turns_left, workload.max_turns)
        if not wave:
            return
        for tree, trajectory in _run_continuations(workload, forest, wave, ledger, rng):
            allowance[tree] -= len(trajectory)


def shared_draws(
    forest: Forest, shares: Sequence[int], mixed_chance: FloatArray, sharing: Sharing
) -> list[int]:
    """Each tree's continuations: the part of its share it keeps (`Sharing.split`) and its draw from
    one reserve of the pooled parts (`Reserve`), drawn in tree order: a tree takes when its bare group
    agrees and it has a prefix to branch from."""
    successes, visits, _ = forest.outcomes()
    mixed = is_mixed(successes, visits)
    candidates = forest.candidates()
    splits = [sharing.split(share) for share in shares]
    reserve = Reserve.of([pooled for _, pooled in splits], mixed_chance.tolist())
    draws = []
    for tree, ((kept, pooled), chance) in enumerate(zip(splits, mixed_chance.tolist(), strict=True)):
        branches = can_branch(candidates[tree])
        drawn, reserve = reserve.draw(pooled, chance, agrees=not mixed[tree], can_branch=branches)
        draws.append(kept + drawn)
    return draws


def plan_round(
    rules: PolicyRules,
    estimator: Estimator,
    forest: Forest,
    history: dict[str, PromptRecord],
    started: Sequence[bool],
    budgets: Sequence[int],
    workload: Workload,
    rng: np.random.Generator,
    ledger: Ledger,
) -> list[tuple[int, int]]:
    """One planning round of the policy's `rules`: (tree, node) per planned continuation. `budgets` are
    continuations per tree when counting rollouts and turn allowances when counting turns. Records the
    outcome each planned prefix is seen to have, against which a continuation's flip is counted."""
    candidates = forest.candidates()
    estimates: Sequence[FloatArray | None] = (
        _prefix_estimates(estimator, forest, candidates, history)
        if Need.PREFIX_PREDICTIONS in rules.prefixes.needs
        else [None] * len(candidates)
    )
    planned: list[tuple[int, int]] = []
    for tree, candidate in enumerate(candidates):
        if not started[tree] or candidate.nodes.size == 0 or budgets[tree] <= 0:
            continue
        units = budgets[tree]
        if ledger.turn_budget is not None:
            # A turn allowance buys continuations at the mean expected cost of the tree's candidates.
            costs = [workload.expected_remaining_turns(forest.states[node]) for node in candidate.nodes]
            units = math.floor(units / float(np.mean(costs)))
        placement = place_round(
            rules,
            candidate,
            units,
            predicted=estimates[tree],
            bare_successes=forest.bare_successes[tree],
            bare_trials=forest.bare_trials[tree],
            fallback=True,
            rng=rng,
        )
        counts = placement.counts
        ledger.fallback_units += placement.fallback_units
        for node, outcome, count in zip(
            candidate.nodes.tolist(), candidate.outcome.tolist(), counts.tolist(), strict=True
        ):
            planned.extend([(tree, node)] * count)
            if count:
                forest.observed_outcome[node] = outcome
    return planned


def _admit(
    forest: Forest, planned: Sequence[tuple[int, int]], room: int, max_turns: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Split planned continuations into a wave whose worst-case turns fit `room` and the rest that may
    fit once the wave's actual turns are known; one whose worst case exceeds all of `room` is dropped."""
    wave: list[tuple[int, int]] = []
    rest: list[tuple[int, int]] = []
    free = room
    for tree, node in planned:
        worst = max_turns - forest.states[node].turns
        if worst <= free:
            wave.append((tree, node))
            free -= worst
        elif worst <= room:
            rest.append((tree, node))
    return wave, rest


def _run_continuations(
    workload: Workload,
    forest: Forest,
    planned: Sequence[tuple[int, int]],
    ledger: Ledger,
    rng: np.random.Generator,
) -> list[tuple[int, tuple[RolloutState, ...]]]:
    """Run one batch of continuations, graft them onto their trees, charge them; (tree, trajectory) each."""
    trajectories = workload.run([forest.states[node] for _, node in planned], rng)
    ledger.charge(trajectories, continuation=True)
    ledger.branch_depth += sum(forest.states[node].turns for _, node in planned)
    ledger.continuation_turns += sum(len(trajectory) for trajectory in trajectories)
    for (tree, node), trajectory in zip(planned, trajectories, strict=True):
        forest.add(tree, node, trajectory, bare=False)
        succeeded = is_success(trajectory[-1].reward or 0.0, SUCCESS_THRESHOLD)
        ledger.flips += succeeded != is_success(forest.observed_outcome[node], SUCCESS_THRESHOLD)
    return [(tree, trajectory) for (tree, _), trajectory in zip(planned, trajectories, strict=True)]


def _prefix_estimates(
    estimator: Estimator,
    forest: Forest,
    candidates: Sequence[PrefixCandidates],
    history: dict[str, PromptRecord],
) -> list[FloatArray]:
    """Ṽ at every candidate of every tree, in one estimator call; a prompt's outcomes include this
    step's scored bare rollouts."""
    queries: list[Query] = []
    for tree, candidate in enumerate(candidates):
        prompt = forest.prompts[tree]
        record = history.get(prompt.prompt_id, PromptRecord())
        successes = record.successes + forest.bare_successes[tree]
        trials = record.trials + forest.bare_trials[tree]
        queries.extend(
            Query(prompt, forest.states[node], successes, trials) for node in candidate.nodes.tolist()
        )
    estimates = estimate(estimator, queries)
    bounds = np.cumsum([candidate.nodes.size for candidate in candidates])[:-1]
    return np.split(estimates, bounds)
