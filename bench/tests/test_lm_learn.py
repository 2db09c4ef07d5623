"""bench/lm/learn.py: the learner's pieces against hand-made trees, the warm start's reproducibility,
and --quick end to end through real service processes over HTTP."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.learning import fresh_job
from bench.lm import vocab
from bench.lm.agent import CONTEXT_EXHAUSTED, EXHAUSTED, LMAgent, LMPolicy, TurnState, training_sequences
from bench.lm.learn import WarmStart, main, play, warm_started
from bench.lm.model import ModelConfig, TinyLM
from bench.lm.report import TokenCurve, collapses
from bench.lm.tasks import ToolArithmetic
from trace_client.driver import FinishedTree, History, TurnResult
from trace_proto import AllocateRequest, PromptIn, TreeAllocation, TreeNode, TreeResponse, TreeStatus

TINY = ModelConfig(vocab_size=vocab.VOCAB_SIZE, d_model=16, n_layers=1, n_heads=2, max_len=320)


def node(node_id: str, parent: str | None, value: float, advantage: float, reward: float | None) -> TreeNode:
    return TreeNode(
        node_id=node_id, parent_id=parent, depth=1 if parent is None else 2, visits=1, successes=int(value),
        value=value, advantage=advantage, reward=reward,
    )  # fmt: skip


def finished(nodes: list[TreeNode], value: float) -> FinishedTree:
    prompt = PromptIn(prompt_id="p", text="Q: 2*3")
    tree = TreeResponse(
        tree_id="t", prompt_id="p", job="j", step=0, status=TreeStatus.COMPLETE, mixed=True, rollouts=2,
        expansion_budget=0, value=value, nodes=nodes,
    )  # fmt: skip
    turns = {
        n.node_id: TurnResult(text="x", state=TurnState(f"CALL mul 2 {n.node_id}", "RESULT 6")) for n in nodes
    }
    allocation = TreeAllocation(
        tree_id="t", prompt_id="p", rollouts=2, expansion_budget=0, predicted_success=0.5
    )
    return FinishedTree(prompt, allocation, tree, turns, {})


def test_training_sequences_carry_each_action_with_its_advantage() -> None:
    task = ToolArithmetic()
    (prompt,) = task.sample_prompts(np.random.default_rng(0), 1)
    nodes = [node("a", None, 1.0, 0.9, None), node("b", "a", 1.0, 0.4, 1.0), node("c", None, 0.0, -0.7, 0.0)]
    tree = finished(nodes, value=0.5)
    flat = training_sequences(tree, prompt, flat=True)
    assert [s.advantage for s in flat] == [0.5, 0.5, -0.5]  # r − mean(group): V̂(node) − V̂(root)
    branched = training_sequences(tree, prompt, flat=False)
    assert [s.advantage for s in branched] == [0.9, 0.4, -0.7]  # the service's tree advantages
    local = training_sequences(tree, prompt, flat=False, advantage="local")
    assert [s.advantage for s in local] == [0.5, 0.0, -0.5]  # V̂(y) − V̂(parent), from the rewards
    second = branched[1]  # the turn after "a": its transcript replays "a" first, trains on its own action
    expected = vocab.transcript(prompt.text, [("CALL mul 2 a", "RESULT 6"), ("CALL mul 2 b", "RESULT 6")])
    # Cut after its action: the observation that follows changes nothing it is trained on.
    assert second.ids == expected.ids[: expected.action_spans[1][1]]
    assert second.spans == (expected.action_spans[1],)


def test_the_update_raises_the_likelihood_of_advantaged_actions() -> None:
    torch.manual_seed(0)
    policy = LMPolicy(TinyLM(TINY), ToolArithmetic(), lr=1e-2, feature_dim=0, seed=0)
    (prompt,) = ToolArithmetic().sample_prompts(np.random.default_rng(1), 1)
    nodes = [node("a", None, 1.0, 1.0, 1.0)]
    (sequence,) = training_sequences(finished(nodes, value=0.5), prompt, flat=False)

    def likelihood() -> float:
        ids = torch.tensor([sequence.ids])
        logprobs = policy.model.token_logprobs(ids, torch.ones_like(ids, dtype=torch.bool))
        ((start, end),) = sequence.spans
        return float(logprobs[0, start:end].sum().detach())

    before = likelihood()
    policy.update([sequence])
    assert likelihood() > before


def test_the_warm_start_is_reproducible_by_seed(tmp_path: Path) -> None:
    warm = WarmStart(steps=3, batch=4, prompts=32)
    first = warm_started(ToolArithmetic(), TINY, warm, seed=5, cache=tmp_path / "a")
    second = warm_started(ToolArithmetic(), TINY, warm, seed=5, cache=tmp_path / "b")
    cached = warm_started(ToolArithmetic(), TINY, warm, seed=5, cache=tmp_path / "a")
    other = warm_started(ToolArithmetic(), TINY, warm, seed=6, cache=tmp_path / "a")
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, second.state_dict()[name])
        assert torch.equal(tensor, cached.state_dict()[name])
    assert any(not torch.equal(t, other.state_dict()[n]) for n, t in first.state_dict().items())


@pytest.mark.slow
def test_quick_run_reports_every_arm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/test installs it)")
    main(["--quick", "--out", str(tmp_path)])
    output = capsys.readouterr().out
    for arm in ("uniform", "trace"):
        assert f"| arithmetic | {arm} |" in output
    assert (tmp_path / "lm-arithmetic.png").stat().st_size > 0
    runs = (tmp_path / "lm-runs").glob("arithmetic-s0-*.json")
    saved = sorted(path.name.rsplit("-", 1)[1] for path in runs)
    assert saved == ["trace.json", "uniform.json"]  # a curve per arm
    main(["--quick", "--out", str(tmp_path), "--threads", "1"])  # the saved curves, not new runs
    captured = capsys.readouterr()
    assert "saved curves of uniform, trace" in captured.err
    assert captured.out.splitlines()[1:-1] == output.splitlines()[1:-1]  # all but the wall time
    # An arm added later runs alone, beside uniform's saved curve.
    main(["--quick", "--out", str(tmp_path), "--arms", "uniform,trace,trace_paper"])
    captured = capsys.readouterr()
    assert "saved curves of uniform, trace" in captured.err
    assert "| arithmetic | trace_paper |" in captured.out
    assert len(list((tmp_path / "lm-runs").glob("arithmetic-s0-*-trace_paper.json"))) == 1


def test_an_arms_job_is_a_valid_job_whatever_its_name() -> None:
    """An arm's name may hold ``@`` (an advantage variant); its job id must still be a contract job id."""
    jobs = {fresh_job("lm", name) for name in ("trace@first-once", "trace@global", "uniform")}
    assert len(jobs) == 3
    for job in jobs:
        AllocateRequest(job=job, step=0, prompts=[PromptIn(prompt_id="p", text="t")], budget=2)


