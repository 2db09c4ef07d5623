"""Multi-turn tool tasks with a verifiable reward: the environments the language-model learner is trained in.

A task is anything that satisfies `Task`; the learner only ever calls the three methods below and reads the
three attributes, so a third task plugs in by writing one class and adding it to `TASKS`. What a task must
guarantee:

* Texts. Every prompt text, answer, demonstration action and observation text uses only characters of
  `bench.lm.vocab.ALPHABET` (the policy can neither read nor write anything else), and every demonstration
  action is at most `max_action_chars` long (the learner stops generating an action there).
* `sample_prompts(rng, count)`: `count` prompts, a deterministic function of the generator's state (so a
  seed reproduces a run), with unique `prompt_id`s (drawn from the generator, so also distinct across calls
  with overwhelming probability: the service keys each prompt's outcome history by its id) and
  `difficulty` spread over the whole of [0, 1] (the benchmark reports learning per difficulty band). All
  the hidden state of the prompt's environment lives in `Prompt.env`, a hashable tuple of string tuples.
* `demonstration(prompt, rng, error_rate)`: the actions of a whole episode that solves the prompt when
  `error_rate` is 0, ending in an `ANSWER` before `max_turns`. Each step is independently replaced, with
  probability `error_rate`, by a plausible wrong step, and the later steps carry on from what the
  environment answered to it (as an agent would that made that mistake): the result is a realistic noisy
  trajectory for warm-starting the policy.
* `step(prompt, actions)`: the environment's answer to the last action, a pure function of the prompt and
  the whole history, so that replaying a prefix of actions resumes an episode in exactly the same state
  (this is how continuations from a prefix are run). `episode_step` implements the rules every task
  shares, and a task only supplies its tool:
  - `ANSWER x` ends the episode: reward 1.0 iff x, stripped, equals `Prompt.answer`, else 0.0; the
    observation text is `CORRECT` or `WRONG`;
  - any other action goes to the tool, whose text is the observation; a malformed one gets an
    `ERROR ...` text (for example `ERROR unknown action`) and does not end the episode;
  - the `max_turns`-th action, if not an answer, ends the episode with reward 0.0 (its text is still the
    tool's);
  - a history that already ended before its last action, an empty one or one longer than `max_turns`
    raises ValueError: nothing may follow the end of an episode.
  `Observation.reward` is set exactly when `done`.
"""

from __future__ import annotations

import functools
import operator
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np


@dataclass(frozen=True)
class Prompt:
    """One question of a task. `text` is all the agent sees; `env` is the environment's hidden, frozen
    state (a knowledge base, the parsed question), which `step` and `demonstration` read."""

    prompt_id: str
    text: str
    difficulty: float
    answer: str
    env: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Observation:
    """The environment's answer to an action; `reward` is set exactly when `done`: 1.0 correct, else 0.0."""

    text: str
    done: bool
    reward: float | None


class Task(Protocol):
    """A multi-turn tool task; the module docstring states what each member must guarantee."""

    name: str
    max_turns: int
    max_action_chars: int

    def sample_prompts(self, rng: np.random.Generator, count: int) -> list[Prompt]: ...

    def demonstration(self, prompt: Prompt, rng: np.random.Generator, error_rate: float) -> list[str]: ...

    def step(self, prompt: Prompt, actions: Sequence[str]) -> Observation: ...


ANSWER_COMMAND: Final = "ANSWER"
UNKNOWN_ACTION: Final = "ERROR unknown action"
CORRECT_TEXT: Final = "CORRECT"
WRONG_TEXT: Final = "WRONG"
RESULT_PREFIX: Final = "RESULT "


def answer_of(action: str) -> str | None:
    """The value of an `ANSWER x` action, stripped; None for any other action."""
    words = action.strip()
    if words == ANSWER_COMMAND or words.startswith(ANSWER_COMMAND + " "):
        return words.removeprefix(ANSWER_COMMAND).strip()
    return None


