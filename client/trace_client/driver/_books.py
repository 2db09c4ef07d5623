"""The driver's books on the trees of a run and its counters, which every other part of a run reads."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from trace_client.driver.types import History, Progress, TurnResult
from trace_proto import PromptIn, TreeAllocation


@dataclass(eq=False)
class Tree:
    """The driver's books on one tree."""

    allocation: TreeAllocation
    prompt: PromptIn
    histories: dict[str, History] = field(default_factory=dict)
    turns: dict[str, TurnResult] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    instructions: set[str] = field(default_factory=set)
    running: int = 0  # local rollouts queued or running
    unacknowledged: int = 0  # events sent or queued without an answer yet
    nodes_made: int = 0
    next_check: float = 0.0  # monotonic time of its next status check while it waits
    check_pause: float = 0.0
    finished: bool = False
    broken: bool = False  # an event of it was rejected, so its books cannot close
    done: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # its rollouts

    @property
    def tree_id(self) -> str:
        return self.allocation.tree_id

    @property
    def waiting(self) -> bool:
        """Open with nothing left to do here: only the service (or another worker) can move it on."""
        return not self.finished and self.running == 0 and self.unacknowledged == 0


@dataclass
class Tally:
    """The run's counters, as `Progress` reports them."""

    trees: int = 0
    trees_finished: int = 0
    bare_rollouts: int = 0
    bare_finished: int = 0
    continuations: int = 0
    continuations_finished: int = 0
    failed: int = 0
    turns_reported: int = 0

    def progress(self, step: int, elapsed: float) -> Progress:
        return Progress(
            step=step,
            trees=self.trees,
            trees_finished=self.trees_finished,
            bare_rollouts=self.bare_rollouts,
            bare_finished=self.bare_finished,
            continuations=self.continuations,
            continuations_finished=self.continuations_finished,
            failed=self.failed,
            turns_reported=self.turns_reported,
            elapsed=elapsed,
        )


class Trees:
    """The run's trees by id, and `changed`, set whenever one of them may have stopped waiting or finished
    (it wakes the supervisor)."""

    def __init__(self, tally: Tally) -> None:
        self._tally = tally
        self._by_id: dict[str, Tree] = {}
        self.changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, tree_id: str) -> Tree | None:
        return self._by_id.get(tree_id)

    def add(self, allocation: TreeAllocation, prompt: PromptIn) -> Tree:
        if allocation.tree_id in self._by_id:
            raise ValueError(f"tree {allocation.tree_id} is already running")
        tree = self._by_id[allocation.tree_id] = Tree(allocation, prompt)
        self._tally.trees += 1
        return tree

    def waiting(self) -> list[Tree]:
        return [tree for tree in self._by_id.values() if tree.waiting]

    def finish(self, tree: Tree) -> None:
        if not tree.finished:
            tree.finished = True
            self._tally.trees_finished += 1
        tree.done.set()
        self.changed.set()

    def remove(self, tree: Tree) -> None:
        """Forget a tree that was exported; rollouts of it still running are cancelled."""
        self.finish(tree)
        for task in tree.tasks:
            task.cancel()
        self._by_id.pop(tree.tree_id, None)
