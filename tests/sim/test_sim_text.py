"""Texts have the ReAct shape and carry real but noisy signal about difficulty and progress."""

import itertools

import numpy as np
import pytest

from trace_lab.sim import RolloutState, SimConfig, SimWorkload, Vocabulary


@pytest.fixture(scope="module")
def workload() -> SimWorkload:
    return SimWorkload(SimConfig(prompts=1024), seed=12)


@pytest.fixture(scope="module")
def trajectories(workload: SimWorkload) -> list[tuple[RolloutState, ...]]:
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts[:256] for _ in range(4)]
    return workload.run(starts, np.random.default_rng(0))


def word_classes(vocabulary: Vocabulary) -> dict[str, tuple[str, int]]:
    """Each word's class and its index within the class."""
    bounds = sorted(vocabulary.start.items(), key=lambda item: item[1])
    ends = [start for _, start in bounds[1:]] + [len(vocabulary.words)]
    return {
        vocabulary.words[index]: (name, index - start)
        for (name, start), end in zip(bounds, ends, strict=True)
        for index in range(start, end)
    }


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(y)))[0, 1])


def graded_score(text: str, classes: dict[str, tuple[str, int]], word_class: str, per_level: int) -> float:
    """Mean level of the text's words of one graded class (NaN when it has none)."""
    levels = [
        index // per_level for name, index in map(classes.__getitem__, text.split()) if name == word_class
    ]
    return float(np.mean(levels)) if levels else float("nan")


def test_turns_have_the_react_shape(
    workload: SimWorkload, trajectories: list[tuple[RolloutState, ...]]
) -> None:
    classes = word_classes(workload.vocabulary)
    for trajectory in trajectories[:50]:
        for state in trajectory:
            turn = state.last_turn
            assert turn is not None
            thought, action, observation = turn.text.split("\n")
            assert thought.startswith("Thought: ")
            assert observation.startswith("Observation: ")
            assert action.startswith("Action: ")
            assert action.endswith("]")
            tool = action.removeprefix("Action: ").split("[")[0]
            assert classes[tool][0] == ("finish" if turn.done else "tool")


def test_prompt_lengths_vary_within_bounds(workload: SimWorkload) -> None:
    lengths = np.array([len(prompt.text.split()) for prompt in workload.prompts])
    low, high = workload.config.text.prompt_words
    assert lengths.min() >= low
    assert lengths.max() <= high
    assert lengths.std() > (high - low) / 6


def test_prompt_text_tells_difficulty_but_not_exactly(workload: SimWorkload) -> None:
    classes = word_classes(workload.vocabulary)
    per_level = workload.config.vocabulary.words_per_level
    scores = np.array([graded_score(p.text, classes, "difficulty", per_level) for p in workload.prompts])
    p0 = workload.true_success_many([prompt.prompt_id for prompt in workload.prompts])
    known = ~np.isnan(scores)
    correlation = spearman(scores[known], p0[known])
    assert 0.5 < correlation < 0.95


def test_observations_tell_the_direction_with_the_configured_noise(
    workload: SimWorkload, trajectories: list[tuple[RolloutState, ...]]
) -> None:
    classes = word_classes(workload.vocabulary)
    shown = {True: [0, 0], False: [0, 0]}  # went up -> [progress words, setback words]
    for trajectory in trajectories:
        for before, after in itertools.pairwise(trajectory):
            observation = after.history[-1].text.split("\n")[2].removeprefix("Observation: ")
            names = [classes[word][0] for word in observation.split()]
            shown[after.p > before.p][0] += names.count("progress")
            shown[after.p > before.p][1] += names.count("setback")
    flip = workload.config.text.observation_flip
    for went_up, (progress, setback) in shown.items():
        share = progress / (progress + setback)
        expected = 1 - flip if went_up else flip
        assert abs(share - expected) <= 5 * np.sqrt(expected * (1 - expected) / (progress + setback))


def test_thoughts_tell_the_current_confidence(
    workload: SimWorkload, trajectories: list[tuple[RolloutState, ...]]
) -> None:
    classes = word_classes(workload.vocabulary)
    per_level = workload.config.vocabulary.words_per_level
    scores, p_before = [], []
    for trajectory in trajectories:
        for before, after in itertools.pairwise(trajectory):
            thought = after.history[-1].text.split("\n")[0].removeprefix("Thought: ")
            score = graded_score(thought, classes, "confidence", per_level)
            if not np.isnan(score):
                scores.append(score)
                p_before.append(before.p)
    assert spearman(np.array(scores), np.array(p_before)) > 0.5


def test_features_are_off_by_default(trajectories: list[tuple[RolloutState, ...]]) -> None:
    assert all(state.last_turn is not None and state.last_turn.features is None for state in trajectories[0])


def test_features_correlate_with_conditional_success() -> None:
    workload = SimWorkload(SimConfig(prompts=256, feature_dim=6), seed=1)
    assert all(prompt.features is not None and len(prompt.features) == 6 for prompt in workload.prompts)
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts]
    states = [
        state for trajectory in workload.run(starts, np.random.default_rng(0)) for state in trajectory[:-1]
    ]
    features = np.array([state.last_turn.features for state in states if state.last_turn is not None])
    assert features.shape == (len(states), 6)
    logit = np.log([state.p / (1 - state.p) for state in states])
    # The best linear read-out recovers logit(p) well but not perfectly (the features are noisy).
    design = np.column_stack([features, np.ones(len(states))])
    coefficients, *_ = np.linalg.lstsq(design, logit, rcond=None)
    correlation = np.corrcoef(design @ coefficients, logit)[0, 1]
    assert 0.5 < correlation < 0.99
