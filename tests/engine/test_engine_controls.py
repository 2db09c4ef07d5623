"""The control share through the engine: control trees drawn and marked, run on uniform's rules, their
outcomes recorded once, and what they say reported: the gain over uniform, the calibration on control
prompts and the trust map the next allocation reads the predictor through."""

from __future__ import annotations

import pytest
from support import rollout, running_engine

from trace_proto import AllocateRequest, AllocateResponse, Policy, PromptIn, TreeResponse
from trace_service.allocation import uniform_roots
from trace_service.allocation.gain import BRANCH_DEEP, BRANCH_FIRST, ArmSums, gain_ratio, unweighted
from trace_service.engine import Engine

PROMPTS = 40


def request(step: int, share: float, **fields: object) -> AllocateRequest:
    prompts = [PromptIn(prompt_id=f"p{i}", text=f"task {i}") for i in range(PROMPTS)]
    return AllocateRequest.model_validate(
        {"step": step, "budget": 2 * PROMPTS, "expansion": 0.0, "control_share": share, "prompts": prompts}
        | fields
    )


def reward(prompt_id: str, j: int) -> float:
    """Even prompts always succeed; odd ones succeed every other rollout (their groups are mixed)."""
    return 1.0 if int(prompt_id[1:]) % 2 == 0 else float(j % 2)


async def run(engine: Engine, allocation: AllocateResponse) -> None:
    events = [
        event
        for tree in allocation.trees
        for j in range(tree.rollouts)
        for event in rollout(tree.tree_id, None, 2, reward(tree.prompt_id, j))
    ]
    answer = await engine.intake.expand(events)
    assert not answer.rejected and len(answer.completed) == len(allocation.trees)


