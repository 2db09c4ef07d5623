"""Each family speaks its own words in its own shape, and its text carries real but noisy signal."""

import itertools
import json
import re

import numpy as np
import pytest
from family_support import ALL_FAMILIES, POLICY_FAMILIES, policy_workload, root_success

from trace_lab.sim import FAMILIES, RolloutState, SimWorkload, TabularWorkload, make_workload
from trace_lab.sim.lexicon import MATH_SPELLING, MAZE_SPELLING, MULTIHOP_SPELLING, TOOLCALL_SPELLING


def tokens(text: str) -> set[str]:
    """Words of a text. Numbers (equation coefficients, error codes) are no family's words and are left
    out; JSON punctuation and the like are not \\w and never reach here."""
    return {token for token in re.findall(r"\w+", text.lower()) if not token.isdigit()}


def sampled_texts(family: str) -> list[str]:
    workload = make_workload(family, 0, 256)
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts for _ in range(4)]
    turns = [
        state.history[-1].text
        for trajectory in workload.run(starts, np.random.default_rng(0))
        for state in trajectory
    ]
    return [prompt.text for prompt in workload.prompts] + turns


def test_no_word_is_shared_between_families() -> None:
    words = {family: set().union(*map(tokens, sampled_texts(family))) for family in ALL_FAMILIES}
    for a, b in itertools.combinations(ALL_FAMILIES, 2):
        assert not words[a] & words[b], f"{a} and {b} share {sorted(words[a] & words[b])[:10]}"
    assert all(len(family_words) > 500 for family_words in words.values())


def test_spelling_rules_keep_generated_words_apart() -> None:
    """Every word holds its family's marker letters and no other family's; ReAct words hold none."""
    spellings = {
        "math": MATH_SPELLING,
        "multihop": MULTIHOP_SPELLING,
        "toolcall": TOOLCALL_SPELLING,
        "maze": MAZE_SPELLING,
    }
    markers = set().union(*(spelling.markers for spelling in spellings.values()))
    for family, spelling in spellings.items():
        workload = policy_workload(family, 0, 8)
        for word in workload.lexicon.words:
            assert set(word) & spelling.markers and not set(word) & (markers - spelling.markers)
    react = make_workload("react", 0, 8)
    assert isinstance(react, SimWorkload)
    assert not set("".join(react.vocabulary.words)) & markers


def graded_scores(workload: TabularWorkload, word_class: str, levels: int) -> np.ndarray:
    """Mean level of each prompt's graded words (the middle level where it has none)."""
    lexicon = workload.lexicon
    per_level = lexicon.size[word_class] // levels
    begin = lexicon.start[word_class]
    level = {lexicon.words[begin + index]: index // per_level for index in range(lexicon.size[word_class])}
    return np.array(
        [
            np.mean([level[word] for word in tokens(prompt.text) if word in level] or [(levels - 1) / 2])
            for prompt in workload.prompts
        ]
    )


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(y)))[0, 1])


def test_prompts_tell_difficulty_noisily_and_the_families_differ_in_how_clearly() -> None:
    classes = {"math": "difficulty", "multihop": "prominence", "toolcall": "difficulty"}
    signal = {}
    for family, word_class in classes.items():
        workload = policy_workload(family, 1, 2048)
        signal[family] = spearman(graded_scores(workload, word_class, 7), root_success(workload))
    assert 0.3 < signal["toolcall"] < signal["math"] < signal["multihop"] < 0.95


def rolled_steps(family: str) -> tuple[TabularWorkload, list[tuple[RolloutState, RolloutState]]]:
    """A family's workload and every (before, after) pair of turns of 4 rollouts of 512 tasks."""
    workload = policy_workload(family, 2, 512)
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts for _ in range(4)]
    pairs = [
        pair
        for start, trajectory in zip(starts, workload.run(starts, np.random.default_rng(1)), strict=True)
        for pair in zip((start, *trajectory[:-1]), trajectory, strict=True)
    ]
    return workload, pairs


def class_words(workload: TabularWorkload, word_class: str) -> set[str]:
    begin = workload.lexicon.start[word_class]
    return set(workload.lexicon.words[begin : begin + workload.lexicon.size[word_class]])


def cue_share(texts: list[str], positive: set[str], negative: set[str]) -> float:
    """The share of positive words among the texts' cue words (repeats counted)."""
    words = [word for text in texts for word in text.lower().split()]
    good, bad = sum(word in positive for word in words), sum(word in negative for word in words)
    return good / (good + bad)


def test_math_turns_are_steps_then_an_answer_with_noisy_verdicts() -> None:
    """Verdict words say whether a step was sound (or the answer right) at 1 − verdict_flip."""
    workload, pairs = rolled_steps("math")
    by_outcome: dict[bool, list[str]] = {True: [], False: []}
    for before, after in pairs:
        text = after.history[-1].text
        assert re.fullmatch(r"(step \d+ via \w+: \d+ x = \d+|so via \w+ x = \d+ boxed)( \w+)*", text)
        assert text.startswith("so via") == after.done
        sound = not after.done and after.latent[0] > before.latent[0]
        by_outcome[sound or after.reward == 1.0].append(text)
    sound_words, unsound_words = class_words(workload, "sound"), class_words(workload, "unsound")
    flip = workload.config.verdict_flip
    assert abs(cue_share(by_outcome[True], sound_words, unsound_words) - (1 - flip)) < 0.05
    assert abs(cue_share(by_outcome[False], sound_words, unsound_words) - flip) < 0.05


