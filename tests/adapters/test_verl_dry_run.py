"""The verl integration's CPU dry run: verl's workers, TransferQueue, replay buffer, advantage step and
step metrics on a live service, the simulator in place of the inference server."""

from __future__ import annotations

import dataclasses

import pytest
from verl_support import idle_settings

from trace_client import TraceClient
from trace_client.integrations import verl as integration
from trace_lab import verl_dry_run as dry_run
from trace_lab.local import ThreadedService
from trace_proto import TreeResponse

pytestmark = pytest.mark.framework

# --- the dry run: verl's workers, TransferQueue, replay buffer, advantage step and step metrics ---------


@dataclasses.dataclass(frozen=True)
class DryRunStep:
    report: dry_run.StepReport
    trees: dict[str, TreeResponse]  # the service's trees of the step's trained paths, by tree id
    predictor_version: int


@pytest.fixture(scope="module")
def dry_run_step() -> DryRunStep:
    with ThreadedService.from_settings(idle_settings()) as live:
        options = dry_run.DryRunOptions(url=live.url, pool=12, budget=12, expansion=1.0, prompts=48, seed=4)
        (report,) = dry_run.run_steps(options, [1])
        with TraceClient(live.url) as client:
            trees = {f["trace_tree_id"]: client.get_tree(f["trace_tree_id"]) for f in report.fields}
            version = client.predictor_info().version
    return DryRunStep(report, trees, version)


@pytest.mark.slow
def test_a_dry_run_step_trains_on_every_path_with_the_tree_advantages(dry_run_step: DryRunStep) -> None:
    report, trees = dry_run_step.report, dry_run_step.trees
    sessions = dry_run.sessions_per_uid(report.keys)
    assert sum(report.rollout_n.values()) == 12
    assert any(n == 0 for n in report.rollout_n.values()), "the budget covered every prompt: no choice made"
    for uid, count in report.rollout_n.items():
        assert sessions.get(uid, 0) == count  # verl ran as many sessions as the tree has bare rollouts
    continuation_keys = [key for key in report.keys if not key.endswith("_0")]
    assert continuation_keys, "no Stage 2 continuation reached the batch"
    leaves = 0
    for advantages, scores, fields in zip(report.advantages, report.rm_scores, report.fields, strict=True):
        tree = trees[fields["trace_tree_id"]]
        nodes = {node.node_id: node for node in tree.nodes}
        leaf = nodes[fields["trace_leaf_id"]]
        assert leaf.reward == fields["trace_reward"]
        assert scores[-1] == pytest.approx(leaf.reward) and not any(scores[:-1])  # the reward, at the end
        path_values = set()
        node = leaf
        while True:
            path_values.add(node.advantage)
            if node.parent_id is None:
                break
            node = nodes[node.parent_id]
        trained = {value for value in advantages if value != 0.0}
        assert all(any(abs(t - v) < 1e-6 for v in path_values) for t in trained), "not this path's credit"
        leaves += 1
    assert leaves == sum(sum(n.reward is not None for n in tree.nodes) for tree in trees.values())


@pytest.mark.slow
def test_a_dry_run_steps_reward_panels_chart_the_leaf_rewards(dry_run_step: DryRunStep) -> None:
    report = dry_run_step.report
    rewards = [float(fields["trace_reward"]) for fields in report.fields]
    for name in ("score", "rewards"):  # computed by the trainer's own `_compute_metrics`
        assert report.metrics[f"critic/{name}/mean"] == pytest.approx(sum(rewards) / len(rewards))
        assert report.metrics[f"critic/{name}/max"] == pytest.approx(max(rewards))
        assert report.metrics[f"critic/{name}/min"] == pytest.approx(min(rewards))
    on_loss = [
        value
        for row, mask in zip(report.advantages, report.loss_masks, strict=True)
        for value, bit in zip(row, mask, strict=True)
        if bit
    ]
    assert report.metrics["critic/advantages/max"] == pytest.approx(max(on_loss))
    assert report.metrics["critic/advantages/min"] == pytest.approx(min(on_loss))


