"""Allocation strategies run side by side on a simulated workload family, in process (no HTTP).

One step of a strategy on a candidate pool: estimate success where the strategy needs it, allocate bare
rollouts to roots (its policy's Stage 1 rule), run them on the simulator, branch continuations from
prefixes (its policy's Stage 2 rule, or not at all), score the trees, update the per-prompt outcome
history and, in learning mode, let the workload learn from the mixed groups. A strategy is a contract
policy, and its rules are the service's, looked up in `trace_service.allocation.POLICIES`; this module
only wires them to the simulator (Stage 2 in `bench.branching`) and keeps the books (`bench.forest`).

Budgets (`StepConfig`): `bare_rollouts` M, expansion N, group size n. Strategies that branch get M bare
rollouts plus ⌊m_i·N⌋ continuations for each active prompt i; strategies that do not branch spend the
same total R = M + ⌊M·N⌋ on bare rollouts (their policy at expansion 0); rules that give every kept
prompt the same count give groups of n. Counted in turns instead (`BudgetUnit.turns`), every strategy
gets the same number of turns, R times the mean rollout length (`mean_rollout_turns`), and a
continuation from a deep prefix costs only the turns it generates. Work is admitted only while its
worst case still fits the turns left (a rollout from depth d costs at most max_turns − d), so no
strategy ever exceeds its budget.

The estimator Ṽ is one pluggable callable over `Query` objects (`Estimator`); `posterior_estimator`
(each prompt's Beta posterior, MoPPS-style) stands in until a learned predictor is plugged in, and
`oracle_estimator` reads the simulator's true probabilities.

Each step also keeps the books of the regret decomposition (`StepResult`): the Stage 1 value the root
counts realise under the true probabilities against the best counts for the same bare budget, the bare
rollouts spent on near-certain prompts, the continuations that flipped the outcome they branched from,
and the estimator's predictions at the roots next to the true success.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from bench.branching import branch
from bench.estimators import (
    Estimator,
    KnowableRoots,
    PredictiveEstimator,
    Query,
    TruthAt,
    check_estimates,
    estimate,
    oracle_estimator,
    posterior_estimator,
)
from bench.forest import Forest, Ledger, PromptRecord
from trace_lab.sim import Prompt, RolloutState
from trace_lab.sim.base import Workload
from trace_proto import Policy
from trace_service.allocation import (
    POLICIES,
    Need,
    PolicyRules,
    RootInputs,
    allocate_roots,
    bare_mixed_chance,
    continuation_budget,
    dapo_keep,
    effective_ratio,
    is_mixed,
    root_value,
)
from trace_service.allocation.tree import ROOT, FreshnessEstimate

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: A prompt whose true success lies below this or above 1 minus it is near-certain: bare rollouts spent
#: on it are (almost) never a mixed group.
EXTREME_SUCCESS = 0.05


class BudgetUnit(StrEnum):
    rollouts = "rollouts"
    turns = "turns"


class RootBelief(StrEnum):
    """What TRACE Stage 1 makes of the estimator's root predictions."""

    point = "point"  # the point value at Ṽ (the service's trace)
    thompson = "thompson"  # the point value at one Beta draw for each prompt with no earlier rollouts


@dataclass(frozen=True)
class Strategy:
    """A named run of a contract policy: its rules (`POLICIES`), the estimator Ṽ they consult, and
    whether it branches; one that does not is its policy at expansion 0 with all of R on bare rollouts.

    A policy that keeps only mixed groups (DAPO's dynamic sampling) counts them in `StepResult.kept`;
    effective ratios still divide by sampled groups. A Stage 1 that reads the freshness uses the one
    learned from the strategy's own earlier trees, as the service does. `belief` other than point needs
    a `PredictiveEstimator`.
    """

    name: str
    policy: Policy
    estimator: Estimator = posterior_estimator
    branches: bool = True
    belief: RootBelief = RootBelief.point
    # Each tree spends its own share, at any depth: the policy's sharing switched off (an ablation).
    local: bool = False

    @property
    def rules(self) -> PolicyRules:
        rules = POLICIES[self.policy]
        return dataclasses.replace(rules, sharing=None) if self.local else rules


