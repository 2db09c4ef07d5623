"""The benchmark harness keeps its books on any workload family: equal budgets, never exceeded, in
rollouts and in turns."""

import functools
import math
from collections.abc import Sequence

import numpy as np
import pytest

import bench.harness as harness
from bench.branching import shared_draws
from bench.estimators import FinishedTree, Query, TruthAt, oracle_estimator, posterior_estimator
from bench.forest import Forest, Ledger, PromptRecord
from bench.harness import (
    BudgetUnit,
    StepConfig,
    Strategy,
    default_strategies,
    mean_rollout_turns,
    run_step,
    run_strategy,
)
from trace_lab.sim import FAMILIES, Prompt, RolloutState, VocabularyConfig, Workload, make_workload
from trace_proto import Policy
from trace_service.allocation import POLICIES, is_mixed

# Small enough for a fast file, large enough that every strategy has choices to make.
make_react = functools.partial(
    FAMILIES["react"], prompts=192, vocabulary=VocabularyConfig(distractor_words=400)
)
POOL = 64
BARE = 128
STRATEGIES = default_strategies()
BY_NAME = {strategy.name: strategy for strategy in STRATEGIES}


def fresh_pool(seed: int = 0) -> tuple[Workload, list[Prompt]]:
    workload = make_react(seed)
    return workload, workload.epoch_pool(0, POOL)


def turn_budget(config: StepConfig) -> StepConfig:
    return config.counted_in(BudgetUnit.turns, mean_rollout_turns(make_react(0)))


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda strategy: strategy.name)
def test_rollout_budget_is_equal_and_never_exceeded(strategy: Strategy) -> None:
    config = StepConfig(bare_rollouts=BARE, expansion=2.0)
    workload, pool = fresh_pool()
    result = run_step(workload, strategy, pool, {}, config, np.random.default_rng(1))
    assert result.rollouts <= config.total_rollouts
    if not strategy.branches:
        assert result.continuations == 0
        assert result.mixed_forks == 0
    else:
        assert result.rollouts - result.continuations <= BARE
        assert result.continuations <= math.floor(BARE * config.expansion)
    if strategy.name in ("uniform", "treepo", "trace_prefix", "oracle", "trace"):
        # These spend the whole budget: uniform roots fill it in groups of n, Stage 1 has positive value.
        assert result.rollouts == config.total_rollouts
    assert result.active + result.skipped == POOL
    assert result.mixed <= result.active


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda strategy: strategy.name)
def test_turn_budget_is_never_exceeded_and_mostly_spent(strategy: Strategy) -> None:
    config = turn_budget(StepConfig(bare_rollouts=BARE, expansion=2.0))
    workload, pool = fresh_pool()
    result = run_step(workload, strategy, pool, {}, config, np.random.default_rng(1))
    assert result.turns <= config.turn_budget
    if strategy.branches:
        # Continuations are admitted while any fits, so little of the budget is left over.
        assert result.turns >= 0.97 * config.turn_budget


def test_deep_continuations_are_cheaper_in_turns() -> None:
    """Counting turns, a strategy that branches starts more rollouts than R: continuations from deep
    prefixes cost less than a whole rollout."""
    trace = BY_NAME["oracle"]
    config = turn_budget(StepConfig(bare_rollouts=BARE, expansion=2.0))
    workload, pool = fresh_pool()
    result = run_step(workload, trace, pool, {}, config, np.random.default_rng(1))
    assert result.rollouts > config.total_rollouts


def test_oracle_finds_more_contrast_than_blind_rules() -> None:
    config = StepConfig(bare_rollouts=BARE, expansion=2.0)
    runs = {
        name: run_strategy(make_react, 3, BY_NAME[name], config, steps=3, pool_size=POOL)
        for name in ("uniform", "treepo", "oracle")
    }
    mixed = {name: sum(r.mixed for r in results) for name, results in runs.items()}
    forks = {name: sum(r.mixed_forks for r in results) for name, results in runs.items()}
    assert mixed["oracle"] > 1.2 * mixed["uniform"]
    assert forks["oracle"] > 2 * forks["treepo"]


def test_runs_are_reproducible() -> None:
    config = StepConfig(bare_rollouts=BARE, expansion=2.0)
    trace = BY_NAME["trace"]
    first = run_strategy(make_react, 5, trace, config, steps=2, pool_size=POOL)
    assert first == run_strategy(make_react, 5, trace, config, steps=2, pool_size=POOL)


def test_dapo_keeps_only_mixed_groups() -> None:
    config = StepConfig(bare_rollouts=BARE, expansion=2.0)
    for result in run_strategy(make_react, 1, BY_NAME["dapo"], config, steps=2, pool_size=POOL):
        assert result.kept == result.mixed
        assert result.active > result.mixed