@pytest.mark.slow
def test_a_dry_run_steps_metrics_hold_the_trace_figures_of_its_trees(dry_run_step: DryRunStep) -> None:
    report, trees = dry_run_step.report, dry_run_step.trees
    metrics = report.metrics  # what verl's `Tracking` logger would be handed for the step
    mixed = sum(tree.mixed for tree in trees.values())
    continuations = sum(
        fields["trace_leaf_id"] in integration.continuation_leaves(trees[fields["trace_tree_id"]])
        for fields in report.fields
    )
    expected = {
        "trace/prompts": len(report.rollout_n),
        "trace/skipped_prompts": sum(n == 0 for n in report.rollout_n.values()),
        "trace/bare_rollouts_promised": sum(tree.rollouts for tree in trees.values()),
        "trace/continuations_promised": sum(tree.expansion_budget for tree in trees.values()),
        "trace/trees": len(trees),
        "trace/mixed_trees": mixed,
        "trace/effective_ratio": mixed / len(trees),
        "trace/paths": len(report.keys),
        "trace/bare_rollouts": len(report.keys) - continuations,
        "trace/continuations": continuations,
        "trace/truncated_paths": 0,
        "trace/predictor/version": dry_run_step.predictor_version,
        "trace/predictor/examples_seen": 0,  # the service's predictor trains in the background: idle here
    }
    assert {name: metrics[name] for name in expected} == pytest.approx(expected)
    assert 0 < continuations < len(report.keys)
    assert metrics["trace/expected_mixed"] >= 0
    assert {name for name in metrics if name.startswith("trace/")} <= set(integration.TRACE_METRICS)
    # and the trainer's own figures beside them, from the same step: the weights versions every path
    # carries are the ones a sync step generates with (no staleness)
    assert metrics["training/global_step"] == 1 and "response_length/mean" in metrics
    assert metrics["training/off_policy/trajectory_staleness/max"] == 0


@pytest.fixture(scope="module")
def async_dry_run_steps() -> list[dry_run.StepReport]:
    with ThreadedService.from_settings(idle_settings()) as live:
        options = dry_run.DryRunOptions(
            url=live.url, pool=12, budget=12, expansion=1.0, prompts=48, seed=5, mode="colocate_async"
        )
        return dry_run.run_steps(options, [1, 2, 3])


@pytest.mark.slow
def test_an_async_dry_run_trains_each_step_on_its_share_of_the_budget(
    async_dry_run_steps: list[dry_run.StepReport],
) -> None:
    first = async_dry_run_steps[0]
    # the warm-up batch and the step's own, each allocated the step's budget, before the first sample
    assert len(first.rollout_n) == 24 and sum(first.rollout_n.values()) == 24
    assert first.metrics["trace/prompts"] == 24
    assert all(sum(report.rollout_n.values()) == 12 for report in async_dry_run_steps[1:])
    taken = 0
    for step, report in enumerate(async_dry_run_steps, start=1):
        bare = sum(dry_run.sessions_per_uid(report.keys).values())
        assert bare == report.metrics["trace/bare_rollouts"] > 0
        taken += bare
        # each sample's share, a group that overshoots one share made up by the next (at most 16 each)
        assert abs(taken - 12 * step) <= 16
        assert all("trace_tree_id" in fields for fields in report.fields)
        assert report.metrics["training/global_step"] == step


@pytest.mark.slow
def test_an_async_dry_run_trains_on_trees_generated_while_earlier_steps_trained(
    async_dry_run_steps: list[dry_run.StepReport],
) -> None:
    # the simulator's turns bypass verl's server, so a tree's weights are those of the step before its
    # dispatch: the warm-up batch's trees, trained at step 2, are one version old
    staleness = [
        report.metrics["training/off_policy/trajectory_staleness/max"] for report in async_dry_run_steps
    ]
    assert staleness[0] == 0 and max(staleness[1:]) >= 1