def default_strategies(
    make_estimator: Callable[[], Estimator] = lambda: posterior_estimator,
    text_noise: float = math.inf,
) -> list[Strategy]:
    """The benchmark's line-up; `make_estimator()` gives the Ṽ of TRACE, PCL and Knapsack (as the service's
    predictor does) — a fresh one per strategy, so that a learning estimator learns only from its own
    strategy's trees; the oracle reads the truth.

    The baselines whose Stage 2 is an even spread run flat (GRPO-style groups of n at R rollouts);
    TRACE root-only (random Stage 2) and prefix-only (uniform Stage 1) branch, so each ablation spends
    the same budget as full TRACE. `trace_flat` and `oracle_flat` are TRACE's Stage 1 with all of R on
    bare rollouts (expansion 0): what branching is worth against fresh rollouts. The `*_knowable_roots`
    run Stage 1 on `KnowableRoots` with the family's `text_noise` (`declared_text_noise`).
    """
    return [
        Strategy("uniform", Policy.UNIFORM, branches=False),
        Strategy("dapo", Policy.DAPO, branches=False),
        Strategy("greso", Policy.GRESO, branches=False),
        Strategy("pcl", Policy.PCL, make_estimator(), branches=False),
        Strategy("knapsack", Policy.KNAPSACK, make_estimator(), branches=False),
        Strategy("treepo", Policy.TREEPO),
        Strategy("trace_root", Policy.TRACE_ROOT, make_estimator()),
        Strategy("trace_prefix", Policy.TRACE_PREFIX, make_estimator()),
        Strategy("trace", Policy.TRACE, make_estimator()),
        Strategy("trace_joint", Policy.TRACE_JOINT, make_estimator()),
        Strategy("trace_joint_local", Policy.TRACE_JOINT, make_estimator(), local=True),
        Strategy("trace_thompson", Policy.TRACE, make_estimator(), belief=RootBelief.thompson),
        Strategy("trace_paper", Policy.TRACE_PAPER, make_estimator()),
        Strategy("trace_shared", Policy.TRACE_SHARED, make_estimator()),
        Strategy("trace_flat", Policy.TRACE, make_estimator(), branches=False),
        Strategy("trace_true_roots", Policy.TRACE, TruthAt(make_estimator(), roots=True)),
        Strategy("trace_true_prefixes", Policy.TRACE, TruthAt(make_estimator(), roots=False)),
        Strategy(
            "trace_knowable_roots", Policy.TRACE, KnowableRoots(make_estimator(), text_noise=text_noise)
        ),
        Strategy("oracle", Policy.TRACE, oracle_estimator),
        Strategy("oracle_joint", Policy.TRACE_JOINT, oracle_estimator),
        Strategy(
            "oracle_knowable_roots", Policy.TRACE, KnowableRoots(oracle_estimator, text_noise=text_noise)
        ),
        Strategy("oracle_shared", Policy.TRACE_SHARED, oracle_estimator),
        Strategy("oracle_flat", Policy.TRACE, oracle_estimator, branches=False),
    ]


