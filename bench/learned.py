"""The shared success predictor as a benchmark estimator: it predicts from the histories' text and
learns online from the trees of its own strategy, exactly as the service's predictor does."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from bench.estimators import FinishedTree, Query
from trace_lab.sim import Prompt, RolloutState
from trace_service.allocation.tree import tree_targets
from trace_service.predictor import (
    EncodedHistory,
    OutcomeCounts,
    Predictive,
    PredictorConfig,
    RootGroup,
    SuccessPredictor,
    TrainingExample,
)
from trace_service.predictor import Query as PredictorQuery


class LearnedEstimator:
    """Ṽ from a :class:`SuccessPredictor` trained after every step on that step's finished trees."""

    def __init__(self, config: PredictorConfig | None = None, train_steps: int = 60) -> None:
        # One torch thread, as the service runs on CPUs: with more, the small passes wait on each other
        # (16 times slower on two busy cores).
        torch.set_num_threads(1)
        self.predictor = SuccessPredictor(config or PredictorConfig(device="cpu"))
        self.train_steps = train_steps
        # Encodings by the identity of a history's last turn: the simulator shares prefix turns between a
        # rollout and its continuations, so each turn is encoded once per step (the featurizer is
        # incremental). Cleared after every step.
        self._encoded: dict[int, tuple[object, EncodedHistory]] = {}

    def _encode(self, prompt: Prompt, state: RolloutState) -> EncodedHistory:
        featurizer = self.predictor.featurizer
        turns = state.history
        encoded, start = None, 0
        for depth in range(len(turns), 0, -1):
            cached = self._encoded.get(id(turns[depth - 1]))
            if cached is not None and cached[0] is turns[depth - 1]:
                encoded, start = cached[1], depth
                break
        if encoded is None:
            encoded = featurizer.encode_prompt(prompt.prompt_id, prompt.text, prompt.features)
        for turn in turns[start:]:
            encoded = featurizer.extend(encoded, turn.text, turn.features)
            self._encoded[id(turn)] = (turn, encoded)
        return encoded

    def __call__(self, queries: Sequence[Query]) -> npt.NDArray[np.float64]:
        return self.predictive(queries).mean

    def predictive(self, queries: Sequence[Query]) -> Predictive:
        """Ṽ and each prompt's posterior concentration (``SuccessPredictor.predictive``)."""
        batch = [
            PredictorQuery(self._encode(q.prompt, q.state), OutcomeCounts(q.successes, q.trials))
            for q in queries
        ]
        return self.predictor.predictive(batch)

    def observe(self, trees: Sequence[FinishedTree]) -> None:
        for tree in trees:
            targets = tree_targets(tree.parent, tree.reward)
            outcomes = OutcomeCounts(tree.successes, tree.trials)
            examples = [
                TrainingExample(
                    self._encode(tree.prompt, state),
                    float(targets.value[i]),
                    float(targets.visits[i]),
                    outcomes,
                )
                for i, state in enumerate(tree.states)
                if targets.visits[i] > 0
            ]
            root = self.predictor.featurizer.encode_prompt(
                tree.prompt.prompt_id, tree.prompt.text, tree.prompt.features
            )
            if targets.root_visits:
                examples.append(
                    TrainingExample(root, targets.root_value, float(targets.root_visits), outcomes)
                )
            group = (
                RootGroup(root, tree.bare_successes, tree.bare_trials, outcomes) if tree.bare_trials else None
            )
            if examples:
                self.predictor.add_examples(examples, group)
        self.predictor.train_round(self.train_steps)
        self._encoded.clear()
