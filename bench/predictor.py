"""Success predictor on the simulated workload: quality on unseen prompts, and speed.

    python bench/predictor.py [--vocabulary-seeds 0 7] [--train-seeds 0 1 2 3] [--eval-seeds 100 101]

For each vocabulary seed (a different seed spells every word differently, so the predictor can only
learn what the text means from its own training data), the predictor is trained online on trees from
the workloads of ``--train-seeds`` (different prompts per seed): step after step, a pool of prompts gets
``--rollouts`` bare rollouts each plus ``--continuations`` continuations from random prefixes, the
completed trees are added, and one training round follows. It is then evaluated on trees from the
workloads of ``--eval-seeds`` (prompts it never saw), where the simulator knows the exact conditional
success p at every prefix. Figures, next to the constant 0.5 and the prompt-history baseline (each
prompt's Beta(1, 1) posterior mean over its bare rollouts in earlier steps):

- Spearman ρ between predicted and true p, overall and by depth (depth 0 = roots);
- ECE against the true p (10 equal-width bins of the prediction; the target is p, not a 0/1 outcome);
- MSE against the true p, and the Brier score against the observed V̂ weighted by visits.

Speed: batched inference over 4,096 histories and training throughput (examples/s), on CPU.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from unittest import mock

import numpy as np
import numpy.typing as npt
import torch

from trace_lab.sim import RolloutState, SimConfig, SimWorkload, VocabularyConfig
from trace_service.allocation.tree import ROOT, tree_targets
from trace_service.predictor import (
    EncodedHistory,
    HistoryFeaturizer,
    OutcomeCounts,
    PredictorConfig,
    Query,
    SuccessPredictor,
    TrainingExample,
    training,
)
from trace_service.predictor.diagnostics import brier_score, expected_calibration_error, spearman

FloatArray = npt.NDArray[np.float64]


@dataclass
class SimTree:
    """One completed tree of the simulator, encoded for the predictor.

    Index 0 is the prompt (depth 0); turn nodes follow, parents before children. ``true_p`` is the
    simulator's exact conditional success at each node; ``value`` and ``visits`` are V̂ and n.
    """

    prompt_id: str
    outcomes: OutcomeCounts  # the prompt's counts from earlier steps (the predictor's input)
    encoded: list[EncodedHistory]
    depth: npt.NDArray[np.int64]
    true_p: FloatArray
    value: FloatArray
    visits: FloatArray
    is_leaf: npt.NDArray[np.bool_]
    bare_rewards: list[float]


@dataclass
class PromptHistory:
    """Bare-rollout outcomes per prompt across steps (what the service's store keeps)."""

    counts: dict[str, tuple[int, int]] = field(default_factory=dict)

    def outcomes(self, prompt_id: str) -> OutcomeCounts:
        successes, trials = self.counts.get(prompt_id, (0, 0))
        return OutcomeCounts(successes, trials)

    def record(self, prompt_id: str, rewards: Sequence[float]) -> None:
        successes, trials = self.counts.get(prompt_id, (0, 0))
        self.counts[prompt_id] = (successes + int(sum(rewards)), trials + len(rewards))


def grow_tree(
    workload: SimWorkload,
    prompt_id: str,
    rollouts: int,
    continuations: int,
    featurizer: HistoryFeaturizer,
    outcomes: OutcomeCounts,
    rng: np.random.Generator,
) -> SimTree:
    """Bare rollouts, then continuations from prefixes chosen uniformly among the non-leaf turn nodes."""
    states: list[RolloutState] = []
    parents: list[int] = []

    def attach(trajectory: Sequence[RolloutState], parent: int) -> None:
        for state in trajectory:
            parents.append(parent)
            states.append(state)
            parent = len(states) - 1

    for trajectory in workload.run([workload.start(prompt_id)] * rollouts, rng):
        attach(trajectory, ROOT)
    bare_rewards = [float(states[index].reward or 0.0) for index in range(len(states)) if states[index].done]
    inner = [index for index, state in enumerate(states) if not state.done]
    if inner and continuations:
        chosen = rng.choice(inner, size=continuations, replace=True).tolist()
        for origin, trajectory in zip(
            chosen, workload.run([states[index] for index in chosen], rng), strict=True
        ):
            attach(trajectory, origin)

    reward = np.array([state.reward if state.done else np.nan for state in states], dtype=np.float64)
    targets = tree_targets(np.array(parents), reward)
    prompt = workload.prompt(prompt_id)
    root = featurizer.encode_prompt(prompt_id, prompt.text, prompt.features)
    encoded = [root]
    for state, parent in zip(states, parents, strict=True):
        turn = state.history[-1]
        encoded.append(featurizer.extend(encoded[parent + 1], turn.text, turn.features))
    return SimTree(
        prompt_id=prompt_id,
        outcomes=outcomes,
        encoded=encoded,
        depth=np.concatenate([[0], targets.depth]),
        true_p=np.array([workload.true_success(prompt_id)] + [state.p for state in states]),
        value=np.concatenate([[targets.root_value], targets.value]),
        visits=np.concatenate([[targets.root_visits], targets.visits]).astype(np.float64),
        is_leaf=np.concatenate([[False], ~np.isnan(reward)]),
        bare_rewards=bare_rewards,
    )


def run_steps(
    workload: SimWorkload,
    featurizer: HistoryFeaturizer,
    history: PromptHistory,
    *,
    steps: int,
    pool: int,
    rollouts: int,
    continuations: int,
    rng: np.random.Generator,
    after_step: Callable[[list[SimTree]], None] | None = None,
) -> list[list[SimTree]]:
    """``steps`` training steps on ``workload``: each samples a pool, grows its trees, then records the
    bare outcomes (so a tree's own outcomes never feed its own input)."""
    all_steps: list[list[SimTree]] = []
    for _ in range(steps):
        prompts = workload.sample_pool(pool, rng)
        trees = [
            grow_tree(
                workload,
                prompt.prompt_id,
                rollouts,
                continuations,
                featurizer,
                history.outcomes(prompt.prompt_id),
                rng,
            )
            for prompt in prompts
        ]
        for tree in trees:
            history.record(tree.prompt_id, tree.bare_rewards)
        if after_step is not None:
            after_step(trees)
        all_steps.append(trees)
    return all_steps


def training_examples(tree: SimTree) -> list[TrainingExample]:
    return [
        TrainingExample(
            tree.encoded[index], float(tree.value[index]), float(tree.visits[index]), tree.outcomes
        )
        for index in range(len(tree.encoded))
        if tree.visits[index] > 0
    ]


@dataclass
class Evaluation:
    """Flattened non-leaf nodes of the evaluation trees (roots and prefixes)."""

    queries: list[Query]
    depth: npt.NDArray[np.int64]
    true_p: FloatArray
    value: FloatArray
    visits: FloatArray

    @classmethod
    def of(cls, trees: Sequence[SimTree]) -> Evaluation:
        rows = [
            (tree, index) for tree in trees for index in range(len(tree.encoded)) if not tree.is_leaf[index]
        ]
        return cls(
            queries=[Query(tree.encoded[index], tree.outcomes) for tree, index in rows],
            depth=np.array([tree.depth[index] for tree, index in rows]),
            true_p=np.array([tree.true_p[index] for tree, index in rows]),
            value=np.array([tree.value[index] for tree, index in rows]),
            visits=np.array([tree.visits[index] for tree, index in rows]),
        )

    def score(self, predicted: FloatArray, depths: Sequence[int]) -> dict[str, float | None]:
        prefixes = self.depth >= 1
        figures: dict[str, float | None] = {
            "spearman_prefix": spearman(predicted[prefixes], self.true_p[prefixes]),
            "ece_prefix": expected_calibration_error(predicted[prefixes], self.true_p[prefixes]),
            "mse_prefix": float(np.mean((predicted[prefixes] - self.true_p[prefixes]) ** 2)),
            "brier_prefix": brier_score(predicted[prefixes], self.value[prefixes], self.visits[prefixes]),
        }
        for depth in depths:
            at = self.depth == depth if depth < max(depths) else self.depth >= depth
            figures[f"spearman_d{depth}"] = spearman(predicted[at], self.true_p[at]) if at.sum() > 1 else None
            figures[f"brier_d{depth}"] = brier_score(predicted[at], self.value[at], self.visits[at])
        return figures


def format_figure(value: float | None) -> str:
    return "   —  " if value is None else f"{value:6.3f}"


def print_table(title: str, rows: dict[str, dict[str, float | None]], columns: Sequence[str]) -> None:
    print(f"\n{title}")
    print(f"{'':>22} " + " ".join(f"{column:>{max(8, len(column))}}" for column in columns))
    for name, figures in rows.items():
        cells = " ".join(f"{format_figure(figures[column]):>{max(8, len(column))}}" for column in columns)
        print(f"{name:>22} {cells}")


class StorageArms:
    """``--storage``: the same trees also train a predictor whose weights stay float32 (as before the
    eight-bit checkpoints) and one set down to bytes and loaded back after every step (as an evicted
    job's), beside the default one."""

    def __init__(self, config: PredictorConfig, steps_per_round: int) -> None:
        self.config = config
        self.steps_per_round = steps_per_round
        self.float32 = SuccessPredictor(config)
        self.set_down = SuccessPredictor(config)
        self.set_down_bytes: list[int] = []

    def learn(self, trees: list[SimTree]) -> None:
        for tree in trees:
            self.float32.add_examples(training_examples(tree))
            self.set_down.add_examples(training_examples(tree))
        with mock.patch.object(training, "round_to_checkpoint", return_value=None):
            self.float32.train_round(self.steps_per_round)
        self.set_down.train_round(self.steps_per_round)
        blob = self.set_down.to_bytes(with_training_data=True)
        self.set_down_bytes.append(len(blob))
        self.set_down = SuccessPredictor.from_bytes(blob, self.config)

    def rows(self, evaluation: Evaluation, depths: Sequence[int]) -> dict[str, dict[str, float | None]]:
        return {
            "  float32 (before)": evaluation.score(self.float32.predict(evaluation.queries), depths),
            "  set down each step": evaluation.score(self.set_down.predict(evaluation.queries), depths),
        }

    def sizes(self, predictor: SuccessPredictor) -> str:
        return (
            f"  set-down predictor: {max(self.set_down_bytes) / 1e6:.1f} MB at most "
            f"({self.set_down_bytes[-1] / 1e6:.1f} MB last); "
            f"published weights: {len(predictor.to_bytes()) / 1e6:.1f} MB"
        )


def simulate(
    arguments: argparse.Namespace,
    workload: SimWorkload,
    featurizer: HistoryFeaturizer,
    rng: np.random.Generator,
    after_step: Callable[[list[SimTree]], None] | None = None,
) -> list[list[SimTree]]:
    """``--steps`` steps of ``workload`` as the arguments shape them (:func:`run_steps`)."""
    return run_steps(
        workload,
        featurizer,
        PromptHistory(),
        steps=arguments.steps,
        pool=arguments.pool,
        rollouts=arguments.rollouts,
        continuations=arguments.continuations,
        rng=rng,
        after_step=after_step,
    )


def evaluate_vocabulary(arguments: argparse.Namespace, vocabulary_seed: int) -> SuccessPredictor:
    sim_config = SimConfig(
        prompts=arguments.prompts,
        feature_dim=arguments.feature_dim,
        vocabulary=VocabularyConfig(seed=vocabulary_seed),
    )
    config = PredictorConfig(feature_dim=arguments.feature_dim, device="cpu", seed=arguments.seed)
    predictor = SuccessPredictor(config)
    storage = StorageArms(config, arguments.steps_per_round) if arguments.storage else None
    featurizer = predictor.featurizer
    rng = np.random.default_rng([arguments.seed, vocabulary_seed])
    started = time.perf_counter()
    trained_examples = 0
    training_seconds = 0.0

    def learn(trees: list[SimTree]) -> None:
        nonlocal trained_examples, training_seconds
        for tree in trees:
            predictor.add_examples(training_examples(tree))
        began = time.perf_counter()
        result = predictor.train_round(arguments.steps_per_round)
        training_seconds += time.perf_counter() - began
        trained_examples += result.steps * predictor.config.batch_size
        if storage is not None:
            storage.learn(trees)

    for seed in arguments.train_seeds:
        simulate(arguments, SimWorkload(sim_config, seed=seed), featurizer, rng, learn)
        print(
            f"  vocabulary {vocabulary_seed}, trained on workload seed {seed}: version {predictor.version}, "
            f"{predictor.examples_seen} examples, {time.perf_counter() - started:.0f} s",
            flush=True,
        )

    evaluation_trees: list[SimTree] = []
    for seed in arguments.eval_seeds:
        steps = simulate(arguments, SimWorkload(sim_config, seed=seed), featurizer, rng)
        # Later steps, where recurring prompts have a history for the posterior baseline to use.
        evaluation_trees.extend(tree for trees in steps[arguments.steps // 2 :] for tree in trees)
    evaluation = Evaluation.of(evaluation_trees)
    posterior = np.array([query.outcomes.posterior_mean() for query in evaluation.queries], dtype=np.float64)
    depths = [0, 1, 2, 3, 4, 6]
    rows = {
        "constant 0.5": evaluation.score(np.full(len(evaluation.queries), 0.5), depths),
        "prompt history (Beta)": evaluation.score(posterior, depths),
        f"predictor v{predictor.version}": evaluation.score(predictor.predict(evaluation.queries), depths),
    }
    if storage is not None:
        rows |= storage.rows(evaluation, depths)
        print(storage.sizes(predictor))
    nodes = int((evaluation.depth >= 1).sum())
    print_table(
        f"vocabulary seed {vocabulary_seed}: {len(evaluation_trees)} held-out trees (roots), "
        f"{nodes} prefixes (workload seeds {arguments.eval_seeds})",
        rows,
        ["spearman_prefix", "ece_prefix", "mse_prefix", "brier_prefix"],
    )
    print_table("  by depth (last column: that depth and deeper)", rows, [f"spearman_d{d}" for d in depths])
    print_table("", rows, [f"brier_d{d}" for d in depths])
    print(
        f"  training: {trained_examples} examples in {training_seconds:.1f} s "
        f"= {trained_examples / max(training_seconds, 1e-9):,.0f} examples/s"
    )
    return predictor


def time_inference(predictor: SuccessPredictor, arguments: argparse.Namespace) -> None:
    workload = SimWorkload(
        SimConfig(prompts=256, feature_dim=arguments.feature_dim, vocabulary=VocabularyConfig(seed=0)),
        seed=999,
    )
    rng = np.random.default_rng(0)
    history = PromptHistory()
    queries: list[Query] = []
    while len(queries) < 4096:
        (trees,) = run_steps(
            workload,
            predictor.featurizer,
            history,
            steps=1,
            pool=64,
            rollouts=8,
            continuations=8,
            rng=rng,
        )
        queries.extend(Query(encoded, tree.outcomes) for tree in trees for encoded in tree.encoded)
    queries = queries[:4096]
    predictor.predict(queries)  # warm-up
    runs = []
    for _ in range(5):
        began = time.perf_counter()
        predictor.predict(queries)
        runs.append(time.perf_counter() - began)
    depth = np.mean([query.history.depth for query in queries])
    print(
        f"\ninference: 4,096 histories (mean depth {depth:.1f}) in {np.median(runs) * 1e3:.0f} ms "
        f"(median of 5, {torch.get_num_threads()} threads) = {4096 / np.median(runs):,.0f} histories/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocabulary-seeds", type=int, nargs="+", default=[0, 7])
    parser.add_argument("--train-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-seeds", type=int, nargs="+", default=[100, 101])
    parser.add_argument("--prompts", type=int, default=512, help="prompts per workload seed")
    parser.add_argument("--steps", type=int, default=5, help="training steps per workload seed")
    parser.add_argument("--pool", type=int, default=64, help="prompts per step")
    parser.add_argument("--rollouts", type=int, default=8, help="bare rollouts per prompt")
    parser.add_argument("--continuations", type=int, default=8, help="continuations per tree")
    parser.add_argument("--steps-per-round", type=int, default=100, help="optimiser steps per training step")
    parser.add_argument("--feature-dim", type=int, default=0, help="client feature vectors (0: text only)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--storage",
        action="store_true",
        help="also train a float32 predictor and one set down and loaded back every step, side by side",
    )
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    predictor = None
    for vocabulary_seed in arguments.vocabulary_seeds:
        predictor = evaluate_vocabulary(arguments, vocabulary_seed)
    assert predictor is not None
    time_inference(predictor, arguments)


if __name__ == "__main__":
    main()