def test_learning_moves_only_the_mixed_prompts() -> None:
    config = StepConfig(bare_rollouts=BARE, expansion=2.0)
    uniform = BY_NAME["uniform"]
    workload = make_react(2)
    ids = [prompt.prompt_id for prompt in workload.prompts]
    before = workload.true_success_many(ids)
    pool = workload.epoch_pool(0, POOL)
    history: dict[str, PromptRecord] = {}
    result = run_step(workload, uniform, pool, history, config, np.random.default_rng(1))
    moved = {ids[index] for index in np.flatnonzero(workload.true_success_many(ids) != before)}
    mixed = {prompt_id for prompt_id, record in history.items() if record.zero_variance_streak == 0}
    assert moved == mixed
    assert len(moved) == result.mixed


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("unit", list(BudgetUnit))
def test_every_family_keeps_the_books(family: str, unit: BudgetUnit) -> None:
    """The harness needs only the `Workload` interface: every family, both budget units."""
    workload = make_workload(family, 0, prompts=256)
    config = StepConfig(bare_rollouts=BARE, expansion=1.0, group_size=4)
    config = config.counted_in(unit, mean_rollout_turns(workload))
    pool = workload.epoch_pool(0, POOL)
    for name in ("uniform", "trace", "oracle"):
        result = run_step(workload, BY_NAME[name], pool, {}, config, np.random.default_rng(1), learn=False)
        assert result.rollouts <= config.total_rollouts or unit is BudgetUnit.turns
        assert unit is BudgetUnit.rollouts or result.turns <= config.turn_budget
        assert result.active + result.skipped == POOL


class RecordingEstimator:
    """Answers 0.5 everywhere and keeps every query it was asked."""

    def __init__(self) -> None:
        self.calls: list[list[Query]] = []

    def __call__(self, queries: Sequence[Query]) -> np.ndarray:
        self.calls.append(list(queries))
        return np.full(len(queries), 0.5)


def test_estimator_sees_roots_then_prefixes_with_current_outcomes() -> None:
    estimator = RecordingEstimator()
    strategy = Strategy("probe", Policy.TRACE, estimator)
    config = StepConfig(bare_rollouts=BARE, expansion=1.0)
    workload, pool = fresh_pool()
    history: dict[str, PromptRecord] = {}
    run_step(workload, strategy, pool, history, config, np.random.default_rng(1))
    roots, prefixes = estimator.calls
    assert all(query.state.turns == 0 and query.trials == 0 for query in roots)
    assert all(query.state.turns >= 1 and not query.state.done for query in prefixes)
    # At Stage 2 a prompt's outcomes already include this step's scored bare rollouts.
    for query in prefixes:
        record = history[query.prompt.prompt_id]
        assert (query.successes, query.trials) == (record.successes, record.trials)
        assert query.trials >= config.min_rollouts


@pytest.mark.parametrize("depth", [1, 2])
def test_the_depth_limit_holds_every_prefix_asked_about_and_spends_the_budget(depth: int) -> None:
    estimator = RecordingEstimator()
    strategy = Strategy("probe", Policy.TRACE, estimator)
    config = StepConfig(bare_rollouts=BARE, expansion=1.0, max_branch_depth=depth)
    workload, pool = fresh_pool()
    result = run_step(workload, strategy, pool, {}, config, np.random.default_rng(1))
    _, prefixes = estimator.calls
    assert {query.state.turns for query in prefixes} == set(range(1, depth + 1))
    assert result.rollouts == config.total_rollouts


@pytest.mark.parametrize("depth", [1, 2, None])
def test_the_step_counts_where_continuations_branch_and_the_turns_they_generate(depth: int | None) -> None:
    config = StepConfig(bare_rollouts=BARE, expansion=1.0, max_branch_depth=depth)
    workload, pool = fresh_pool()
    result = run_step(workload, BY_NAME["oracle"], pool, {}, config, np.random.default_rng(1))
    assert result.continuations == BARE
    mean_depth = result.branch_depth / result.continuations
    mean_turns = result.continuation_turns / result.continuations
    if depth == 1:
        assert mean_depth == 1.0
    else:
        assert 1.0 <= mean_depth <= (depth or workload.max_turns)
    # Every continuation generates at least one turn and stops by max_turns.
    assert 1.0 <= mean_turns <= workload.max_turns - mean_depth
    assert result.continuation_turns < result.turns


def test_a_wrongly_shaped_estimate_is_an_error() -> None:
    def broken(queries: Sequence[Query]) -> np.ndarray:
        return np.full(len(queries) + 1, 0.5)

    strategy = Strategy("broken", Policy.TRACE, broken)
    config = StepConfig(bare_rollouts=BARE, expansion=1.0)
    workload, pool = fresh_pool()
    with pytest.raises(ValueError, match="returned shape"):
        run_step(workload, strategy, pool, {}, config, np.random.default_rng(1))


@pytest.mark.parametrize(("successes", "trials"), [(0, 0), (3, 4), (0, 9), (7, 7)])
def test_posterior_and_oracle_estimators(successes: int, trials: int) -> None:
    prompt = Prompt("any", "text")
    state = RolloutState("any", p=0.3)
    (estimate,) = posterior_estimator([Query(prompt, state, successes, trials)])
    assert estimate == pytest.approx((1 + successes) / (2 + trials))
    assert oracle_estimator([Query(prompt, state, successes, trials)])[0] == 0.3


