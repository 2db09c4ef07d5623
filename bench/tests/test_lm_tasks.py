"""The language-model benchmark's vocabulary, transcript layout and tool tasks: prompts reproducible and
writable in the vocabulary, demonstrations that solve them (or fail when noisy), and `step` a pure function
of the history, which is what lets an episode resume from any turn boundary."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.lm.tasks import TASKS, MultiHopLookup, Observation, Prompt, Task, ToolArithmetic
from bench.lm.vocab import ALPHABET, BOS, EOT, PAD, SEP, VOCAB_SIZE, decode, encode, prefix, transcript

TASK_NAMES = sorted(TASKS)


def make_task(name: str) -> Task:
    return TASKS[name]()


def play(task: Task, prompt: Prompt, actions: list[str]) -> list[Observation]:
    return [task.step(prompt, actions[: turn + 1]) for turn in range(len(actions))]


def solves(task: Task, prompt: Prompt, actions: list[str]) -> bool:
    final = task.step(prompt, actions)
    assert final.done
    return final.reward == 1.0


# --- vocabulary ---------------------------------------------------------------------------------------


@given(st.text(alphabet=ALPHABET))
def test_encode_decode_round_trip(text: str) -> None:
    ids = encode(text)
    assert all(4 <= token < VOCAB_SIZE for token in ids)
    assert decode(ids) == text


def test_ids_are_fixed() -> None:
    assert (PAD, BOS, EOT, SEP, VOCAB_SIZE) == (0, 1, 2, 3, 80)
    assert encode("09azAZ") == [4, 13, 14, 39, 40, 65]
    assert encode(" +-*/=:?,._()'") == list(range(66, 80))


def test_unknown_character_raises_naming_it() -> None:
    with pytest.raises(ValueError, match="'#'"):
        encode("a#b")


def test_decode_skips_special_ids() -> None:
    assert decode([BOS, *encode("ab"), EOT, PAD, *encode("c"), SEP]) == "abc"


def test_transcript_layout_and_action_spans() -> None:
    laid_out = transcript("a1", [("b", "2"), ("Z", "")])
    #                      BOS  a   1  SEP  b  EOT  2  SEP  Z  EOT SEP
    assert laid_out.ids == [1, 14, 5, 3, 15, 2, 6, 3, 65, 2, 3]
    assert laid_out.action_spans == [(4, 6), (8, 10)]
    assert [decode(laid_out.ids[start:end]) for start, end in laid_out.action_spans] == ["b", "Z"]
    assert all(laid_out.ids[end - 1] == EOT for _, end in laid_out.action_spans)
    assert prefix("a1", [("b", "2")]) == laid_out.ids[:8]
    assert prefix("a1", []) == [BOS, 14, 5, SEP]


# --- every task ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TASK_NAMES)
def test_prompts_are_deterministic_per_seed_and_unique(name: str) -> None:
    task = make_task(name)
    first = task.sample_prompts(np.random.default_rng(7), 200)
    assert first == make_task(name).sample_prompts(np.random.default_rng(7), 200)
    assert first != task.sample_prompts(np.random.default_rng(8), 200)
    rng = np.random.default_rng(9)
    ids = [prompt.prompt_id for prompt in task.sample_prompts(rng, 200) + task.sample_prompts(rng, 200)]
    assert len(set(ids)) == len(ids)
    assert all(hash(prompt) is not None for prompt in first)  # frozen and hashable, env included


@pytest.mark.parametrize("name", TASK_NAMES)
def test_difficulty_spans_the_range(name: str) -> None:
    difficulties = [
        prompt.difficulty for prompt in make_task(name).sample_prompts(np.random.default_rng(1), 300)
    ]
    assert all(0.0 <= difficulty <= 1.0 for difficulty in difficulties)
    assert min(difficulties) <= 0.1 and max(difficulties) >= 0.9
    assert np.std(difficulties) > 0.2


@pytest.mark.parametrize("name", TASK_NAMES)
@pytest.mark.parametrize("error_rate", [0.0, 0.5, 1.0])
def test_texts_are_in_the_alphabet_and_actions_fit(name: str, error_rate: float) -> None:
    task = make_task(name)
    rng = np.random.default_rng(2)
    for prompt in task.sample_prompts(rng, 200):
        actions = task.demonstration(prompt, rng, error_rate)
        observations = play(task, prompt, actions)
        for text in [
            prompt.text,
            prompt.answer,
            *actions,
            *(observation.text for observation in observations),
        ]:
            encode(text)
        assert max(len(action) for action in actions) <= task.max_action_chars
        transcript(prompt.text, [(a, o.text) for a, o in zip(actions, observations, strict=True)])


@pytest.mark.parametrize("name", TASK_NAMES)
def test_noiseless_demonstration_solves_every_prompt(name: str) -> None:
    task = make_task(name)
    rng = np.random.default_rng(3)
    for prompt in task.sample_prompts(rng, 300):
        actions = task.demonstration(prompt, rng, 0.0)
        observations = play(task, prompt, actions)
        assert len(actions) <= task.max_turns
        assert observations[-1] == Observation("CORRECT", done=True, reward=1.0)
        assert all(not observation.done and observation.reward is None for observation in observations[:-1])
        assert all(observation.text.startswith("RESULT ") for observation in observations[:-1])


@pytest.mark.parametrize("name", TASK_NAMES)
def test_fully_noisy_demonstrations_mostly_fail(name: str) -> None:
    task = make_task(name)
    rng = np.random.default_rng(4)
    prompts = task.sample_prompts(rng, 300)
    assert np.mean([solves(task, prompt, task.demonstration(prompt, rng, 1.0)) for prompt in prompts]) < 0.2


@pytest.mark.parametrize("name", TASK_NAMES)
def test_some_noise_fails_some_demonstrations(name: str) -> None:
    task = make_task(name)
    rng = np.random.default_rng(5)
    prompts = task.sample_prompts(rng, 300)
    success = np.mean([solves(task, prompt, task.demonstration(prompt, rng, 0.2)) for prompt in prompts])
    assert 0.3 < success < 0.95


@pytest.mark.parametrize("name", TASK_NAMES)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), error_rate=st.sampled_from([0.0, 0.3, 1.0]))
def test_step_is_a_pure_function_of_the_history(name: str, seed: int, error_rate: float) -> None:
    task = make_task(name)
    rng = np.random.default_rng(seed)
    prompt = task.sample_prompts(rng, 1)[0]
    actions = task.demonstration(prompt, rng, error_rate)
    recorded = play(task, prompt, actions)
    for turn in range(1, len(actions) + 1):
        assert make_task(name).step(prompt, actions[:turn]) == recorded[turn - 1]


MALFORMED = ["", "hello", "CALL", "LOOKUP father", "ANSWERx 3", "call add 1 2", "CALL pow 2 3"]


@pytest.mark.parametrize("name", TASK_NAMES)
@pytest.mark.parametrize("action", MALFORMED)
def test_malformed_action_is_an_error_that_does_not_end(name: str, action: str) -> None:
    task = make_task(name)
    prompt = task.sample_prompts(np.random.default_rng(6), 1)[0]
    observation = task.step(prompt, [action])
    assert observation == Observation("ERROR unknown action", done=False, reward=None)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_max_turns_without_an_answer_ends_with_reward_zero(name: str) -> None:
    task = make_task(name)
    rng = np.random.default_rng(7)
    prompt = task.sample_prompts(rng, 1)[0]
    tool_call = task.demonstration(prompt, rng, 0.0)[0]
    actions = ["hello", *[tool_call] * (task.max_turns - 1)]
    observations = play(task, prompt, actions)
    assert all(not observation.done for observation in observations[:-1])
    assert observations[-1].done and observations[-1].reward == 0.0
    assert observations[-1].text == observations[-2].text  # still the tool's answer
    with pytest.raises(ValueError, match="actions"):
        task.step(prompt, [*actions, tool_call])


@pytest.mark.parametrize("name", TASK_NAMES)
def test_answer_is_an_exact_match_after_strip_and_ends_the_episode(name: str) -> None:
    task = make_task(name)
    prompt = task.sample_prompts(np.random.default_rng(8), 1)[0]
    assert task.step(prompt, [f"  ANSWER   {prompt.answer}  "]).reward == 1.0
    assert task.step(prompt, [f"ANSWER {prompt.answer}0"]) == Observation("WRONG", done=True, reward=0.0)
    assert task.step(prompt, ["ANSWER"]).reward == 0.0
    assert task.step(prompt, ["hello", f"ANSWER {prompt.answer}"]).reward == 1.0
    with pytest.raises(ValueError, match="ended"):
        task.step(prompt, [f"ANSWER {prompt.answer}", "hello"])
    with pytest.raises(ValueError, match="actions"):
        task.step(prompt, [])


# --- arithmetic ---------------------------------------------------------------------------------------


def test_arithmetic_questions_are_short_and_evaluate_left_to_right() -> None:
    task = ToolArithmetic()
    rng = np.random.default_rng(10)
    for prompt in task.sample_prompts(rng, 300):
        assert len(prompt.text) <= 24
        expression = prompt.text.removeprefix("Q: ")
        assert int(prompt.answer) == eval(expression)  # an independent oracle: the parentheses are explicit
        actions = task.demonstration(prompt, rng, 0.0)
        assert len(actions) == expression.count("(") + 2  # one call per operation, then the answer
        assert max(len(action) for action in actions) <= 20


def test_calculator() -> None:
    task = ToolArithmetic()
    prompt = task.sample_prompts(np.random.default_rng(11), 1)[0]

    def answer(action: str) -> str:
        return task.step(prompt, [action]).text

    assert answer("CALL add 37 48") == "RESULT 85"
    assert answer("CALL sub 12 -30") == "RESULT 42"
    assert answer("CALL mul -7 6") == "RESULT -42"
    assert answer("CALL add 1.5 2") == "ERROR not an integer"
    assert answer("CALL add x 2") == "ERROR not an integer"
    assert answer("CALL mul 1234567890 2") == "ERROR number too large"
    assert answer("CALL add 1 2 3") == "ERROR unknown action"


# --- lookup -------------------------------------------------------------------------------------------


def test_lookup_questions_chain_one_to_four_hops_over_a_knowledge_base() -> None:
    prompts = MultiHopLookup().sample_prompts(np.random.default_rng(12), 300)
    hops = [prompt.text.count(" of ") for prompt in prompts]
    assert set(hops) == {1, 2, 3, 4}
    for prompt in prompts:
        start = prompt.text.rsplit(" ", 1)[-1]
        assert len(start) == 4 and start != prompt.answer
        if prompt.answer != "none":  # a broken first link may leave the start with no entry at all
            assert start in {subject for _, subject, _ in prompt.env}
    with_lookalikes = [
        prompt
        for prompt in prompts
        if any(
            sum(a != b for a, b in zip(first, second, strict=True)) == 1
            for first in {subject for _, subject, _ in prompt.env}
            for second in {subject for _, subject, _ in prompt.env}
        )
    ]
    assert len(with_lookalikes) > len(prompts) / 2


def test_lookup_tool() -> None:
    task = MultiHopLookup()
    prompt = task.sample_prompts(np.random.default_rng(13), 1)[0]
    relation, subject, target = prompt.env[0]
    assert task.step(prompt, [f"LOOKUP {relation} {subject}"]).text == f"RESULT {target}"
    assert task.step(prompt, ["LOOKUP father nobody"]).text == "RESULT none"
    assert task.step(prompt, [f"LOOKUP cousin {subject}"]).text == "ERROR unknown relation"


def test_missing_links_make_the_answer_none_and_the_demonstration_reaches_it() -> None:
    task = MultiHopLookup()
    rng = np.random.default_rng(14)
    prompts = task.sample_prompts(rng, 400)
    broken = [prompt for prompt in prompts if prompt.answer == "none"]
    assert 0.08 < len(broken) / len(prompts) < 0.25
    for prompt in broken:
        actions = task.demonstration(prompt, rng, 0.0)
        observations = play(task, prompt, actions)
        assert actions[-1] == "ANSWER none" and observations[-1].reward == 1.0
        assert observations[-2].text == "RESULT none"