def episode_step(
    prompt: Prompt, actions: Sequence[str], max_turns: int, tool: Callable[[str], str]
) -> Observation:
    """The episode rules every task shares (see the module docstring); `tool` answers any action that is
    not an answer, with an `ERROR ...` text for one it cannot parse."""
    if not actions or len(actions) > max_turns:
        raise ValueError(f"a history has 1 to {max_turns} actions, not {len(actions)}")
    for index, earlier in enumerate(actions[:-1]):
        if answer_of(earlier) is not None:
            raise ValueError(f"the episode already ended at action {index}: {earlier!r}")
    answer = answer_of(actions[-1])
    if answer is not None:
        correct = answer == prompt.answer
        return Observation(CORRECT_TEXT if correct else WRONG_TEXT, done=True, reward=1.0 if correct else 0.0)
    out_of_turns = len(actions) == max_turns
    return Observation(tool(actions[-1]), done=out_of_turns, reward=0.0 if out_of_turns else None)


def _fresh_prompt_id(task_name: str, rng: np.random.Generator, taken: set[str]) -> str:
    """A random id not in `taken` (and added to it): random rather than a counter, so that prompts from
    separate calls do not collide."""
    while True:
        prompt_id = f"{task_name}-{int(rng.integers(0, 2**48)):012x}"
        if prompt_id not in taken:
            taken.add(prompt_id)
            return prompt_id


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _result_of(observation: Observation) -> str:
    """The value of a `RESULT v` observation; anything else in a demonstration is a bug in the task."""
    if not observation.text.startswith(RESULT_PREFIX):
        raise AssertionError(f"a demonstration step was not answered with a result: {observation.text!r}")
    return observation.text.removeprefix(RESULT_PREFIX)


# ---------------------------------------------------------------------------------------------------------
# Arithmetic with a calculator tool.

_OPERATIONS: Final[dict[str, tuple[str, Callable[[int, int], int]]]] = {
    "add": ("+", operator.add),
    "sub": ("-", operator.sub),
    "mul": ("*", operator.mul),
}
# The operation a solver plausibly confuses with the right one; never `mul`, whose products could grow a
# noisy demonstration's numbers past `max_action_chars`.
_CONFUSED_OPERATIONS: Final[dict[str, tuple[str, ...]]] = {
    "add": ("sub",),
    "sub": ("add",),
    "mul": ("add", "sub"),
}
_INTEGER: Final = re.compile(r"-?[0-9]+")


def _running_values(operations: Sequence[str], operands: Sequence[int]) -> list[int]:
    """The value after each operation, left to right, as the parentheses of the question dictate."""
    values = []
    value = operands[0]
    for operation, operand in zip(operations, operands[1:], strict=True):
        value = _OPERATIONS[operation][1](value, operand)
        values.append(value)
    return values


def _change_one_digit(number: int, rng: np.random.Generator) -> int:
    """A plausible misreading of `number`: one digit changed, never the leading one of a multi-digit
    number, so that the magnitude stays within twice the original (or one digit) and noisy demonstrations
    keep their actions short."""
    digits = list(str(abs(number)))
    position = int(rng.integers(1, len(digits))) if len(digits) > 1 else 0
    digits[position] = _pick(rng, [digit for digit in string.digits if digit != digits[position]])
    changed = int("".join(digits))
    return -changed if number < 0 else changed