@dataclass(frozen=True)
class StepConfig:
    """Budget and allocation knobs of one training step (see the module docstring for the budgets)."""

    bare_rollouts: int = 1024
    expansion: float = 1.0
    group_size: int = 8
    unit: BudgetUnit = BudgetUnit.rollouts
    # Turns per step when `unit` is turns; `counted_in` sets it from the workload's mean rollout length.
    turn_budget: int = 0
    min_rollouts: int = 2
    max_rollouts: int = 64
    max_prompts: int | None = None
    # Stage 2 rounds per step when counting rollouts (each round sees the outcomes of the previous ones);
    # when counting turns, rounds continue until nothing more fits.
    rounds: int = 1
    # Continuations only from prefixes at most this many turns deep (the request's `max_branch_depth`).
    max_branch_depth: int | None = None

    def __post_init__(self) -> None:
        if self.bare_rollouts < 0:
            raise ValueError(f"bare_rollouts must be >= 0, got {self.bare_rollouts}")
        if not (math.isfinite(self.expansion) and self.expansion >= 0):
            raise ValueError(f"expansion must be a finite number >= 0, got {self.expansion}")
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.unit is BudgetUnit.turns and self.turn_budget < 1:
            raise ValueError("a turn budget (turn_budget >= 1) is needed when the unit is turns")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if self.max_branch_depth is not None and self.max_branch_depth < 1:
            raise ValueError(f"max_branch_depth must be >= 1 or None, got {self.max_branch_depth}")

    @property
    def total_rollouts(self) -> int:
        """R = M + ⌊M·N⌋: what a strategy that branches may spend at most, and what one that does not gets."""
        return self.bare_rollouts + continuation_budget(self.bare_rollouts, self.expansion)

    def counted_in(self, unit: BudgetUnit, rollout_turns: float) -> StepConfig:
        """This budget counted in `unit`; in turns it is T = R × `rollout_turns` (`mean_rollout_turns`)."""
        turns = math.floor(self.total_rollouts * rollout_turns)
        return dataclasses.replace(self, unit=unit, turn_budget=turns)


def mean_rollout_turns(workload: Workload) -> float:
    """The exact mean length of a fresh rollout over the workload's whole population, as it stands."""
    return statistics.fmean(
        workload.expected_remaining_turns(workload.start(prompt.prompt_id)) for prompt in workload.prompts
    )


@dataclass(frozen=True)
class StepResult:
    """One step of one strategy. `effective_ratio` divides by active (sampled) groups; `mixed_forks`
    counts the prefixes continuations were started from whose subtree ended up holding both outcomes
    (the node-level contrast Stage 2 aims at, which the effective ratio does not see)."""

    pool: int
    active: int
    mixed: int
    kept: int
    mixed_forks: int
    rollouts: int
    continuations: int
    turns: int
    # Continuations Stage 2 planned through its fallback (spread evenly where no prefix had value left).
    fallback_units: int
    # Regret decomposition. Stage 1: Σ_i V_root(p_i, m_i) over the started groups with the true p_i, and
    # the same for the counts TRACE Stage 1 would choose from the true p_i for this strategy's bare budget;
    # both in the strategy's own objective (the joint one at the freshness it allocated with).
    stage1_value: float
    stage1_oracle_value: float
    # Bare rollouts spent on prompts whose true success is below 0.05 or above 0.95.
    bare_on_extremes: int
    # Continuations whose outcome differs from the observed outcome below the prefix they branched from.
    flips: int
    # Σ over continuations of their prefix's depth (turns before the fork), and the turns they generated.
    branch_depth: int
    continuation_turns: int
    # (flips, flips fresh rollouts would have made) of this step's continuations: freshness evidence.
    freshness_evidence: tuple[int, float]
    # (predicted, true) success at each root the strategy's estimator was asked about.
    root_predictions: tuple[tuple[float, float], ...]

    @property
    def skipped(self) -> int:
        return self.pool - self.active

    @property
    def bare(self) -> int:
        return self.rollouts - self.continuations

    @property
    def effective_ratio(self) -> float:
        return self.mixed / self.active if self.active else 0.0