class _Recording:
    """An estimator that answers 0.5 everywhere and records the trees it is shown."""

    def __init__(self) -> None:
        self.shown: list[FinishedTree] = []

    def __call__(self, queries: Sequence[Query]) -> np.ndarray:
        return np.full(len(queries), 0.5)

    def observe(self, trees: Sequence[FinishedTree]) -> None:
        self.shown.extend(trees)


@pytest.mark.parametrize("roots", [True, False])
def test_truth_at_one_stage_and_the_estimator_at_the_other(roots: bool) -> None:
    prompt = Prompt("any", "text")
    root = RolloutState("any", p=0.9)
    workload, pool = fresh_pool()
    state = workload.start(pool[0].prompt_id)
    prefix = workload.run([state], np.random.default_rng(0))[0][0]
    assert prefix.turns == 1
    estimator = TruthAt(_Recording(), roots=roots)
    values = estimator([Query(prompt, root, 0, 0), Query(pool[0], prefix, 0, 0)])
    true_root, true_prefix = 0.9, prefix.p
    assert values.tolist() == ([true_root, 0.5] if roots else [0.5, true_prefix])


def test_truth_at_still_trains_the_estimator_on_every_tree() -> None:
    recording = _Recording()
    strategy = Strategy("trace_true_roots", Policy.TRACE, TruthAt(recording, roots=True))
    workload, pool = fresh_pool()
    result = run_step(
        workload, strategy, pool, {}, StepConfig(bare_rollouts=BARE, expansion=1.0), np.random.default_rng(1)
    )
    assert len(recording.shown) == result.active > 0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"bare_rollouts": -1}, "bare_rollouts"),
        ({"expansion": -0.5}, "expansion"),
        ({"expansion": math.inf}, "expansion"),
        ({"group_size": 0}, "group_size"),
        ({"rounds": 0}, "rounds"),
        ({"unit": BudgetUnit.turns}, "turn budget"),
        ({"max_branch_depth": 0}, "max_branch_depth"),
    ],
)
def test_step_config_rejects(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StepConfig(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", [Policy.TRACE_SHARED, Policy.TRACE_JOINT], ids=str)
def test_shared_draws_leave_mixed_trees_their_kept_part_and_never_exceed_the_shares(policy: Policy) -> None:
    """Sharing in the harness: a tree whose bare group is mixed draws only the part it keeps (nothing
    under `trace_shared`, half under `trace_joint`), every other tree with a prefix at least its own share,
    and the draws never exceed the step's continuations."""
    sharing = POLICIES[policy].sharing
    assert sharing is not None
    workload, pool = fresh_pool()
    forest = Forest(pool[:16], [4] * 16, POLICIES[policy])
    harness._run_bare(workload, forest, Ledger(None), np.random.default_rng(0))
    shares = [4] * 16
    draws = shared_draws(forest, shares, np.full(16, 0.5), sharing)
    successes, visits, _ = forest.outcomes()
    mixed = is_mixed(successes, visits)
    assert mixed.any() and not mixed.all()
    assert sum(draws) <= sum(shares)
    kept = sharing.split(4)[0]
    assert kept == (0 if policy is Policy.TRACE_SHARED else 2)
    assert sum(draws) > sum(share for share, agrees in zip(shares, ~mixed, strict=True) if agrees)
    for tree, drawn in enumerate(draws[:-1]):  # (the last tree takes what is left, mixed or not)
        assert drawn == kept if mixed[tree] else drawn >= shares[tree]


def test_under_trace_joint_agreeing_trees_branch_from_first_turns_and_mixed_trees_anywhere() -> None:
    """`trace_joint`'s sharing: the candidates of a tree whose bare rollouts agree are its first turns; a tree
    whose bare rollouts are mixed keeps every depth the request allows."""
    workload, pool = fresh_pool()
    forest = Forest(pool[:32], [4] * 32, POLICIES[Policy.TRACE_JOINT])
    harness._run_bare(workload, forest, Ledger(None), np.random.default_rng(0))
    successes, visits, _ = forest.outcomes()
    mixed = is_mixed(successes, visits)
    depths = [{forest.states[node].turns for node in found.nodes.tolist()} for found in forest.candidates()]
    assert all(depth <= {1} for depth, is_mixed_tree in zip(depths, mixed, strict=True) if not is_mixed_tree)
    assert any(
        max(depth, default=0) > 1 for depth, is_mixed_tree in zip(depths, mixed, strict=True) if is_mixed_tree
    )
    unlimited = Forest(pool[:32], [4] * 32, POLICIES[Policy.TRACE_PAPER])
    harness._run_bare(workload, unlimited, Ledger(None), np.random.default_rng(0))
    deepest = [
        max((unlimited.states[n].turns for n in found.nodes.tolist()), default=0)
        for found in unlimited.candidates()
    ]
    assert max(deepest) > 1
