"""Invalid configurations are refused with a message naming the field."""

from typing import Any

import pytest

from trace_lab.sim import BetaComponent, SimConfig, TextConfig, VocabularyConfig


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"prompts": 0}, "prompts"),
        ({"difficulty": ()}, "difficulty"),
        ({"min_turns": 0}, "turn counts"),
        ({"min_turns": 5, "max_turns": 4}, "turn counts"),
        ({"stop_prob": 1.5}, "stop_prob"),
        ({"step_size": (0.5, 0.2)}, "step_size"),
        ({"step_size": (0.1, 1.2)}, "step_size"),
        ({"learning_rate": -0.1}, "learning_rate"),
        ({"feature_dim": -1}, "feature_dim"),
    ],
)
def test_sim_config_rejects(arguments: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SimConfig(**arguments)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"prompt_words": (0, 5)}, "prompt_words"),
        ({"thought_words": (5, 2)}, "thought_words"),
        ({"prompt_signal_rate": -0.1}, "prompt_signal_rate"),
        ({"observation_flip": 0.6}, "observation_flip"),
        ({"level_noise": -1.0}, "level_noise"),
        ({"level_span": 0.0}, "level_span"),
    ],
)
def test_text_config_rejects(arguments: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TextConfig(**arguments)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"distractor_words": 0}, "distractor_words"),
        ({"levels": 1}, "levels"),
        ({"tools": 0}, "tools"),
        ({"zipf_exponent": -1.0}, "zipf_exponent"),
    ],
)
def test_vocabulary_config_rejects(arguments: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        VocabularyConfig(**arguments)


@pytest.mark.parametrize(("weight", "alpha", "beta"), [(0.0, 1.0, 1.0), (1.0, 0.0, 1.0), (1.0, 1.0, -2.0)])
def test_beta_component_rejects(weight: float, alpha: float, beta: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        BetaComponent(weight, alpha, beta)