class ToolArithmetic:
    """`Q: (37*48)+12`: 1 to 3 binary operations (+ - *) on operands of 1 to 3 digits, evaluated left to
    right as the explicit parentheses say. The tool is a calculator: `CALL add a b`, `CALL sub a b` and
    `CALL mul a b` answer `RESULT n` for integers a, b of at most 9 digits. The intended solution is one
    call per operation, then `ANSWER n`. Difficulty grows with the operand digits and the operations.
    `Prompt.env` is (operations, operands), for example `(("mul", "add"), ("37", "48", "12"))`."""

    name = "arithmetic"
    max_turns = 5
    max_action_chars = 24
    MAX_OPERATIONS: Final = 3
    MAX_DIGITS: Final = 3
    # Every intermediate value of a question stays below this, so that the intended actions fit in 20
    # characters (`CALL sub -998001 999`) and noisy ones in `max_action_chars`.
    MAX_INTERMEDIATE: Final = 10**6
    MAX_INPUT_DIGITS: Final = 9

    def sample_prompts(self, rng: np.random.Generator, count: int) -> list[Prompt]:
        taken: set[str] = set()
        return [self._sample_prompt(rng, _fresh_prompt_id(self.name, rng, taken)) for _ in range(count)]

    def _sample_prompt(self, rng: np.random.Generator, prompt_id: str) -> Prompt:
        operation_count = int(rng.integers(1, self.MAX_OPERATIONS + 1))
        digits = int(rng.integers(1, self.MAX_DIGITS + 1))
        smallest = 0 if digits == 1 else 10 ** (digits - 1)
        while True:  # rejection keeps the intermediate values small; few draws fail
            operations = [_pick(rng, list(_OPERATIONS)) for _ in range(operation_count)]
            operands = [int(rng.integers(smallest, 10**digits)) for _ in range(operation_count + 1)]
            values = _running_values(operations, operands)
            if all(abs(value) < self.MAX_INTERMEDIATE for value in values):
                break
        operation_level = (operation_count - 1) / (self.MAX_OPERATIONS - 1)
        digit_level = (digits - 1) / (self.MAX_DIGITS - 1)
        expression = str(operands[0])
        for index, (operation, operand) in enumerate(zip(operations, operands[1:], strict=True)):
            left = f"({expression})" if index > 0 else expression
            expression = f"{left}{_OPERATIONS[operation][0]}{operand}"
        return Prompt(
            prompt_id=prompt_id,
            text=f"Q: {expression}",
            difficulty=(operation_level + digit_level) / 2,
            answer=str(values[-1]),
            env=(tuple(operations), tuple(str(operand) for operand in operands)),
        )

    def demonstration(self, prompt: Prompt, rng: np.random.Generator, error_rate: float) -> list[str]:
        """One call per operation, the left operand being the result the tool last answered. The wrong
        steps: a misread operand (one digit changed), a confused operation, a misread final answer."""
        operations, operand_texts = prompt.env
        operands = [int(text) for text in operand_texts]
        actions: list[str] = []
        left = operands[0]
        for operation, right in zip(operations, operands[1:], strict=True):
            called, called_left, called_right = operation, left, right
            if rng.random() < error_rate:
                mistake = _pick(rng, ["operation", "left", "right"])
                if mistake == "operation":
                    called = _pick(rng, _CONFUSED_OPERATIONS[operation])
                elif mistake == "left":
                    called_left = _change_one_digit(left, rng)
                else:
                    called_right = _change_one_digit(right, rng)
            actions.append(f"CALL {called} {called_left} {called_right}")
            left = int(_result_of(self.step(prompt, actions)))
        answer = _change_one_digit(left, rng) if rng.random() < error_rate else left
        actions.append(f"{ANSWER_COMMAND} {answer}")
        return actions

    def step(self, prompt: Prompt, actions: Sequence[str]) -> Observation:
        return episode_step(prompt, actions, self.max_turns, self._calculator)

    def _calculator(self, action: str) -> str:
        words = action.split()
        if len(words) != 4 or words[0] != "CALL" or words[1] not in _OPERATIONS:
            return UNKNOWN_ACTION
        if not all(_INTEGER.fullmatch(word) for word in words[2:]):
            return "ERROR not an integer"
        if any(len(word.removeprefix("-")) > self.MAX_INPUT_DIGITS for word in words[2:]):
            return "ERROR number too large"
        return f"{RESULT_PREFIX}{_OPERATIONS[words[1]][1](int(words[2]), int(words[3]))}"


# ---------------------------------------------------------------------------------------------------------
# Multi-hop lookups in a small knowledge base.