def run_step(
    workload: Workload,
    strategy: Strategy,
    pool: Sequence[Prompt],
    history: dict[str, PromptRecord],
    config: StepConfig,
    rng: np.random.Generator,
    *,
    learn: bool = True,
    freshness: float = FreshnessEstimate().value,
) -> StepResult:
    """Run one step of `strategy` on `pool`; update `history` (and the workload when `learn`).
    `freshness` is the ρ of the joint Stage 1 objective (learned from earlier steps' trees)."""
    rho = _freshness_used(strategy, freshness)
    counts, predicted = _root_counts(workload, strategy, pool, history, config, rng, rho)
    true_p = workload.true_success_many([prompt.prompt_id for prompt in pool])
    forest, ledger, chosen = _grow_trees(workload, strategy, pool, counts, predicted, history, config, rng)
    successes, visits, mixed_forks = forest.outcomes()
    # A group the turn budget could not admit was never started: its prompt counts as skipped.
    started = visits > 0
    ratio = effective_ratio(successes[started], visits[started], skipped=len(pool) - int(started.sum()))
    mixed = is_mixed(successes, visits)
    kept = (
        int(dapo_keep(successes[started], visits[started]).sum())
        if strategy.rules.keeps_only_mixed_groups
        else ratio.active
    )
    started_counts = np.zeros(len(pool), dtype=np.int64)
    started_counts[chosen] = forest.bare_trials
    stage1_oracle = _stage1_counts(true_p, _root_budget(strategy, config), config, rho)
    extreme = (true_p < EXTREME_SUCCESS) | (true_p > 1.0 - EXTREME_SUCCESS)
    root_prediction = np.full(len(pool), 0.5) if predicted is None else predicted
    evidence = forest.continuation_flips(root_prediction[chosen]) if forest.states else (0, 0.0)
    _remember_step(workload, strategy.estimator, forest, history, started, mixed, learn=learn)
    return StepResult(
        pool=len(pool),
        active=ratio.active,
        mixed=ratio.mixed,
        kept=kept,
        mixed_forks=mixed_forks,
        rollouts=ledger.rollouts,
        continuations=ledger.continuations,
        turns=ledger.turns,
        fallback_units=ledger.fallback_units,
        stage1_value=float(
            root_value(true_p, started_counts, expansion=config.expansion, freshness=rho).sum()
        ),
        stage1_oracle_value=float(
            root_value(true_p, stage1_oracle, expansion=config.expansion, freshness=rho).sum()
        ),
        bare_on_extremes=int(started_counts[extreme].sum()),
        flips=ledger.flips,
        branch_depth=ledger.branch_depth,
        continuation_turns=ledger.continuation_turns,
        freshness_evidence=evidence,
        root_predictions=()
        if predicted is None
        else tuple(zip(predicted.tolist(), true_p.tolist(), strict=True)),
    )


def _grow_trees(
    workload: Workload,
    strategy: Strategy,
    pool: Sequence[Prompt],
    counts: IntArray,
    predicted: FloatArray | None,
    history: dict[str, PromptRecord],
    config: StepConfig,
    rng: np.random.Generator,
) -> tuple[Forest, Ledger, list[int]]:
    """The step's trees: `counts` bare rollouts per pool prompt (Stage 1's), then the strategy's Stage 2
    when it branches (a sharing policy's reserve reads the root `predicted`); with what they spent and
    the pool indices given bare rollouts."""
    ledger = Ledger(config.turn_budget if config.unit is BudgetUnit.turns else None)
    chosen = np.flatnonzero(counts).tolist()
    forest = Forest(
        [pool[index] for index in chosen],
        [int(counts[index]) for index in chosen],
        strategy.rules,
        config.max_branch_depth,
    )
    _run_bare(workload, forest, ledger, rng)
    if strategy.branches:
        # What a shared reserve expects of each tree (a policy that shares reads Ṽ at the roots).
        mixed_chance = (
            bare_mixed_chance(predicted[chosen], counts[chosen])
            if strategy.rules.sharing is not None and predicted is not None
            else None
        )
        branch(
            workload,
            strategy.rules,
            strategy.estimator,
            forest,
            history,
            ledger,
            rng,
            mixed_chance,
            expansion=config.expansion,
            rounds=config.rounds,
        )
    return forest, ledger, chosen


