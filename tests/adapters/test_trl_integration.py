"""`trace_client.integrations.trl` against the installed TRL: the rows of hand-built and random trees, the
rewards that TRL's group normalisation turns into the trees' advantages, and `GRPOTrainer` training a
tiny randomly initialised model for three steps on a two-turn task against a live service."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from adapter_trees import finished_tree
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from support import make_settings
from toy_environments import Countdown
from transformers import PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from trace_client.driver import History, TurnResult, TurnTokens
from trace_client.integrations.trl import (
    RowCapacityError,
    TraceRollout,
    TraceSettings,
    TraceStep,
    TrainingRow,
    pack_rows,
    prompt_token_ids,
    rows_per_bare_rollout,
    safe_budget,
    stable_prompt_id,
    training_rows,
)
from trace_client.integrations.trl import rollout as rollout_module
from trace_lab.local import ThreadedService
from trace_proto import PromptIn
from trace_service.allocation.tree import advantages, tree_targets

#: TRL warns that `rollout_func` is experimental: known, and what the integration is written against.
pytestmark = [
    pytest.mark.framework,
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func':UserWarning"),
]

# n0 ── n1 ─┬─ n2 ── n3 ── n4 (leaf 1.0)        n6 ── n7 ── n8 (leaf 0.0)
#           └─ n5 (leaf 0.0, a continuation branched from n1)
PARENTS = [-1, 0, 1, 2, 3, 1, -1, 6, 7]
REWARDS = {4: 1.0, 5: 0.0, 8: 0.0}
TOKENS = {i: TurnTokens((10 + i, 20 + i), mask=(1, 0)) for i in range(len(PARENTS))}


def service_tree(parents: list[int], rewards: dict[int, float], tokens: dict[int, TurnTokens]) -> Any:
    """A finished tree whose advantages are the service's own (`trace_service.allocation.tree`)."""
    reward = [rewards.get(i, math.nan) for i in range(len(parents))]
    values = advantages(parents, tree_targets(parents, reward)).tolist()
    return finished_tree(parents, rewards, advantages=values, tokens=tokens)


def test_a_row_is_a_stretch_of_one_advantage_after_its_context() -> None:
    tree = service_tree(PARENTS, REWARDS, TOKENS)
    advantage = {node.node_id: node.advantage for node in tree.tree.nodes}
    rows = training_rows(tree, [1, 2])
    # the advantage changes at a first turn, at a second turn, and at the two turns below a branch point
    assert [row.node_ids for row in rows] == [
        ("n0",),
        ("n1",),
        ("n2",),
        ("n3", "n4"),
        ("n5",),
        ("n6",),
        ("n7", "n8"),
    ]
    by_nodes = {row.node_ids: row for row in rows}
    stretch = by_nodes[("n3", "n4")]
    assert stretch.prompt_ids == (1, 2, 10, 20, 11, 21, 12, 22)  # the prompt, then n0 to n2 as context
    assert stretch.completion_ids == (13, 23, 14, 24) and stretch.loss_mask == (1, 0, 1, 0)
    assert stretch.advantage == advantage["n3"] == advantage["n4"] and stretch.leaf_reward == 1.0
    # the continuation trains its own turn only; the shared prefix is context
    assert by_nodes[("n5",)].prompt_ids == (1, 2, 10, 20, 11, 21)
    for row in rows:
        assert all(advantage[node] == row.advantage for node in row.node_ids)
    trained = Counter(node for row in rows for node in row.node_ids)
    assert trained == Counter(f"n{i}" for i in range(len(PARENTS)))  # every turn once


def test_a_stretch_of_environment_tokens_alone_makes_no_row_and_stays_context() -> None:
    tokens = {**TOKENS, 0: TurnTokens((30, 31), mask=(0, 0))}
    rows = training_rows(service_tree(PARENTS, REWARDS, tokens), [1])
    assert ("n0",) not in [row.node_ids for row in rows]
    assert next(row for row in rows if row.node_ids == ("n1",)).prompt_ids == (1, 30, 31)


def test_a_turn_without_tokens_is_refused() -> None:
    tree = service_tree(PARENTS, REWARDS, {i: t for i, t in TOKENS.items() if i != 4})
    with pytest.raises(ValueError, match="carries no tokens"):
        training_rows(tree, [1])


def row(advantage: float) -> TrainingRow:
    return TrainingRow("t", "p", ("n",), (1,), (2,), (1,), advantage, 1.0)