PERSON_RELATIONS: Final = ("father", "mother", "boss", "friend")
PLACE_RELATION: Final = "home"  # person -> place; places have no relations, so it is only ever the last hop
RELATIONS: Final = (*PERSON_RELATIONS, PLACE_RELATION)
NONE_ANSWER: Final = "none"
_CONSONANTS: Final = "bdfgklmnprstvz"
_VOWELS: Final = "aeiou"


def _letter_class(letter: str) -> str:
    return _VOWELS if letter in _VOWELS else _CONSONANTS


def _similar_name(name: str, rng: np.random.Generator) -> str:
    """`name` with one letter changed for another of its kind, so it stays pronounceable and confusable."""
    position = int(rng.integers(len(name)))
    kind = _letter_class(name[position])
    replacement = _pick(rng, [letter for letter in kind if letter != name[position]])
    return name[:position] + replacement + name[position + 1 :]


def _differ_by_one_letter(first: str, second: str) -> bool:
    return len(first) == len(second) and sum(a != b for a, b in zip(first, second, strict=True)) == 1


class _Names:
    """Fresh distinct consonant-vowel-consonant-vowel names for one knowledge base; never `none`, which
    has that shape but is the answer to a broken chain."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._used: set[str] = {NONE_ANSWER}

    def fresh(self) -> str:
        return self._claim(lambda: "".join(_pick(self._rng, kind) for kind in (_CONSONANTS, _VOWELS) * 2))

    def similar_to(self, name: str) -> str:
        return self._claim(lambda: _similar_name(name, self._rng))

    def _claim(self, draw: Callable[[], str]) -> str:
        while True:
            name = draw()
            if name not in self._used:
                self._used.add(name)
                return name


def _knowledge(prompt: Prompt) -> dict[tuple[str, str], str]:
    """The knowledge base of a prompt, (relation, subject) -> object, from its triples in `Prompt.env`."""
    return {(relation, subject): target for relation, subject, target in prompt.env}


def _follow(knowledge: dict[tuple[str, str], str], relations: Sequence[str], start: str) -> str:
    """The end of the chain of `relations` (applied first to last) from `start`, or `none` at a gap."""
    current = start
    for relation in relations:
        found = knowledge.get((relation, current))
        if found is None:
            return NONE_ANSWER
        current = found
    return current


class MultiHopLookup:
    """`Q: boss of father of tiru` (the outermost relation first): a chain of 1 to 4 hops through a small
    knowledge base of pronounceable names that only the tool can read: `LOOKUP relation name` answers
    `RESULT name2`, or `RESULT none` when the base has no such entry. The base holds distractors (names one
    letter away from the chain's, with relations of their own), and in a share of the prompts one link of
    the chain is missing, which makes the answer `none`: the agent should answer `ANSWER none` after the
    lookup that returned none. Difficulty grows with the hops and the distractors. `Prompt.env` is the
    knowledge base as sorted (relation, subject, object) triples."""

    name = "lookup"
    max_turns = 6
    max_action_chars = 20
    MAX_HOPS: Final = 4
    MAX_DISTRACTORS: Final = 3
    MISSING_LINK_SHARE: Final = 0.15
    HOME_SHARE: Final = 0.25  # of the chains that end with a `home` hop
    FILLER_PEOPLE: Final = 3
    PLACES: Final = 3
    FACT_PROBABILITY: Final = 0.5  # of each relation of a person; a distractor has all, the chain its links

    def sample_prompts(self, rng: np.random.Generator, count: int) -> list[Prompt]:
        taken: set[str] = set()
        return [self._sample_prompt(rng, _fresh_prompt_id(self.name, rng, taken)) for _ in range(count)]

    def _sample_prompt(self, rng: np.random.Generator, prompt_id: str) -> Prompt:
        hop_count = int(rng.integers(1, self.MAX_HOPS + 1))
        distractor_count = int(rng.integers(0, self.MAX_DISTRACTORS + 1))
        relations = [_pick(rng, PERSON_RELATIONS) for _ in range(hop_count)]
        if rng.random() < self.HOME_SHARE:
            relations[-1] = PLACE_RELATION
        names = _Names(rng)
        chain = [names.fresh() for _ in range(hop_count + 1)]
        ends_at_place = relations[-1] == PLACE_RELATION
        fillers = [names.fresh() for _ in range(self.FILLER_PEOPLE)]
        people = [*(chain[:-1] if ends_at_place else chain), *fillers]
        places = [*(chain[-1:] if ends_at_place else []), *(names.fresh() for _ in range(self.PLACES))]
        # The distractors mimic the people the agent looks up, so a misread name still finds an answer.
        distractors = [names.similar_to(_pick(rng, chain[:hop_count])) for _ in range(distractor_count)]
        knowledge: dict[tuple[str, str], str] = {}
        for person in [*people, *distractors]:
            for relation in RELATIONS:
                if person in distractors or rng.random() < self.FACT_PROBABILITY:
                    targets = places if relation == PLACE_RELATION else [*people, *distractors]
                    knowledge[(relation, person)] = _pick(
                        rng, [target for target in targets if target != person]
                    )
        for hop, relation in enumerate(relations):
            knowledge[(relation, chain[hop])] = chain[hop + 1]
        if rng.random() < self.MISSING_LINK_SHARE:
            broken_hop = int(rng.integers(hop_count))
            del knowledge[(relations[broken_hop], chain[broken_hop])]
        question = " of ".join([*reversed(relations), chain[0]])
        return Prompt(
            prompt_id=prompt_id,
            text=f"Q: {question}",
            difficulty=0.6 * (hop_count - 1) / (self.MAX_HOPS - 1)
            + 0.4 * distractor_count / self.MAX_DISTRACTORS,
            answer=_follow(knowledge, relations, chain[0]),
            env=tuple(
                sorted((relation, subject, target) for (relation, subject), target in knowledge.items())
            ),
        )

    def demonstration(self, prompt: Prompt, rng: np.random.Generator, error_rate: float) -> list[str]:
        """One lookup per hop, innermost first, each on the name the tool last answered, stopping at a
        `none`. The wrong steps: a wrong relation, a misread name (a distractor of it when the base has
        one), a wrong final answer (a misread name or `none`, or a guessed name after a `none`)."""
        *outermost_first, start = prompt.text.removeprefix("Q: ").split(" of ")
        known_names = sorted({subject for _, subject, _ in prompt.env})
        actions: list[str] = []
        current = start
        for relation in reversed(outermost_first):
            looked_relation, looked_name = relation, current
            if rng.random() < error_rate:
                if rng.random() < 0.5:
                    looked_relation = _pick(rng, [other for other in RELATIONS if other != relation])
                else:
                    lookalikes = [name for name in known_names if _differ_by_one_letter(name, current)]
                    looked_name = _pick(rng, lookalikes) if lookalikes else _similar_name(current, rng)
            actions.append(f"LOOKUP {looked_relation} {looked_name}")
            current = _result_of(self.step(prompt, actions))
            if current == NONE_ANSWER:
                break
        answer = current
        if rng.random() < error_rate:
            if current == NONE_ANSWER:
                answer = _pick(rng, known_names)
            else:
                answer = _pick(rng, [NONE_ANSWER, _similar_name(current, rng)])
        actions.append(f"{ANSWER_COMMAND} {answer}")
        return actions

    def step(self, prompt: Prompt, actions: Sequence[str]) -> Observation:
        return episode_step(prompt, actions, self.max_turns, functools.partial(_lookup, _knowledge(prompt)))


def _lookup(knowledge: dict[tuple[str, str], str], action: str) -> str:
    words = action.split()
    if len(words) != 3 or words[0] != "LOOKUP":
        return UNKNOWN_ACTION
    relation, name = words[1], words[2]
    if relation not in RELATIONS:
        return "ERROR unknown relation"
    return f"{RESULT_PREFIX}{knowledge.get((relation, name), NONE_ANSWER)}"


TASKS: Final[dict[str, type[Task]]] = {
    ToolArithmetic.name: ToolArithmetic,
    MultiHopLookup.name: MultiHopLookup,
}
