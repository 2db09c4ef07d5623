"""Configuration of the simulated agentic workload: frozen dataclasses, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_range(name: str, bounds: tuple[int, int], lowest: int) -> None:
    low, high = bounds
    _require(lowest <= low <= high, f"{name} must satisfy {lowest} <= min <= max, got {bounds}")


def _check_probability(name: str, value: float) -> None:
    _require(0.0 <= value <= 1.0, f"{name} must lie in [0, 1], got {value}")


def _check_flip(name: str, value: float) -> None:
    # Past 0.5 a flipped cue would carry the opposite signal rather than less of it.
    _require(0.0 <= value <= 0.5, f"{name} must lie in [0, 0.5]")


def _check_non_negative(name: str, value: float) -> None:
    _require(value >= 0, f"{name} must be non-negative")


def _check_counts(noun: str, stem: str, low: int, high: int) -> None:
    """1 <= `low` <= `high` for the fields min_`stem` and max_`stem`."""
    _require(1 <= low <= high, f"{noun} must satisfy 1 <= min_{stem} <= max_{stem}, got {low}, {high}")


def _check_population(prompts: int, learning_rate: float, feature_dim: int) -> None:
    """The fields every workload config shares: the task count, the learning rate, the feature size."""
    _require(prompts >= 1, f"prompts must be at least 1, got {prompts}")
    _check_non_negative("learning_rate", learning_rate)
    _check_non_negative("feature_dim", feature_dim)


@dataclass(frozen=True, slots=True)
class BetaComponent:
    """One component of the prompt-difficulty mixture: `weight` · Beta(`alpha`, `beta`)."""

    weight: float
    alpha: float
    beta: float

    def __post_init__(self) -> None:
        _require(self.weight > 0, f"mixture weight must be positive, got {self.weight}")
        _require(
            self.alpha > 0 and self.beta > 0,
            f"Beta parameters must be positive, got alpha={self.alpha}, beta={self.beta}",
        )


# U-shaped like real RLVR pools: most prompts are nearly always failed or nearly always solved. Calibrated so
# that uniform GRPO with 8 rollouts per prompt sees about 30% mixed groups (the paper's baseline: 27–35%).
DEFAULT_DIFFICULTY = (
    BetaComponent(weight=0.6, alpha=0.3, beta=6.0),
    BetaComponent(weight=0.3, alpha=6.0, beta=0.3),
    BetaComponent(weight=0.1, alpha=2.0, beta=2.0),
)


@dataclass(frozen=True, slots=True)
class VocabularyConfig:
    """Sizes of the generated word classes; `seed` alone decides the spelling of every word.

    Two vocabularies with different seeds share a word only by rare chance, so a predictor evaluated on a
    second seed cannot have been tuned to the first one's words.
    """

    seed: int = 0
    distractor_words: int = 3000
    # Distractor frequencies follow a Zipf law with this exponent, like natural text.
    zipf_exponent: float = 1.0
    # Graded words: `levels` groups of `words_per_level` synonyms, each group standing for a band of success
    # probability on the logit scale. Prompts use one graded class (difficulty), thoughts another
    # (the agent's confidence).
    levels: int = 9
    words_per_level: int = 8
    progress_words: int = 24
    setback_words: int = 24
    tools: int = 16

    def __post_init__(self) -> None:
        _require(self.distractor_words >= 1, "distractor_words must be at least 1")
        _check_non_negative("zipf_exponent", self.zipf_exponent)
        _require(self.levels >= 2, "levels must be at least 2")
        for name in ("words_per_level", "progress_words", "setback_words", "tools"):
            _require(getattr(self, name) >= 1, f"{name} must be at least 1")


@dataclass(frozen=True, slots=True)
class TextConfig:
    """How much true signal the text carries, and how much of it is noise.

    Word counts are inclusive (min, max) ranges drawn uniformly. A *signal rate* is the chance that a word
    slot holds a signal word rather than a distractor.
    """

    prompt_words: tuple[int, int] = (10, 60)
    # Prompt signal words are graded by the prompt's success rate at creation time, blurred by
    # `level_noise` (standard deviation on the logit scale).
    prompt_signal_rate: float = 0.1
    level_noise: float = 2.0
    # Graded levels span logits in [-level_span, +level_span].
    level_span: float = 4.0
    # Thoughts carry the agent's confidence: graded words around the current conditional success.
    thought_words: tuple[int, int] = (4, 16)
    thought_signal_rate: float = 0.1
    action_arguments: tuple[int, int] = (1, 3)
    # Observations say whether the turn moved towards success (progress words) or away from it (setback
    # words); the rate scales with how much the turn mattered, and a share of signal words is flipped.
    observation_words: tuple[int, int] = (3, 14)
    observation_signal_rate: float = 0.5
    observation_flip: float = 0.3

    def __post_init__(self) -> None:
        _check_range("prompt_words", self.prompt_words, 1)
        _check_range("thought_words", self.thought_words, 0)
        _check_range("action_arguments", self.action_arguments, 0)
        _check_range("observation_words", self.observation_words, 0)
        _check_probability("prompt_signal_rate", self.prompt_signal_rate)
        _check_probability("thought_signal_rate", self.thought_signal_rate)
        _check_probability("observation_signal_rate", self.observation_signal_rate)
        _check_flip("observation_flip", self.observation_flip)
        _check_non_negative("level_noise", self.level_noise)
        _require(self.level_span > 0, "level_span must be positive")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """The simulated workload.

    Dynamics (exact, see `trace_lab.sim` for the proof sketch): a non-final turn moves the conditional
    success p to (1 − a)·p + a·B with B ~ Bernoulli(p) and a ~ Uniform(`step_size`); the final turn draws
    the reward ~ Bernoulli(p). Whether a turn is final is decided before it is drawn: forced at
    `max_turns`, else with probability `stop_prob` once at least `min_turns` turns are done.
    """

    prompts: int = 4096
    difficulty: tuple[BetaComponent, ...] = DEFAULT_DIFFICULTY
    min_turns: int = 2
    max_turns: int = 12
    stop_prob: float = 0.2
    step_size: tuple[float, float] = (0.1, 0.4)
    # Learning mode: a prompt whose group was mixed moves its success rate up by this much on the logit
    # scale (`SimWorkload.learn`).
    learning_rate: float = 0.3
    # Optional numeric features (a noisy stand-in for a pooled hidden state); 0 turns them off.
    feature_dim: int = 0
    # Features are signal · clip(logit p) · u + N(0, I) for a fixed unit vector u.
    feature_signal: float = 0.5
    vocabulary: VocabularyConfig = field(default_factory=VocabularyConfig)
    text: TextConfig = field(default_factory=TextConfig)

    def __post_init__(self) -> None:
        _check_population(self.prompts, self.learning_rate, self.feature_dim)
        _require(len(self.difficulty) >= 1, "difficulty needs at least one Beta component")
        _check_counts("turn counts", "turns", self.min_turns, self.max_turns)
        _check_probability("stop_prob", self.stop_prob)
        low, high = self.step_size
        _require(
            0.0 <= low <= high <= 1.0, f"step_size must satisfy 0 <= low <= high <= 1, got {self.step_size}"
        )

    @property
    def expected_turns(self) -> float:
        """Mean number of turns of a rollout from its start."""
        return self.expected_remaining_turns(0)

    def expected_remaining_turns(self, depth: int) -> float:
        """Mean number of turns a continuation from a prefix of `depth` turns generates:

            E = (a − depth) + Σ_{j=1}^{max_turns − a} (1 − stop_prob)^j,   a = max(min_turns, depth + 1),

        since turns up to `a` always happen and each later one only if no earlier turn stopped.
        """
        if not 0 <= depth < self.max_turns:
            raise ValueError(f"depth must lie in [0, max_turns), got {depth}")
        first_stop = max(self.min_turns, depth + 1)
        keep_going = 1.0 - self.stop_prob
        return first_stop - depth + sum(keep_going**j for j in range(1, self.max_turns - first_stop + 1))
