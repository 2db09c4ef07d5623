"""A made-up workload for predictor tests: randomly generated words only, so nothing here knows the
vocabulary of the project's simulator. Imported by the tests of this folder (a unique module name)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from trace_service.predictor import HistoryFeaturizer, PredictorConfig, Query, TrainingExample

MARKER_RELIABILITY = 0.8  # probability that a first turn shows a marker of its rollout's real outcome


TINY_CONFIG = PredictorConfig(
    num_buckets=1024, embed_dim=8, hidden_dim=16, batch_size=64, device="cpu", learning_rate=1e-2
)


def tiny_config(**overrides: Any) -> PredictorConfig:
    """A predictor small enough to train in well under a second."""
    return dataclasses.replace(TINY_CONFIG, **overrides)


def random_words(rng: np.random.Generator, count: int) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return ["".join(rng.choice(letters, size=int(rng.integers(3, 9)))) for _ in range(count)]


@dataclass(frozen=True)
class SyntheticNode:
    query: Query
    target: float
    weight: float
    true_probability: float  # exact P(success | this history) under the generator
    shows_success: bool  # the latest turn holds a success marker


@dataclass(frozen=True)
class SyntheticTask:
    """Prompts with a hidden success rate p ~ U(0.1, 0.9); each rollout is prompt → first turn → final
    turn (the leaf). The first turn contains a word from ``success_markers`` with probability 0.8 when
    the rollout will succeed (otherwise one from ``failure_markers``), and symmetrically for failures;
    all other words are noise."""

    noise: list[str]
    success_markers: list[str]
    failure_markers: list[str]

    @classmethod
    def create(cls, seed: int) -> SyntheticTask:
        words = random_words(np.random.default_rng(seed), 230)
        return cls(noise=words[:200], success_markers=words[200:215], failure_markers=words[215:230])

    def text(self, rng: np.random.Generator, length: int, marker: str | None = None) -> str:
        words = list(rng.choice(self.noise, size=length))
        if marker is not None:
            words.insert(int(rng.integers(0, length + 1)), marker)
        return " ".join(words)

    def tree(
        self, featurizer: HistoryFeaturizer, rng: np.random.Generator, prompt_id: str, rollouts: int = 4
    ) -> list[SyntheticNode]:
        """All nodes of one completed tree with their recursive targets and visit weights."""
        p = float(rng.uniform(0.1, 0.9))
        root = featurizer.encode_prompt(prompt_id, self.text(rng, 8))
        nodes: list[SyntheticNode] = []
        outcomes = []
        for _ in range(rollouts):
            success = bool(rng.random() < p)
            truthful = bool(rng.random() < MARKER_RELIABILITY)
            shows_success = success == truthful
            markers = self.success_markers if shows_success else self.failure_markers
            first = featurizer.extend(root, self.text(rng, 6, str(rng.choice(markers))))
            leaf = featurizer.extend(first, self.text(rng, 6))
            likelihood = MARKER_RELIABILITY if shows_success else 1 - MARKER_RELIABILITY
            posterior = p * likelihood / (p * likelihood + (1 - p) * (1 - likelihood))
            reward = float(success)
            nodes.append(SyntheticNode(Query(first), reward, 1.0, posterior, shows_success))
            nodes.append(SyntheticNode(Query(leaf), reward, 1.0, reward, False))
            outcomes.append(reward)
        nodes.append(SyntheticNode(Query(root), float(np.mean(outcomes)), float(rollouts), p, False))
        return nodes

    @staticmethod
    def examples(nodes: list[SyntheticNode]) -> list[TrainingExample]:
        """The nodes as training examples (target V̂, weight = visits)."""
        return [
            TrainingExample(node.query.history, node.target, node.weight, node.query.outcomes)
            for node in nodes
        ]
