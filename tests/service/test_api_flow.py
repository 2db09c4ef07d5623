"""The v1 flow over real HTTP, on the embedded store and on a real redis-server."""

from __future__ import annotations

import random

import httpx
import pytest
from support import rollout, turn

from trace_client import TraceClient
from trace_lab.local import ThreadedService
from trace_proto import AllocateRequest, ExpandResponse, Instruction, Policy, PromptIn


def run_continuations(client: TraceClient, instructions: list[Instruction], reward: float) -> ExpandResponse:
    events = [
        event
        for instruction in instructions
        for _ in range(instruction.count)
        for event in rollout(instruction.tree_id, instruction.node_id, 2, reward, instruction.instruction_id)
    ]
    return client.expand(events)


def two_prompts(policy: Policy = Policy.TRACE) -> AllocateRequest:
    """Eight bare rollouts, one continuation each, over two prompts, all of them the policy's."""
    prompts = [PromptIn(prompt_id="p1", text="prove it"), PromptIn(prompt_id="p2")]
    return AllocateRequest(step=0, budget=8, expansion=1.0, policy=policy, control_share=0.0, prompts=prompts)


def test_allocate_expand_complete_export(service: ThreadedService) -> None:
    with TraceClient(service.url) as client:
        allocation = client.allocate(two_prompts())
        assert sum(t.rollouts for t in allocation.trees) == 8
        tree = allocation.trees[0]
        bare = [e for j in range(tree.rollouts) for e in rollout(tree.tree_id, None, 3, float(j % 2))]
        random.Random(0).shuffle(bare)  # children may come before parents within one request
        response = client.expand(bare)
        assert response.accepted == len(bare)
        assert not response.rejected
        # Under `trace` each tree spends its own share, whatever its bare rollouts show.
        kept = tree.expansion_budget
        assert sum(i.count for i in response.instructions) == kept
        done = run_continuations(client, response.instructions, 1.0)
        assert done.completed == [tree.tree_id]
        exported = client.get_tree(tree.tree_id)
        assert exported.status == "complete"
        assert exported.mixed
        assert exported.expansion_budget == kept
        leaves = [n for n in exported.nodes if n.reward is not None]
        assert len(leaves) == tree.rollouts + kept
        assert exported.value == pytest.approx(sum(n.reward >= 0.5 for n in leaves) / len(leaves))  # type: ignore[operator]
        stats = client.job_stats("default")
        assert stats.steps[0].trees_complete == 1
        assert stats.steps[0].continuations_spent == kept


def test_trace_joint_pools_half_of_each_share_for_the_trees_whose_bare_rollouts_agree(
    service: ThreadedService,
) -> None:
    """Under `trace_joint` a tree whose bare rollouts disagree keeps half its continuations and leaves
    the rest; a tree whose bare rollouts agree draws them and branches from its rollouts' first turns
    only, whatever the predictor makes of the deeper prefixes."""
    with TraceClient(service.url) as client:
        first, second = client.allocate(two_prompts(Policy.TRACE_JOINT)).trees
        total = first.expansion_budget + second.expansion_budget
        mixed = [e for j in range(first.rollouts) for e in rollout(first.tree_id, None, 4, float(j % 2))]
        kept = client.expand(mixed).instructions
        assert sum(i.count for i in kept) == first.expansion_budget // 2
        agreeing = [e for _ in range(second.rollouts) for e in rollout(second.tree_id, None, 4, 0.0)]
        first_turns = {event.node_id for event in agreeing if event.parent_id is None}
        drawn = client.expand(agreeing).instructions
        assert sum(i.count for i in drawn) == total - first.expansion_budget // 2
        assert {i.node_id for i in drawn} <= first_turns
        run_continuations(client, kept, 1.0)
        assert run_continuations(client, drawn, 1.0).completed == [second.tree_id]
        assert client.job_stats("default").steps[0].continuations_spent == total


def test_trace_shared_trees_share_their_continuations(service: ThreadedService) -> None:
    """Under `trace_shared` a tree whose bare rollouts already disagree leaves its continuations to the
    allocation's trees whose bare rollouts agree; nothing is spent beyond the allocation's total."""
    with TraceClient(service.url) as client:
        first, second = client.allocate(two_prompts(Policy.TRACE_SHARED)).trees
        total = first.expansion_budget + second.expansion_budget
        mixed = [e for j in range(first.rollouts) for e in rollout(first.tree_id, None, 3, float(j % 2))]
        response = client.expand(mixed)
        assert response.instructions == []
        assert response.completed == [first.tree_id]
        agreeing = [e for _ in range(second.rollouts) for e in rollout(second.tree_id, None, 3, 0.0)]
        response = client.expand(agreeing)
        assert sum(i.count for i in response.instructions) == total
        done = run_continuations(client, response.instructions, 1.0)
        assert done.completed == [second.tree_id]
        assert client.get_tree(first.tree_id).expansion_budget == 0
        assert client.get_tree(second.tree_id).expansion_budget == total
        assert client.job_stats("default").steps[0].continuations_spent == total


def test_continuations_start_within_the_requested_depth(service: ThreadedService) -> None:
    """With `max_branch_depth: 1` every instruction names a bare rollout's first turn, whatever the
    predictor prefers among the deeper prefixes; the whole share is still spent."""
    with TraceClient(service.url) as client:
        request = two_prompts().model_copy(update={"max_branch_depth": 1})
        allocation = client.allocate(request)
        assert sum(t.expansion_budget for t in allocation.trees) == 8
        for tree in allocation.trees:
            bare = [e for _ in range(tree.rollouts) for e in rollout(tree.tree_id, None, 4, 0.0)]
            first_turns = {event.node_id for event in bare if event.parent_id is None}
            response = client.expand(bare)
            assert sum(i.count for i in response.instructions) == tree.expansion_budget
            assert {i.node_id for i in response.instructions} <= first_turns
            assert run_continuations(client, response.instructions, 1.0).completed == [tree.tree_id]


