"""Configuration of the policy families (`math`, `multihop`, `toolcall`): frozen, validated dataclasses.

Each family's `difficulty` is a mixture of normals on the logit scale: a task's latent difficulty z (its
success-relevant transitions have logit z + ...). The defaults give each family its own RLVR-like mix of
near-certain, near-hopeless and in-between tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trace_lab.sim.config import (
    _check_counts,
    _check_flip,
    _check_non_negative,
    _check_population,
    _check_probability,
    _check_range,
    _require,
)


@dataclass(frozen=True, slots=True)
class LogitComponent:
    """One component of a difficulty mixture: `weight` · N(`mean`, `sd`²) on the logit scale."""

    weight: float
    mean: float
    sd: float

    def __post_init__(self) -> None:
        _require(self.weight > 0, f"mixture weight must be positive, got {self.weight}")
        _require(self.sd >= 0, f"standard deviation must be non-negative, got {self.sd}")


class FamilyConfig(Protocol):
    """The fields every policy family's config has, with one meaning in all of them (the defaults differ).

    Prompts hold graded words at `prompt_signal_rate`, graded by z plus a per-prompt offset
    N(0, `text_bias`²) they share, each word blurred again by `level_noise`.
    """

    @property
    def prompts(self) -> int: ...
    @property
    def actions(self) -> int: ...
    @property
    def max_turns(self) -> int: ...
    @property
    def difficulty(self) -> tuple[LogitComponent, ...]: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def feature_dim(self) -> int: ...
    @property
    def feature_signal(self) -> float: ...
    @property
    def vocabulary_seed(self) -> int: ...
    @property
    def prompt_words(self) -> tuple[int, int]: ...
    @property
    def prompt_signal_rate(self) -> float: ...
    @property
    def level_noise(self) -> float: ...
    @property
    def text_bias(self) -> float: ...


def _check_family(config: FamilyConfig) -> None:
    """Validates the fields of `FamilyConfig`; each family checks its own fields after."""
    _check_population(config.prompts, config.learning_rate, config.feature_dim)
    _require(len(config.difficulty) >= 1, "difficulty needs at least one component")
    _check_probability("prompt_signal_rate", config.prompt_signal_rate)
    _check_non_negative("level_noise", config.level_noise)
    _check_non_negative("text_bias", config.text_bias)
    _check_range("prompt_words", config.prompt_words, 1)


# Bimodal: a maths task is mostly solved or mostly failed, whatever the steps.
MATH_DIFFICULTY = (
    LogitComponent(weight=0.42, mean=-5.5, sd=1.6),
    LogitComponent(weight=0.35, mean=5.0, sd=1.5),
    LogitComponent(weight=0.23, mean=0.0, sd=1.5),
)


@dataclass(frozen=True, slots=True)
class MathConfig:
    """Mathematical reasoning: `min_steps`–`max_steps` reasoning steps, then an answer.

    Turn t (0-based) answers with probability α_t: 0 before `min_steps`, `answer_prob` up to
    `max_steps` − 1, 1 at `max_steps`. With r sound steps so far and g(a) = [a is the topic's right
    method for turn t] − 1/actions:

        P(step sound)    = σ(z + b + method_bonus · g(a)),
        P(answer right)  = σ(z + b + prefix_weight · (2r − t) + method_bonus · g(a)),

    z the task's difficulty, b its competence (learning mode). A small `prefix_weight` makes the prefix
    move the odds little: success is decided mostly by z.
    """

    prompts: int = 2048
    topics: int = 4
    actions: int = 4
    min_steps: int = 2
    max_steps: int = 4
    answer_prob: float = 0.5
    difficulty: tuple[LogitComponent, ...] = MATH_DIFFICULTY
    # Chance that the topic shown to the agent (and in the prompt) is a wrong one.
    topic_noise: float = 0.15
    method_bonus: float = 2.0
    prefix_weight: float = 0.3
    learning_rate: float = 0.3
    feature_dim: int = 0
    feature_signal: float = 0.5
    vocabulary_seed: int = 0
    # Text: prompts hold graded difficulty words at `prompt_signal_rate`, graded by z plus a per-prompt
    # offset N(0, `text_bias`²) they share, each word blurred again by `level_noise` (modest signal);
    # steps carry sound / unsound verdict words, all of a turn's flipped with `verdict_flip` (weak signal).
    prompt_words: tuple[int, int] = (8, 30)
    prompt_signal_rate: float = 0.15
    level_noise: float = 2.0
    text_bias: float = 4.0
    step_words: tuple[int, int] = (3, 10)
    verdict_rate: float = 0.3
    verdict_flip: float = 0.35

    def __post_init__(self) -> None:
        _check_family(self)
        _require(self.topics >= 1 and self.actions >= 2, "need at least one topic and two actions")
        _check_counts("steps", "steps", self.min_steps, self.max_steps)
        _check_probability("answer_prob", self.answer_prob)
        _check_probability("topic_noise", self.topic_noise)
        _check_probability("verdict_rate", self.verdict_rate)
        _check_flip("verdict_flip", self.verdict_flip)
        _check_range("step_words", self.step_words, 0)

    @property
    def max_turns(self) -> int:
        return self.max_steps + 1


# Wide and unimodal: retrieval makes most questions a matter of luck along the way.
MULTIHOP_DIFFICULTY = (
    LogitComponent(weight=0.5, mean=0.5, sd=1.5),
    LogitComponent(weight=0.3, mean=-3.0, sd=1.2),
    LogitComponent(weight=0.2, mean=3.0, sd=1.0),
)


@dataclass(frozen=True, slots=True)
class MultihopConfig:
    """Multi-hop question answering: search turns that find, miss or are misled by the next document,
    then an answer.

    A question of kind u needs h(u) = `min_hops` + (u mod (`max_hops` − `min_hops` + 1)) documents.
    Actions 0 … `search_styles` − 1 search; the last action answers (so does every action on the last
    turn). With f documents found, g(a) = [a is the kind's right style for hop f] − 1/search_styles and
    q = σ(z + b + style_bonus · g(a)), a search finds the next document with probability q, else is
    misled with probability `mislead_rate` (a wrong bridge entity that looks like progress: the rollout
    is derailed and follows the wrong chain from then on) or misses (nothing new; so does any search once
    all h are found). An answer is right with probability

        σ(z + b + answer_bias − missing_penalty · (h − f)⁺)   on track,
        σ(z + b + answer_bias − derail_penalty)                derailed.

    Finding or being misled by a document moves the odds a lot; answering early is usually wrong.
    """

    prompts: int = 2048
    kinds: int = 4
    search_styles: int = 3
    min_hops: int = 2
    max_hops: int = 4
    max_turns: int = 10
    difficulty: tuple[LogitComponent, ...] = MULTIHOP_DIFFICULTY
    kind_noise: float = 0.2
    style_bonus: float = 1.5
    answer_bias: float = 1.5
    missing_penalty: float = 3.0
    mislead_rate: float = 0.35
    derail_penalty: float = 5.0
    # The default policy's answer logit by documents found (searches have logit 0): a base model that
    # rarely answers before two documents and usually after three, so four-hop questions are often
    # answered too early and two-hop ones searched on for nothing.
    answer_prior: tuple[float, ...] = (-3.0, -2.0, -0.5, 1.0, 2.0)
    learning_rate: float = 0.3
    feature_dim: int = 0
    feature_signal: float = 0.5
    vocabulary_seed: int = 0
    # Text: prompts hold graded prominence words, graded by z plus a per-prompt offset N(0, `text_bias`²)
    # and per-word `level_noise` (strong signal); a found document names the bridge entity and holds
    # relevance words, all of a document's flipped with `document_flip`; a misleading one looks relevant
    # with probability `misled_relevance`.
    prompt_words: tuple[int, int] = (6, 24)
    prompt_signal_rate: float = 0.3
    level_noise: float = 1.0
    text_bias: float = 0.7
    document_words: tuple[int, int] = (6, 18)
    relevance_rate: float = 0.4
    document_flip: float = 0.1
    misled_relevance: float = 0.6

    def __post_init__(self) -> None:
        _check_family(self)
        _require(self.kinds >= 1 and self.search_styles >= 1, "need at least one kind and one search style")
        _check_counts("hops", "hops", self.min_hops, self.max_hops)
        _require(self.max_turns >= 1, "max_turns must be at least 1")
        _require(
            len(self.answer_prior) == self.max_hops + 1,
            f"answer_prior needs one logit per documents-found level 0 … {self.max_hops}",
        )
        _check_probability("kind_noise", self.kind_noise)
        _check_non_negative("missing_penalty", self.missing_penalty)
        _check_non_negative("derail_penalty", self.derail_penalty)
        _check_probability("mislead_rate", self.mislead_rate)
        _check_probability("misled_relevance", self.misled_relevance)
        _check_probability("relevance_rate", self.relevance_rate)
        _check_flip("document_flip", self.document_flip)
        _check_range("document_words", self.document_words, 0)

    @property
    def actions(self) -> int:
        return self.search_styles + 1


# Skewed to failure: a chain of calls multiplies the chances of each.
TOOLCALL_DIFFICULTY = (
    LogitComponent(weight=0.5, mean=-2.5, sd=1.5),
    LogitComponent(weight=0.38, mean=1.5, sd=1.2),
    LogitComponent(weight=0.12, mean=4.5, sd=1.0),
)


@dataclass(frozen=True, slots=True)
class ToolcallConfig:
    """Function calling: m calls in sequence (m uniform in `min_calls` … `max_calls`), one per turn.

    In latent state (k calls done, e = the last call failed recoverably) a call with variant a succeeds
    with probability q = σ(z + b + variant_bonus · g(a)), g(a) = [a is the API's right variant for
    (k, e)] − 1/actions. A failed call is fatal (absorbing failure: the rollout ends with reward 0) with
    probability `fatal_right` or `fatal_wrong`, else a recoverable error (e = 1). The m-th success ends the
    rollout with reward 1; running out of `max_turns` ends it with reward 0.
    """

    prompts: int = 2048
    apis: int = 3
    actions: int = 4
    min_calls: int = 2
    max_calls: int = 4
    max_turns: int = 7
    difficulty: tuple[LogitComponent, ...] = TOOLCALL_DIFFICULTY
    api_noise: float = 0.1
    variant_bonus: float = 2.0
    fatal_right: float = 0.05
    fatal_wrong: float = 0.4
    learning_rate: float = 0.3
    feature_dim: int = 0
    feature_signal: float = 0.5
    vocabulary_seed: int = 0
    # Text: the request holds graded difficulty words, graded by z plus a per-prompt offset
    # N(0, `text_bias`²) and per-word `level_noise` (weak signal); responses show the status exactly,
    # but an error's `retryable` flag is wrong with probability `retryable_flip`.
    prompt_words: tuple[int, int] = (6, 20)
    prompt_signal_rate: float = 0.1
    level_noise: float = 3.0
    text_bias: float = 3.0
    message_words: tuple[int, int] = (2, 8)
    retryable_flip: float = 0.2

    def __post_init__(self) -> None:
        _check_family(self)
        _require(self.apis >= 1 and self.actions >= 2, "need at least one API and two variants")
        _check_counts("calls", "calls", self.min_calls, self.max_calls)
        _require(self.max_turns >= self.max_calls, "max_turns must leave room for max_calls calls")
        _check_probability("api_noise", self.api_noise)
        _check_probability("fatal_right", self.fatal_right)
        _check_probability("fatal_wrong", self.fatal_wrong)
        _check_flip("retryable_flip", self.retryable_flip)
        _check_range("message_words", self.message_words, 0)


# Slipperiness: many mazes are a walk or a wall for the starting policy, some in between.
MAZE_DIFFICULTY = (
    LogitComponent(weight=0.4, mean=-2.0, sd=1.5),
    LogitComponent(weight=0.35, mean=2.0, sd=1.2),
    LogitComponent(weight=0.25, mean=4.5, sd=1.0),
)


@dataclass(frozen=True, slots=True)
class MazeConfig:
    """Slippery mazes: j junctions to pass (j uniform in `min_junctions` … `max_junctions`) within
    `max_turns` turns, one exit taken per turn.

    At junction k (k passed so far) of a maze of layout u the right exit is (u + 3k) mod actions; with
    g(a) = [a is right] − 1/actions, an exit gets through with probability q = σ(z + b + exit_bonus ·
    g(a)). A move that does not get through drops into a pit (absorbing failure) with probability
    `pit_right` or `pit_wrong`, else slides back one junction with probability `slide_back`, else
    stays. Passing the j-th junction ends the rollout with reward 1; running out of turns with 0.

    Prompts never say how slippery a maze is unless `prompt_signal_rate` > 0 (the `maze` family: none,
    and a population large enough that a benchmark's prompts never recur); observations say what a move
    did, wrong with probability `observation_flip`.
    """

    prompts: int = 4096
    layouts: int = 4
    actions: int = 4
    min_junctions: int = 2
    max_junctions: int = 6
    max_turns: int = 8
    difficulty: tuple[LogitComponent, ...] = MAZE_DIFFICULTY
    layout_noise: float = 0.1
    exit_bonus: float = 2.5
    pit_right: float = 0.03
    pit_wrong: float = 0.25
    slide_back: float = 0.5
    learning_rate: float = 0.3
    feature_dim: int = 0
    feature_signal: float = 0.5
    vocabulary_seed: int = 0
    prompt_words: tuple[int, int] = (6, 20)
    prompt_signal_rate: float = 0.0
    level_noise: float = 1.5
    text_bias: float = 1.0
    observation_words: tuple[int, int] = (2, 6)
    observation_flip: float = 0.1

    def __post_init__(self) -> None:
        _check_family(self)
        _require(self.layouts >= 1 and self.actions >= 2, "need at least one layout and two exits")
        _check_counts("junctions", "junctions", self.min_junctions, self.max_junctions)
        _require(self.max_turns >= self.max_junctions, "max_turns must leave room for max_junctions moves")
        _check_probability("layout_noise", self.layout_noise)
        _check_probability("pit_right", self.pit_right)
        _check_probability("pit_wrong", self.pit_wrong)
        _check_probability("slide_back", self.slide_back)
        _check_flip("observation_flip", self.observation_flip)
        _check_range("observation_words", self.observation_words, 0)