def test_trls_group_normalisation_gives_each_packed_row_its_advantage() -> None:
    rows = [row(a) for a in (0.5, -0.25, 1.0, 0.75, -1.0)]
    packed = pack_rows(rows, slots=12, group_size=4)
    assert [slot.row for slot in packed if slot.row] == rows
    assert all(slot.row is None for slot in packed[3::4])  # every group keeps a filler
    rewards = torch.tensor([slot.trl_reward for slot in packed])
    # GRPOTrainer with scale_rewards="none": reward minus the mean of its group of num_generations rows
    trl_advantages = rewards - rewards.view(-1, 4).mean(dim=1).repeat_interleave(4)
    for slot, value in zip(packed, trl_advantages.tolist(), strict=True):
        if slot.row is not None:
            assert value == pytest.approx(slot.row.advantage, abs=1e-6)


def test_rows_beyond_the_batch_are_refused_not_dropped() -> None:
    with pytest.raises(RowCapacityError, match="7 rows"):
        pack_rows([row(0.0)] * 7, slots=8, group_size=4)
    with pytest.raises(ValueError, match="whole groups"):
        pack_rows([], slots=6, group_size=4)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), bare=st.integers(2, 6), expansion=st.sampled_from([0.0, 0.5, 1.0, 2.0])
)
def test_the_rows_of_any_tree_stay_within_the_bound_the_default_budget_rests_on(
    seed: int, bare: int, expansion: float
) -> None:
    rng = random.Random(seed)
    max_turns = rng.randint(1, 6)
    parents: list[int] = []
    rewards: dict[int, float] = {}

    def rollout(parent: int, depth: int) -> None:
        for _ in range(depth, rng.randint(depth, max_turns) + 1):
            parents.append(parent)
            parent = len(parents) - 1
        rewards[parent] = float(rng.random() < 0.5)

    for _ in range(bare):
        rollout(-1, 1)
    for _ in range(math.floor(bare * expansion)):
        inner = [i for i in range(len(parents)) if i not in rewards]
        if inner:
            source = rng.choice(inner)
            depth = 1 + sum(1 for _ in _ancestors(parents, source))
            rollout(source, depth + 1)
    tokens = {i: TurnTokens((i,)) for i in range(len(parents))}
    rows = training_rows(service_tree(parents, rewards, tokens), [0])
    assert len(rows) <= bare * rows_per_bare_rollout(expansion, max_turns)


def _ancestors(parents: list[int], node: int) -> Any:
    while parents[node] >= 0:
        node = parents[node]
        yield node


def test_the_default_budget_fits_the_batch_or_asks_for_a_larger_one() -> None:
    assert safe_budget(32, 8, expansion=1.0, max_turns=8) == 4  # 28 rows, 6 per bare rollout
    assert safe_budget(32, 8, expansion=1.0, max_turns=1) == 14  # one turn: a row per rollout
    with pytest.raises(ValueError, match="too few"):
        TraceRollout(TraceSettings(expansion=2.0), score=lambda p, r: 0.0)._budget(8, 4)


def test_trainer_settings_that_would_change_the_advantages_are_refused(tmp_path: Path) -> None:
    rollout = TraceRollout(score=lambda prompt, response: 0.0)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", loss_type="grpo")
    trainer: Any = SimpleNamespace(
        args=args, model=SimpleNamespace(training=True), reward_funcs=[rollout.trace_advantage], tools=None
    )
    with pytest.raises(ValueError, match="scale_rewards must be 'none'") as refused:
        rollout(["q:1"] * 8, trainer)
    assert "loss_type must be one of" in str(refused.value)
    trainer.model.training = False
    with pytest.raises(ValueError, match="training batches only"):
        rollout(["q:1"] * 8, trainer)


def test_a_rollout_needs_a_scorer_or_its_own_turns() -> None:
    with pytest.raises(ValueError, match="pass score"):
        TraceRollout()
    TraceRollout(environment_factory=lambda _: Countdown())  # the environment's rewards score it


async def test_turns_asked_for_together_are_generated_as_one_batch() -> None:
    batches: list[list[Any]] = []

    def generate(requests: list[Any]) -> list[list[int]]:
        batches.append(requests)
        return [[len(context), limit] for context, limit in requests]

    batcher = rollout_module._GenerationBatcher(generate)
    answers = await asyncio.gather(*(batcher.generate([0] * k, k + 1) for k in range(5)))
    assert answers == [[k, k + 1] for k in range(5)] and len(batches) == 1
    assert batcher.error is None