async def test_control_trees_are_drawn_marked_and_measured(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        first = await engine.allocation.allocate(request(0, 0.5), None)
        controls = [tree for tree in first.trees if tree.control]
        # ε·M / n = 0.5 · 80 / 2: exactly 20 control trees of uniform's two rollouts.
        assert len(controls) == 20 and all(tree.rollouts == 2 for tree in controls)
        assert sum(tree.rollouts for tree in first.trees) <= 80
        # No control outcome yet: the trust map is flat and the policy's trees get uniform's counts.
        assert first.trust is not None and first.trust.groups == 0 and first.trust.slope == 0.0
        policy_counts = sorted(tree.rollouts for tree in first.trees if not tree.control)
        assert policy_counts == sorted(c for c in uniform_roots(20, 40).tolist() if c)
        metas = await engine.store.load_metas([tree.tree_id for tree in controls])
        assert {meta.policy for meta in metas if meta} == {Policy.UNIFORM.value}  # uniform's Stage 2
        await run(engine, first)

        exported = TreeResponse.model_validate_json(await engine.trees.tree(controls[0].tree_id))
        assert exported.control
        stats = await engine.stats.job_stats("default")
        step = stats.steps[0]
        assert step.control_trees == 20 and step.turns == 2 * 2 * PROMPTS
        assert step.control_mixed == sum(int(t.prompt_id[1:]) % 2 for t in controls)
        gain = stats.gain
        assert gain is not None and gain.control.trees == 20 and gain.policy.trees == 20
        arms = {True: ArmSums(), False: ArmSums()}
        for tree in first.trees:
            mixed = int(tree.prompt_id[1:]) % 2 == 1
            arms[tree.control] += ArmSums.of_tree(mixed=mixed, bare=2, turns=4)
        expected = gain_ratio(unweighted(arms[False]), unweighted(arms[True]), "bare")
        assert expected is not None and gain.per_bare_rollout is not None
        assert gain.per_bare_rollout.ratio == pytest.approx(expected.ratio)
        assert gain.per_bare_rollout.low == pytest.approx(expected.low)
        assert step.policy is not None and step.control is not None
        assert (step.policy.trees, step.control.trees) == (20, 20)
        assert step.policy_share == pytest.approx(first.split.policy_share if first.split else -1)
        assert stats.calibration is not None and stats.calibration.groups == 20

        # The trust map reads every group, the calibration the control groups alone.
        second = await engine.allocation.allocate(request(1, 0.5), None)
        assert second.trust is not None and second.trust.groups == 40
        info = await engine.evidence.describe(await (await engine.predictors.get("default")).info())
        assert info.control is not None and info.control.rollouts == 40
        assert info.trust is not None and info.trust.groups == 40


def arm_reward(control: bool, j: int) -> float:
    """Control trees' groups are mixed, the policy's all succeed: a job whose policy loses."""
    return float(j % 2) if control else 1.0


async def test_a_losing_policy_hands_its_budget_to_uniform_and_stats_show_it(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        first = await engine.allocation.allocate(request(0, 0.1), None)
        # No evidence yet: the policy gets Φ(c) ≈ 0.79 of the budget.
        assert first.split is not None and first.split.gain_per_turn is None
        assert first.split.policy_share == pytest.approx(0.789, abs=1e-3)
        events = [
            event
            for tree in first.trees
            for j in range(tree.rollouts)
            for event in rollout(tree.tree_id, None, 2, arm_reward(tree.control, j))
        ]
        assert not (await engine.intake.expand(events)).rejected
        second = await engine.allocation.allocate(request(1, 0.1), None)
        split = second.split
        assert split is not None and split.gain_per_turn is not None and split.gain_per_turn.high < 1
        assert split.policy_better < 0.05 and split.policy_share == pytest.approx(0.1)
        bare = sum(tree.rollouts for tree in second.trees)
        assert sum(tree.rollouts for tree in second.trees if tree.control) >= 0.8 * bare
        stats = await engine.stats.job_stats("default")
        assert [step.policy_share for step in stats.steps] == pytest.approx([0.789, 0.1], abs=1e-3)
        # The statistics' ratio waits for a mixed policy tree; the split's counts half of one already.
        assert stats.gain is not None and stats.gain.per_turn is None
        controls = sum(tree.control for tree in first.trees)
        assert (stats.gain.policy.mixed, stats.gain.control.mixed) == (0, controls)
        # The gain over a chosen window of steps: the second step has no complete tree yet.
        later = await engine.stats.job_stats("default", from_step=1)
        assert [step.step for step in later.steps] == [1] and later.gain is not None
        assert later.gain.per_turn is None and later.gain.policy.trees == 0
        assert (await engine.stats.job_stats("default", from_step=5)).steps == []
        with pytest.raises(ValueError, match="exceeds"):
            await engine.stats.job_stats("default", from_step=2, to_step=1)


async def test_a_share_of_zero_draws_no_control_and_reads_the_predictor_as_it_is(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        allocation = await engine.allocation.allocate(request(0, 0.0), None)
        assert allocation.trust is None and not any(tree.control for tree in allocation.trees)
        assert allocation.split is None
        await run(engine, allocation)
        stats = await engine.stats.job_stats("default")
        assert stats.gain is None and stats.calibration is None
        assert stats.steps[0].control_trees == 0


async def test_the_papers_rules_read_the_predictor_as_it_is(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        allocation = await engine.allocation.allocate(request(0, 0.5, policy="trace_paper"), None)
        assert allocation.trust is None and sum(tree.control for tree in allocation.trees) == 20


async def test_a_share_of_one_is_uniform_allocation(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        allocation = await engine.allocation.allocate(request(0, 1.0, policy="pcl"), None)
        assert all(tree.control for tree in allocation.trees)
        assert sorted(t.rollouts for t in allocation.trees) == sorted(c for c in uniform_roots(40, 80) if c)


async def play(engine: Engine, allocation: AllocateResponse, reward_of: dict[str, float | None]) -> list[str]:
    """Every tree's bare rollouts of three turns and the continuations Stage 2 asks for, each of two
    turns, to completion: a tree's rollouts alternate success and failure when ``reward_of`` gives it
    None, else all score that.  Returns the nodes the continuations started from."""
    events = [
        event
        for tree in allocation.trees
        for j in range(tree.rollouts)
        for event in rollout(tree.tree_id, None, 3, _reward(reward_of[tree.tree_id], j))
    ]
    starts: list[str] = []
    while events:
        answer = await engine.intake.expand(events)
        assert not answer.rejected
        events = [
            event
            for instruction in answer.instructions
            for _ in range(instruction.count)
            for event in rollout(
                instruction.tree_id,
                instruction.node_id,
                2,
                _reward(reward_of[instruction.tree_id], 1),
                instruction.instruction_id,
            )
        ]
        starts += [instruction.node_id for instruction in answer.instructions]
    return starts


def depths(tree: TreeResponse) -> dict[str, int]:
    """Each node's depth in turns (a first turn is 1)."""
    parent = {node.node_id: node.parent_id for node in tree.nodes}
    found: dict[str, int] = {}
    for node_id in parent:
        chain, at = 0, node_id
        while at is not None:
            chain, at = chain + 1, parent[at]
        found[node_id] = chain
    return found


def _reward(fixed: float | None, j: int) -> float:
    return float(j % 2) if fixed is None else fixed


async def test_the_shape_of_stage_2_follows_the_evidence_and_stats_show_it(store_url: str) -> None:
    """Under `trace` each policy tree with continuations is drawn deep (any depth) or first-turn; a job
    whose first-turn trees find the mixed groups moves the next allocation's policy trees to first
    turns, down to the floor ε of deep ones."""
    async with running_engine(store_url) as engine:
        first = await engine.allocation.allocate(request(0, 0.1, expansion=1.0), None)
        assert first.split is not None and first.split.deep_gain_per_turn is None
        assert first.split.deep_branch_share == pytest.approx(0.789, abs=1e-3)
        metas = {
            meta.tree_id: meta
            for meta in await engine.store.load_metas([tree.tree_id for tree in first.trees])
            if meta
        }
        shapes = {tree_id: meta.shape for tree_id, meta in metas.items()}
        assert {shapes[t.tree_id] for t in first.trees if t.control} == {None}
        policy = [t.tree_id for t in first.trees if not t.control]
        assert {shapes[t] for t in policy} == {BRANCH_DEEP, BRANCH_FIRST}
        assert all((metas[t].max_branch_depth == 1) == (shapes[t] == BRANCH_FIRST) for t in policy)
        # First-turn trees mix, the others never do.
        reward_of = {tree_id: None if shape == BRANCH_FIRST else 1.0 for tree_id, shape in shapes.items()}
        starts = await play(engine, first, reward_of)
        first_turn_trees = [t for t in policy if shapes[t] == BRANCH_FIRST]
        for tree_id in first_turn_trees:
            depth = depths(TreeResponse.model_validate_json(await engine.trees.tree(tree_id)))
            assert all(depth[node] == 1 for node in starts if node in depth)

        stats = await engine.stats.job_stats("default")
        step = stats.steps[0]
        assert step.branch_first is not None and step.branch_deep is not None
        assert (step.branch_first.trees, step.branch_first.mixed) == (len(first_turn_trees),) * 2
        assert step.branch_deep.trees == len(policy) - len(first_turn_trees) and step.branch_deep.mixed == 0

        second = await engine.allocation.allocate(request(1, 0.1, expansion=1.0), None)
        assert second.split is not None and second.split.deep_gain_per_turn is not None
        # Its 90% interval lies below 1: at most a fifth of the policy's trees stay deep.
        assert second.split.deep_gain_per_turn.high < 1 and second.split.deep_branch_share <= 0.2
        later = await engine.store.load_metas([t.tree_id for t in second.trees if not t.control])
        drawn = [meta.shape for meta in later if meta]
        assert drawn.count(BRANCH_FIRST) >= 0.8 * len(drawn) - 1


async def test_the_shape_is_fixed_without_controls_under_other_policies_or_by_the_request(
    store_url: str,
) -> None:
    async with running_engine(store_url) as engine:
        for step, fields in enumerate(
            [
                {"control_share": 0.0},
                {"policy": "trace_paper"},
                {"max_branch_depth": 1},
                {"shape_from_evidence": False},
            ]
        ):
            allocation = await engine.allocation.allocate(request(step, 0.1, expansion=1.0, **fields), None)
            metas = await engine.store.load_metas([t.tree_id for t in allocation.trees])
            assert {meta.shape for meta in metas if meta} == {None}
            # The response says so: every policy tree may branch at any depth the request allows.
            assert allocation.split is None or allocation.split.deep_branch_share == 1.0