def test_multihop_turns_are_searches_with_documents_then_an_answer() -> None:
    """A found document holds relevance cues at 1 − document_flip, a missed one at document_flip, a
    misleading one (on track, or any "find" once derailed) at misled_relevance."""
    workload, pairs = rolled_steps("multihop")
    position = {prompt.prompt_id: index for index, prompt in enumerate(workload.prompts)}
    documents: dict[str, list[str]] = {"found": [], "missed": [], "misled": []}
    for before, after in pairs:
        text = after.history[-1].text
        if after.done:
            assert re.fullmatch(r"final answer: [A-Z]\w+", text)
            continue
        query, document = text.split("\n")
        assert re.fullmatch(r"search \w+ [A-Z]\w+ \w+", query)
        assert re.fullmatch(r"doc [A-Z]\w+:( \w+)*", document)
        derailed_before, derailed_after = workload.is_derailed(np.array([before.latent[0], after.latent[0]]))
        believed_before, believed_after = workload.believed_documents(
            np.array([before.latent[0], after.latent[0]])
        )
        if derailed_after and (not derailed_before or believed_after > believed_before):
            documents["misled"].append(document)
        elif believed_after > believed_before:
            documents["found"].append(document)
        elif before.latent[0] < workload.hops[position[after.prompt_id]] or derailed_before:
            documents["missed"].append(document)  # a document was still to find, and was not
    relevant, irrelevant = class_words(workload, "relevant"), class_words(workload, "irrelevant")
    config = workload.config
    expected = {
        "found": 1 - config.document_flip,
        "missed": config.document_flip,
        "misled": config.misled_relevance,
    }
    for outcome, share in expected.items():
        assert len(documents[outcome]) > 200
        assert abs(cue_share(documents[outcome], relevant, irrelevant) - share) < 0.05, outcome


def test_toolcall_turns_are_json_calls_and_responses() -> None:
    """The response's status tells exactly whether the call went through; an error's retryable flag
    tells a recoverable error from a fatal one at 1 − retryable_flip."""
    workload, pairs = rolled_steps("toolcall")
    flags: dict[bool, list[bool]] = {True: [], False: []}  # recoverable? -> retryable flags shown
    for before, after in pairs:
        call, response = (json.loads(line) for line in after.history[-1].text.split("\n"))
        assert set(call) == {"call", "arguments"} and isinstance(call["arguments"], dict)
        went_through = after.reward == 1.0 or (
            not after.done and after.latent[0] // 2 > before.latent[0] // 2
        )
        out_of_turns = after.done and after.turns == workload.max_turns and response["status"] == "ok"
        assert (response["status"] == "ok") == (went_through or out_of_turns)
        if response["status"] == "error":
            flags[not after.done].append(response["retryable"])
    flip = workload.config.retryable_flip
    assert abs(np.mean(flags[True]) - (1 - flip)) < 0.05
    assert abs(np.mean(flags[False]) - flip) < 0.05


@pytest.mark.parametrize("family", POLICY_FAMILIES)
def test_prompts_show_the_visible_type(family: str) -> None:
    """The prompt names the type the agent sees (its context), which is the true type but for noise."""
    workload = policy_workload(family, 3, 1024)
    if family == "math":
        visible, true, noise = workload.visible_topic, workload.topic, workload.config.topic_noise
        shown = [
            int(workload.lexicon.words.index(p.text.split()[1].rstrip(":")) - workload.lexicon.start["topic"])
            // 3
            for p in workload.prompts
        ]
    elif family == "multihop":
        visible, true, noise = workload.visible_kind, workload.kind, workload.config.kind_noise
        relation = workload.lexicon.start["relation"]
        shown = [(workload.lexicon.words.index(p.text.split()[1]) - relation) // 4 for p in workload.prompts]
    elif family == "maze":
        visible, true, noise = workload.visible_layout, workload.layout, workload.config.layout_noise
        layout = workload.lexicon.start["layout"]
        shown = [(workload.lexicon.words.index(p.text.split()[1]) - layout) // 3 for p in workload.prompts]
    else:
        visible, true, noise = workload.visible_api, workload.api, workload.config.api_noise
        apis = [tools[0].split("_")[0] for tools in workload.tool_names]
        shown = [apis.index(p.text.split('tools: ["')[1].split("_")[0]) for p in workload.prompts]
    np.testing.assert_array_equal(shown, visible)
    assert abs(np.mean(visible != true) - noise) < 0.05
    assert len(np.unique([workload.context_of(workload.start(p.prompt_id)) for p in workload.prompts])) > 1


@pytest.mark.parametrize("family", POLICY_FAMILIES)
def test_features_follow_the_conditional_success(family: str) -> None:
    workload = FAMILIES[family](1, 256, feature_dim=6)
    assert all(prompt.features is not None and len(prompt.features) == 6 for prompt in workload.prompts)
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts]
    states = [
        state for trajectory in workload.run(starts, np.random.default_rng(0)) for state in trajectory[:-1]
    ]
    states = [state for state in states if 1e-6 < state.p < 1 - 1e-6]
    features = np.array([state.history[-1].features for state in states])
    logit = np.clip(np.log([state.p / (1 - state.p) for state in states]), -6, 6)
    design = np.column_stack([features, np.ones(len(states))])
    coefficients, *_ = np.linalg.lstsq(design, logit, rcond=None)
    assert 0.5 < np.corrcoef(design @ coefficients, logit)[0, 1] < 0.99
    assert make_workload(family, 1, 8).prompts[0].features is None