def test_duplicates_are_acknowledged_and_conflicts_reported(service: ThreadedService) -> None:
    with TraceClient(service.url) as client:
        allocation = client.allocate(AllocateRequest(step=0, budget=2, prompts=[PromptIn(prompt_id="p")]))
        tree_id = allocation.trees[0].tree_id
        first = rollout(tree_id, None, 2, 1.0)
        assert client.expand(first).accepted == 2
        again = client.expand(first)
        assert (again.accepted, again.duplicates) == (0, 2)
        orphan = turn(tree_id, "never-reported")
        clash = first[0].model_copy(
            update={"event_id": "other", "text": "x", "parent_id": None, "done": True, "reward": 0.0}
        )
        unknown = turn("no-such-tree", None)
        response = client.expand([orphan, clash, unknown])
        codes = {r.event_id: r.status for r in response.rejected}
        assert codes == {orphan.event_id: 409, "other": 409, unknown.event_id: 404}


def test_budget_is_never_exceeded(service: ThreadedService) -> None:
    with TraceClient(service.url) as client:
        allocation = client.allocate(AllocateRequest(step=0, budget=3, prompts=[PromptIn(prompt_id="p")]))
        tree_id = allocation.trees[0].tree_id
        starts = [turn(tree_id, None) for _ in range(10)]
        response = client.expand(starts)
        assert response.accepted == 3
        assert sum(r.status == 409 for r in response.rejected) == 7
        # A second branch from a node without an instruction would be an unbudgeted rollout.
        branch = turn(tree_id, starts[0].node_id)
        extra = turn(tree_id, starts[0].node_id)
        response = client.expand([branch, extra])
        assert response.accepted == 1
        assert response.rejected[0].status == 409


def test_a_bad_event_does_not_stop_the_others(service: ThreadedService) -> None:
    with TraceClient(service.url) as client:
        allocation = client.allocate(AllocateRequest(step=0, budget=2, prompts=[PromptIn(prompt_id="p")]))
        tree_id = allocation.trees[0].tree_id
        good = turn(tree_id, None)
        no_reward = {"event_id": "bad", "tree_id": tree_id, "node_id": "x", "done": True}
        raw = httpx.post(
            f"{service.url}/v1/expand", json={"events": [good.model_dump(mode="json"), no_reward, 7]}
        )
        answer = raw.json()
        assert raw.status_code == 200
        assert answer["accepted"] == 1
        assert {r["event_id"]: r["status"] for r in answer["rejected"]} == {"bad": 422, "events[2]": 422}


def test_a_worker_that_lost_the_answer_gets_its_instructions_again(service: ThreadedService) -> None:
    with TraceClient(service.url) as client:
        allocation = client.allocate(
            AllocateRequest(step=0, budget=2, expansion=2.0, prompts=[PromptIn(prompt_id="p")])
        )
        tree = allocation.trees[0]
        bare = [e for j in range(tree.rollouts) for e in rollout(tree.tree_id, None, 2, float(j))]
        first = client.expand(bare).instructions  # suppose this answer never reached the worker
        again = client.expand(bare)
        assert again.duplicates == len(bare)
        assert {(i.instruction_id, i.count) for i in again.instructions} == {
            (i.instruction_id, i.count) for i in first
        }
        started = first[0]
        client.expand([turn(tree.tree_id, started.node_id, instruction=started.instruction_id)])
        counts = {i.instruction_id: i.count for i in client.expand(bare).instructions}
        assert counts[started.instruction_id] == started.count - 1  # only what is still unstarted


def test_a_shared_draw_is_spent_over_the_rounds(service: ThreadedService) -> None:
    """With `rounds = 2` the agreeing tree's draw (its share and the mixed tree's) is split over its
    two rounds, the second deciding on the first's outcomes."""
    with TraceClient(service.url) as client:
        request = two_prompts(Policy.TRACE_SHARED).model_copy(update={"rounds": 2})
        first, second = client.allocate(request).trees
        total = first.expansion_budget + second.expansion_budget
        client.expand(
            [e for j in range(first.rollouts) for e in rollout(first.tree_id, None, 3, float(j % 2))]
        )
        agreeing = [e for _ in range(second.rollouts) for e in rollout(second.tree_id, None, 3, 0.0)]
        round_one = client.expand(agreeing).instructions
        spent = sum(i.count for i in round_one)
        assert 0 < spent < total
        round_two = run_continuations(client, round_one, 0.0).instructions
        assert spent + sum(i.count for i in round_two) == total
        assert run_continuations(client, round_two, 1.0).completed == [second.tree_id]


def test_job_stats_cover_the_steps_asked_for(service: ThreadedService) -> None:
    """The window of steps the statistics and their gain cover, through the client."""
    with TraceClient(service.url) as client:
        for step in (0, 1, 2):
            client.allocate(
                AllocateRequest(
                    job="window", step=step, budget=4, prompts=[PromptIn(prompt_id=f"p{i}") for i in range(4)]
                )
            )
        assert [s.step for s in client.job_stats("window").steps] == [0, 1, 2]
        assert [s.step for s in client.job_stats("window", from_step=1).steps] == [1, 2]
        assert [s.step for s in client.job_stats("window", from_step=1, to_step=1).steps] == [1]
        later = client.job_stats("window", from_step=7)
        assert later.steps == [] and later.gain is None
        assert all(0.0 <= s.policy_share <= 1.0 for s in client.job_stats("window").steps)