def _remember_step(
    workload: Workload,
    estimator: Estimator,
    forest: Forest,
    history: dict[str, PromptRecord],
    started: npt.NDArray[np.bool_],
    mixed: npt.NDArray[np.bool_],
    *,
    learn: bool,
) -> None:
    """Show the step's trees to an estimator that learns from them, then add each started tree's bare
    outcomes to its prompt's record in `history` (and, when `learn`, let the workload learn from the
    group)."""
    observe = getattr(estimator, "observe", None)
    if observe is not None:
        observe(forest.finished_trees(history))
    for tree in np.flatnonzero(started).tolist():
        prompt_id = forest.prompts[tree].prompt_id
        record = history.setdefault(prompt_id, PromptRecord())
        record.successes += forest.bare_successes[tree]
        record.trials += forest.bare_trials[tree]
        record.zero_variance_streak = 0 if mixed[tree] else record.zero_variance_streak + 1
        if learn:
            workload.learn(prompt_id, bool(mixed[tree]))


def run_strategy(
    make_workload: Callable[[int], Workload],
    seed: int,
    strategy: Strategy,
    config: StepConfig,
    *,
    steps: int,
    pool_size: int,
    learn: bool = True,
    on_step: Callable[[int, StepResult], None] | None = None,
) -> list[StepResult]:
    """`steps` training steps of one strategy on a fresh workload `make_workload(seed)`. Pools are the
    workload's epochs (`epoch_pool`), which depend only on (seed, step): every strategy sees the same."""
    workload = make_workload(seed)
    history: dict[str, PromptRecord] = {}
    freshness = FreshnessEstimate()
    results = []
    for step in range(steps):
        pool = workload.epoch_pool(step, pool_size)
        rng = np.random.default_rng([seed, step, 1])
        result = run_step(
            workload, strategy, pool, history, config, rng, learn=learn, freshness=freshness.value
        )
        freshness = freshness.add(*result.freshness_evidence)
        results.append(result)
        if on_step is not None:
            on_step(step, result)
    return results


def _queries(
    prompts: Sequence[Prompt], states: Sequence[RolloutState], history: dict[str, PromptRecord]
) -> list[Query]:
    """One query per (prompt, state) with the prompt's recorded outcomes."""
    records = [history.get(prompt.prompt_id, PromptRecord()) for prompt in prompts]
    return [
        Query(prompt, state, record.successes, record.trials)
        for prompt, state, record in zip(prompts, states, records, strict=True)
    ]


def _root_budget(strategy: Strategy, config: StepConfig) -> int:
    return config.bare_rollouts if strategy.branches else config.total_rollouts


def _stage1_counts(v: FloatArray, budget: int, config: StepConfig, freshness: float = 0.0) -> IntArray:
    """TRACE Stage 1 on `v` (the joint objective when `freshness` > 0); on the true probabilities with
    the paper's objective, the best Σ V_root a bare budget can buy."""
    return allocate_roots(
        v,
        budget,
        min_rollouts=config.min_rollouts,
        max_rollouts=config.max_rollouts,
        max_prompts=config.max_prompts,
        expansion=config.expansion,
        freshness=freshness,
    ).counts


def _freshness_used(strategy: Strategy, freshness: float) -> float:
    """The ρ a strategy's Stage 1 is valued (and the joint objective allocates) at: the learned one for a
    strategy that branches under a rule that reads it (its continuations add the contrast the joint
    objective counts); else 0 (the paper's objective)."""
    joint = strategy.branches and Need.FRESHNESS in strategy.rules.roots.needs
    return freshness if joint else 0.0