async def test_a_generation_error_reaches_every_waiting_turn_and_is_kept() -> None:
    def generate(requests: list[Any]) -> list[list[int]]:
        raise RuntimeError("out of memory")

    batcher = rollout_module._GenerationBatcher(generate)
    answers = await asyncio.gather(*(batcher.generate([1], 2) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(answer, RuntimeError) for answer in answers)
    assert isinstance(batcher.error, RuntimeError)


# --- GRPOTrainer on a live service -----------------------------------------------------------------------

CHARACTERS = "0123456789q:|"
PROMPTS = [f"q:{digit}" for digit in range(8)]


def load_example() -> Any:
    """examples/trl/train.py as a module: its tiny model and tokenizer serve the tests too."""
    path = Path(__file__).resolve().parents[2] / "examples" / "trl" / "train.py"
    spec = importlib.util.spec_from_file_location("trl_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


EXAMPLE = load_example()


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, built in code, with a chat template for conversational prompts."""
    tokenizer: PreTrainedTokenizerFast = EXAMPLE.char_tokenizer(CHARACTERS)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}:{% endif %}"
    )
    return tokenizer


def test_a_conversational_prompt_goes_through_the_chat_template() -> None:
    tokenizer = char_tokenizer()
    assert prompt_token_ids([{"role": "user", "content": "q3"}], tokenizer) == tokenizer("q3:")["input_ids"]
    assert prompt_token_ids("q:3", tokenizer) == tokenizer("q:3")["input_ids"]


async def test_with_an_environment_factory_a_turn_acts_and_its_tokens_go_on_with_the_observation() -> None:
    tokenizer = char_tokenizer()

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False))

    contexts: list[list[int]] = []

    def generate(requests: list[Any]) -> list[list[int]]:
        contexts.extend(context for context, _ in requests)
        return [list(ids("5")) for _ in requests]

    rollout = TraceRollout(TraceSettings(turn_tokens=2), environment_factory=lambda _: Countdown())
    rollout._trainer = SimpleNamespace(processing_class=tokenizer)  # type: ignore[assignment]
    rollout._batcher = rollout_module._GenerationBatcher(generate)
    prompt_ids = list(ids("q:1"))
    rollout._prompts["q"] = ("q:1", prompt_ids)
    worker = rollout._environment_worker()
    assert worker is not None
    history = History(PromptIn(prompt_id="q"), "tree")
    while history.last_turn is None or not history.last_turn.done:
        history = history.then(await worker.next_turn(history))
    assert history.depth == 2
    assert history.turns[-1].reward == 1.0
    first, second = (turn.tokens for turn in history.turns)
    assert first is not None and second is not None
    assert first.ids == (*ids("2"), *ids("5"), *ids("1"))  # the first observation, the action, the answer
    assert first.mask == (0,) * len(ids("2")) + (1,) * len(ids("5")) + (0,) * len(ids("1"))
    assert second.ids == (*ids("5"), *ids("0"))
    assert contexts == [[*prompt_ids, *ids("2")], [*prompt_ids, *first.ids]]


class GuessTheDigit(TraceRollout):
    """Two turns: a try of up to three characters, the environment's '|', a second try. Success when the
    prompt's digit is among the tries. Records each step and what the trainer's reward function saw."""

    def __init__(self, settings: TraceSettings) -> None:
        super().__init__(settings)
        self.steps: list[TraceStep] = []
        self.seen: list[dict[str, list[Any]]] = []

    async def next_turn(self, history: History) -> TurnResult:
        ids = await self.generate(self.context_ids(history), 3)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if history.depth == 0:
            hint = self.tokenizer("|")["input_ids"]
            return TurnResult(
                text=text, tokens=TurnTokens((*ids, *hint), mask=(1,) * len(ids) + (0,) * len(hint))
            )
        tries = "".join(turn.text or "" for turn in history.turns) + text
        target = str(self.prompt(history))[-1]
        return TurnResult(text=text, done=True, reward=float(target in tries), tokens=TurnTokens(tuple(ids)))

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        output = super().__call__(prompts, trainer)
        assert self.last_step is not None
        self.steps.append(self.last_step)
        return output

    def trace_advantage(self, *, trace_trl_reward: list[float], **kwargs: Any) -> list[float]:
        self.seen.append({key: list(value) for key, value in kwargs.items() if key.startswith("trace_")})
        return super().trace_advantage(trace_trl_reward=trace_trl_reward, **kwargs)


class RecordingTrainer(GRPOTrainer):
    """GRPOTrainer that keeps each batch's rows as its loss sees them: their tokens and advantages."""

    batches: list[dict[str, torch.Tensor]]

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask", "advantages")
        self.batches.append({key: inputs[key].detach().clone() for key in keys})
        return super().compute_loss(model, inputs, *args, **kwargs)


def trained_rows(batch: dict[str, torch.Tensor]) -> list[tuple[tuple[int, ...], tuple[int, ...], float]]:
    """The batch's rows that train a token: prompt tokens, completion tokens, advantage."""
    rows = []
    for k in range(len(batch["advantages"])):
        if not (batch["completion_mask"][k] * batch["tool_mask"][k]).any():
            continue
        prompt = tuple(batch["prompt_ids"][k][batch["prompt_mask"][k].bool()].tolist())
        completion = tuple(batch["completion_ids"][k][batch["completion_mask"][k].bool()].tolist())
        rows.append((prompt, completion, float(batch["advantages"][k])))
    return sorted(rows)


@pytest.mark.slow
def test_grpo_trainer_trains_on_the_services_trees(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tokenizer = char_tokenizer()
    model = EXAMPLE.tiny_llama(tokenizer)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=32,  # 4 prompts × num_generations 8: 28 rows and 4 fillers
        num_generations=8,
        max_steps=3,
        learning_rate=1e-3,
        max_completion_length=16,
        scale_rewards="none",
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    with ThreadedService.from_settings(
        make_settings(train_interval_seconds=60.0, sweep_interval_seconds=60.0)
    ) as live:
        rollout = GuessTheDigit(TraceSettings(url=live.url, job="trl-test", expansion=1.0, max_turns=2))
        trainer = RecordingTrainer(
            model=model,
            reward_funcs=[rollout.trace_advantage],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
            processing_class=tokenizer,
            rollout_func=rollout,
        )
        trainer.batches = []
        trainer.train()

    assert len(rollout.steps) == len(rollout.seen) == len(trainer.batches) == 3
    continuations = 0
    for step, seen, batch in zip(rollout.steps, rollout.seen, trainer.batches, strict=True):
        allocation = step.allocation
        # the default budget: 28 rows, at most 4 per bare rollout of two turns with its continuation
        assert step.capacity == 28 and allocation.budget == 7
        assert allocation.skipped, "7 bare rollouts, 2 at least per tree: one prompt of four gets none"
        # the allocation's counts reached the trainer: each tree's bare rollouts are trained, no more
        nodes_seen = {
            (tree, node)
            for tree, nodes in zip(seen["trace_tree_id"], seen["trace_node_ids"], strict=True)
            for node in nodes
        }
        for finished in step.result.trees:
            first_turns = {n.node_id for n in finished.tree.nodes if n.parent_id is None}
            assert len(first_turns) == finished.allocation.rollouts
            turns = {n.node_id for n in finished.tree.nodes if n.node_id not in finished.failures}
            assert {
                node for tree, node in nodes_seen if tree == finished.tree.tree_id
            } == turns  # nothing dropped
        # a skipped prompt contributed nothing: no row of it, no trained row's tokens start with it
        skipped = {prompt.prompt_id for prompt in allocation.skipped}
        assert not skipped & set(seen["trace_prompt_id"])
        tokens_of = {stable_prompt_id(p): tuple(tokenizer(p)["input_ids"]) for p in PROMPTS}
        active = {tokens_of[tree.prompt_id] for tree in allocation.trees}
        trained = trained_rows(batch)
        assert trained and all(prompt[:3] in active for prompt, _, _ in trained)
        assert not active & {tokens_of[name] for name in skipped}
        # TRL trains every row with exactly its tree advantage
        expected = sorted((r.prompt_ids, r.completion_ids, r.advantage) for r in step.rows)
        assert [(p, c) for p, c, _ in trained] == [(p, c) for p, c, _ in expected]
        for (_, _, got), (_, _, want) in zip(trained, expected, strict=True):
            assert got == pytest.approx(want, abs=1e-5)
        continuations += step.result.progress.continuations_finished
    assert continuations > 0
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    logged = [entry for entry in trainer.state.log_history if "trace/rows" in entry]
    assert logged and all(0 < entry["trace/row_fill"] <= 1 for entry in logged)


@pytest.mark.slow
def test_the_example_trains_with_trace(capsys: pytest.CaptureFixture[str]) -> None:
    with ThreadedService.from_settings(make_settings(train_interval_seconds=60.0)) as live:
        logged = EXAMPLE.main(["--url", live.url, "--steps", "2"])
    assert len(logged) == 2
    assert all(entry["trace/skipped_prompts"] >= 1 and entry["trace/continuations"] > 0 for entry in logged)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(lines) == 2 and " | continuations " in lines[0]
