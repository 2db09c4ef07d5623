"""A worker written against the v1 API alone: one training step of a toy multi-turn task, with TRACE's
allocation, its Stage 2 continuations and the finished trees.

    .venv/bin/trace-rollout serve --port 8000 &
    .venv/bin/python examples/worker.py --url http://127.0.0.1:8000

The task stands in for an agent and its environment: each prompt has a hidden difficulty; each turn the
agent may slip, and a rollout succeeds (reward 1.0) when its last turn is reached without a slip. A
turn's outcome depends only on the history it continues, which is what lets the service branch a
continuation from any turn. `trace_client.driver` runs this loop for you (concurrently, batching
events, retrying, claiming leased instructions); this file shows the rules it follows
(docs/workers.md).
"""

from __future__ import annotations

import argparse
import random
import uuid
from dataclasses import dataclass

from trace_client import TraceClient
from trace_proto import AllocateRequest, ExpandEvent, PromptIn

TURNS = 3  # every rollout of the toy task ends on its third turn


@dataclass(frozen=True)
class Turn:
    """What the worker keeps of every node it reported: enough to continue from it."""

    tree_id: str
    prompt_id: str
    depth: int  # the rollout's first turn is depth 1
    slipped: bool


def rollout(
    trace: TraceClient,
    rng: random.Random,
    nodes: dict[str, Turn],
    difficulty: dict[str, float],
    tree_id: str,
    prompt_id: str,
    parent_id: str | None = None,
    instruction_id: str | None = None,
) -> list[tuple[str, str, int]]:
    """Run one rollout (a chain of turns) from the prompt (``parent_id`` None) or from the node an
    instruction names, report it, and return the instructions the answer carries: (instruction_id,
    node_id, count) each."""
    start = nodes[parent_id] if parent_id else None
    depth, slipped = (start.depth, start.slipped) if start else (0, False)
    events = []
    parent = parent_id
    while depth < TURNS:
        depth += 1
        slipped = slipped or rng.random() < difficulty[prompt_id]
        done = depth == TURNS
        node_id = uuid.uuid4().hex  # client-made, unique within the tree
        events.append(
            ExpandEvent(
                event_id=f"{tree_id}:{node_id}",  # client-made: a resend is acknowledged, never counted twice
                tree_id=tree_id,
                node_id=node_id,
                parent_id=parent,  # None: the turn starts from the prompt
                text=f"turn {depth}: {'slipped' if slipped else 'on track'}",
                done=done,
                reward=(0.0 if slipped else 1.0) if done else None,  # required exactly on the last turn
                # Only the continuation's first turn names its instruction; the rest chain from it.
                instruction_id=None if events else instruction_id,
            )
        )
        nodes[node_id] = Turn(tree_id, prompt_id, depth, slipped)
        parent = node_id
    # A 200 can still refuse some events (each says why in `rejected`): here that stops the worker.
    answer = trace.expand(events, on_rejected="raise")
    return [(i.instruction_id, i.node_id, i.count) for i in answer.instructions]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--budget", type=int, default=32, help="bare rollouts of the step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    difficulty = {f"task-{k}": rng.choice([0.0, 0.1, 0.3, 0.6, 0.9]) for k in range(args.prompts)}
    nodes: dict[str, Turn] = {}
    with TraceClient(args.url) as trace:
        plan = trace.allocate(
            AllocateRequest(
                job=f"example-{uuid.uuid4().hex[:8]}",
                step=0,
                budget=args.budget,
                expansion=1.0,  # up to one continuation per bare rollout, placed by Stage 2
                prompts=[PromptIn(prompt_id=p, text=f"solve {p}") for p in difficulty],
            )
        )
        print(f"allocated {len(plan.trees)} trees, skipped {len(plan.skipped)} prompts")
        # Every tree's bare rollouts; an answer that scores a tree's last one carries its instructions.
        work = [(t.tree_id, t.prompt_id, None, None) for t in plan.trees for _ in range(t.rollouts)]
        while work:
            tree_id, prompt_id, parent_id, instruction_id = work.pop()
            for instruction, node_id, count in rollout(
                trace, rng, nodes, difficulty, tree_id, prompt_id, parent_id, instruction_id
            ):
                owner = nodes[node_id]
                print(f"  continue {count}x from turn {owner.depth} of {owner.prompt_id} ({instruction})")
                work += [(owner.tree_id, owner.prompt_id, node_id, instruction)] * count
        for allocated in plan.trees:
            tree = trace.get_tree(allocated.tree_id)
            leaves = [n for n in tree.nodes if n.reward is not None]
            value = "-" if tree.value is None else f"{tree.value:.2f}"
            print(
                f"{tree.prompt_id}: {tree.status.value}, {len(leaves)} leaves, mixed={tree.mixed}, V̂={value}"
            )


if __name__ == "__main__":
    main()