def _root_counts(
    workload: Workload,
    strategy: Strategy,
    pool: Sequence[Prompt],
    history: dict[str, PromptRecord],
    config: StepConfig,
    rng: np.random.Generator,
    freshness: float,
) -> tuple[IntArray, FloatArray | None]:
    """Bare rollouts per pool prompt by the strategy's Stage 1 rule, and the estimator's predictions at
    the roots when the rule reads them; `freshness` is the ρ it allocates with (`_freshness_used`)."""
    rule = strategy.rules.roots
    budget = _root_budget(strategy, config)
    predicted = concentration = None
    if Need.ROOT_PREDICTIONS in rule.needs:
        roots = _queries(pool, [workload.start(prompt.prompt_id) for prompt in pool], history)
        if strategy.belief is RootBelief.point:
            predicted = estimate(strategy.estimator, roots)
        else:
            predicted, concentration = _estimate_belief(strategy.estimator, roots)
    records = [history.get(prompt.prompt_id, PromptRecord()) for prompt in pool]
    valued = predicted
    if strategy.belief is RootBelief.thompson and predicted is not None and concentration is not None:
        # Explore where there is no evidence yet: a prompt with earlier rollouts keeps its posterior mean.
        unseen = np.array([record.trials == 0 for record in records], dtype=bool)
        valued = _thompson_draw(predicted, np.where(unseen, concentration, np.inf), rng)
    inputs = RootInputs(
        n_prompts=len(pool),
        budget=budget,
        min_rollouts=config.min_rollouts,
        max_rollouts=config.max_rollouts,
        # Groups of n: the same count over ⌊budget / n⌋ prompts; when fewer prompts are kept the rest of
        # the budget is dealt over them, so that every rule spends the same budget.
        max_prompts=max(budget // config.group_size, 1) if rule.equal_groups else config.max_prompts,
        expansion=config.expansion if strategy.branches else 0.0,
        predicted=valued,
        freshness=freshness,
        zero_variance_streak=np.array([record.zero_variance_streak for record in records], dtype=np.int64),
        rng=rng,
    )
    return rule.counts(inputs), predicted


def _run_bare(workload: Workload, forest: Forest, ledger: Ledger, rng: np.random.Generator) -> None:
    """Run each tree's planned bare rollouts. Counting turns, whole groups are admitted in pool order
    while their worst case (count · max_turns) fits the turns left, round after round; a group that never
    fits is never started."""
    pending = list(range(len(forest.prompts)))
    while pending:
        if ledger.turn_budget is None:
            admitted, pending = pending, []
        else:
            admitted, room = [], ledger.turns_left
            for tree in pending:
                worst = forest.planned[tree] * workload.max_turns
                if worst > room:
                    break
                admitted.append(tree)
                room -= worst
            if not admitted:
                return
            pending = pending[len(admitted) :]
        owners = [tree for tree in admitted for _ in range(forest.planned[tree])]
        starts = [workload.start(forest.prompts[tree].prompt_id) for tree in owners]
        trajectories = workload.run(starts, rng)
        ledger.charge(trajectories, continuation=False)
        for tree, trajectory in zip(owners, trajectories, strict=True):
            forest.add(tree, ROOT, trajectory, bare=True)


def _estimate_belief(estimator: Estimator, queries: Sequence[Query]) -> tuple[FloatArray, FloatArray]:
    """Ṽ and the Beta belief's concentration at each query, from a `PredictiveEstimator`."""
    if not isinstance(estimator, PredictiveEstimator):
        raise ValueError("a Beta belief needs an estimator with predictive() (a PredictiveEstimator)")
    mean, concentration = (np.asarray(values, dtype=np.float64) for values in estimator.predictive(queries))
    check_estimates(mean, len(queries))
    if concentration.shape != mean.shape or not np.all(concentration > 0.0):
        raise ValueError("the estimator's concentrations must be > 0, one per query")
    return mean, concentration


def _thompson_draw(mean: FloatArray, concentration: FloatArray, rng: np.random.Generator) -> FloatArray:
    """One draw of each prompt's success from Beta(κṼ, κ(1 − Ṽ)); a certain Ṽ (0, 1, κ = ∞) is kept."""
    spread = (mean > 0.0) & (mean < 1.0) & np.isfinite(concentration)
    draw = mean.copy()
    draw[spread] = rng.beta(
        concentration[spread] * mean[spread], concentration[spread] * (1.0 - mean[spread])
    )
    return draw