def test_a_transcript_past_the_context_ends_its_rollout_as_a_failure() -> None:
    """Any valid task: a history the model's context cannot hold with one more action ends, failed,
    in training and in evaluation alike, and trains no action; the run goes on."""
    task = ToolArithmetic()
    (prompt,) = task.sample_prompts(np.random.default_rng(0), 1)
    short = ModelConfig(vocab_size=vocab.VOCAB_SIZE, d_model=16, n_layers=1, n_heads=2, max_len=64)
    policy = LMPolicy(TinyLM(short), task, lr=1e-3, feature_dim=0, seed=0)
    fresh = History(PromptIn(prompt_id=prompt.prompt_id, text=prompt.text), "t")
    long = History(
        fresh.prompt, "t", (TurnResult(text="x", state=TurnState("CALL mul 2 3", "RESULT 6 " * 4)),)
    )
    assert policy.fits(vocab.prefix(prompt.text, []))
    assert not policy.fits(vocab.prefix(prompt.text, [("CALL mul 2 3", "RESULT 6 " * 4)]))
    agent = LMAgent(policy, {prompt.prompt_id: prompt})
    first, ended = agent._turns([fresh, long])
    assert first.text != CONTEXT_EXHAUSTED
    assert ended.done and ended.reward == 0.0 and ended.state == EXHAUSTED
    assert all(reward in (0.0, 1.0) for reward in play(policy, [prompt] * 4, greedy=False))
    nodes = [node("a", None, 0.0, -0.5, None), node("b", "a", 0.0, -0.5, 0.0)]
    tree = finished(nodes, value=0.0)
    tree.turns["b"] = TurnResult(text=CONTEXT_EXHAUSTED, done=True, reward=0.0, state=EXHAUSTED)
    assert [s.advantage for s in training_sequences(tree, prompt, flat=False)] == [-0.5]  # "a" only


def test_an_arm_that_ends_below_its_warm_start_is_reported() -> None:
    fell, rose = TokenCurve(sampled=[0.4, 0.3]), TokenCurve(sampled=[0.4, 0.5])
    (line,) = collapses({"arithmetic": {0: {"trace": fell, "uniform": rose}}})
    assert "arithmetic seed 0 trace" in line and "0.300" in line and "0.400" in line
