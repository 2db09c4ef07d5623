"""The books of one harness step: its trees in flat arrays (`Forest`), what it spent (`Ledger`), and
what a strategy remembers of each prompt across steps (`PromptRecord`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bench.estimators import FinishedTree
from trace_lab.sim import Prompt, RolloutState
from trace_service.allocation import PolicyRules, is_mixed
from trace_service.allocation.branching import round_candidates
from trace_service.allocation.tree import ROOT, PrefixCandidates, continuation_flips, tree_targets
from trace_service.lifecycle import DEFAULT_SUCCESS_THRESHOLD, is_success

IntArray = npt.NDArray[np.int64]

#: A leaf at or above this reward is a success: the service's default threshold (a simulator's rewards
#: are 0 or 1, so any threshold in (0, 1] agrees).
SUCCESS_THRESHOLD = DEFAULT_SUCCESS_THRESHOLD


@dataclass
class PromptRecord:
    """What a strategy remembers of a prompt across steps."""

    successes: int = 0
    trials: int = 0
    zero_variance_streak: int = 0


class Forest:
    """The trees of one step in flat arrays, parents before children (the layout
    `trace_service.allocation.tree` reads), with `tree_of` naming each node's tree: one `tree_targets`
    call serves every tree."""

    def __init__(
        self,
        prompts: Sequence[Prompt],
        planned: Sequence[int],
        rules: PolicyRules,
        max_branch_depth: int | None = None,
    ) -> None:
        self.prompts = list(prompts)
        self.planned = list(planned)
        self.max_branch_depth = max_branch_depth
        # The policy's rules, which may limit how deep a tree whose bare rollouts agree branches.
        self.rules = rules
        self.states: list[RolloutState] = []
        self.parent: list[int] = []
        self.reward: list[float] = []
        self.tree_of: list[int] = []
        self.bare: list[bool] = []
        self.forks: set[int] = set()
        # The observed outcome below each prefix when continuations from it were last planned.
        self.observed_outcome: dict[int, float] = {}
        self.bare_successes = [0] * len(self.prompts)
        self.bare_trials = [0] * len(self.prompts)

    def add(self, tree: int, parent: int, trajectory: Sequence[RolloutState], *, bare: bool) -> None:
        if not bare:
            self.forks.add(parent)
        for state in trajectory:
            self.parent.append(parent)
            parent = len(self.states)
            self.states.append(state)
            self.reward.append(state.reward if state.reward is not None else math.nan)
            self.tree_of.append(tree)
            self.bare.append(bare)
        if bare:
            self.bare_trials[tree] += 1
            self.bare_successes[tree] += int(is_success(trajectory[-1].reward or 0.0, SUCCESS_THRESHOLD))

    def _local_trees(self) -> Iterator[tuple[int, list[int], list[int]]]:
        """Each started tree: (tree, its global node indices in order, their parents as local indices)."""
        tree_of = np.asarray(self.tree_of, dtype=np.int64)
        for tree in range(len(self.prompts)):
            nodes = np.flatnonzero(tree_of == tree).tolist()
            if nodes:
                local = {node: i for i, node in enumerate(nodes)}
                yield tree, nodes, [local.get(self.parent[node], ROOT) for node in nodes]

    def finished_trees(self, history: dict[str, PromptRecord]) -> list[FinishedTree]:
        """Each started tree with local parent indices (before `history` takes this step's outcomes)."""
        trees = []
        for tree, nodes, parent in self._local_trees():
            prompt = self.prompts[tree]
            record = history.get(prompt.prompt_id, PromptRecord())
            trees.append(
                FinishedTree(
                    prompt=prompt,
                    states=[self.states[node] for node in nodes],
                    parent=parent,
                    reward=[self.reward[node] for node in nodes],
                    successes=record.successes,
                    trials=record.trials,
                    bare_successes=self.bare_successes[tree],
                    bare_trials=self.bare_trials[tree],
                )
            )
        return trees

    def continuation_flips(self, predicted_root: Sequence[float]) -> tuple[int, float]:
        """Continuation flips over all trees, against fresh rollouts' (`continuation_flips`)."""
        flips, fresh = 0, 0.0
        for tree, nodes, parent in self._local_trees():
            reward = [self.reward[node] for node in nodes]
            bare = [self.bare[node] for node in nodes]
            tree_flips, tree_fresh = continuation_flips(parent, reward, bare, float(predicted_root[tree]))
            flips, fresh = flips + tree_flips, fresh + tree_fresh
        return flips, fresh

    def candidates(self) -> list[PrefixCandidates]:
        """Each tree's branching candidates (global node indices), found as the service's Stage 2 finds
        them: `round_candidates` on the tree alone, its nodes in the service's order (by depth, each
        depth as reported)."""
        found = []
        for tree, nodes in enumerate(self._nodes_by_tree()):
            if not nodes:
                found.append(PrefixCandidates(*(np.zeros(0, dtype=kind) for kind in (np.int64, float, bool))))
                continue
            depth = {node: self.states[node].turns for node in nodes}
            ordered = sorted(nodes, key=lambda node: (depth[node], node))
            local = {node: i for i, node in enumerate(ordered)}
            parent = [local.get(self.parent[node], ROOT) for node in ordered]
            targets = tree_targets(parent, [self.reward[node] for node in ordered])
            mine = round_candidates(
                targets, self.rules, self.max_branch_depth, self.bare_successes[tree], self.bare_trials[tree]
            )
            found.append(PrefixCandidates(np.asarray(ordered)[mine.nodes], mine.outcome, mine.blocked))
        return found

    def _nodes_by_tree(self) -> list[list[int]]:
        """Every tree's global node indices in order (none for a tree not started)."""
        nodes: list[list[int]] = [[] for _ in self.prompts]
        for node, tree in enumerate(self.tree_of):
            nodes[tree].append(node)
        return nodes

    def outcomes(self) -> tuple[IntArray, IntArray, int]:
        """Successes and visits (scored leaves) below each tree's root, and the number of mixed forks."""
        count = len(self.prompts)
        if not self.states:
            return np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64), 0
        targets = tree_targets(self.parent, self.reward)
        top = targets.depth == 1
        owner = np.asarray(self.tree_of, dtype=np.int64)[top]
        successes = np.bincount(owner, weights=targets.successes[top], minlength=count).astype(np.int64)
        visits = np.bincount(owner, weights=targets.visits[top], minlength=count).astype(np.int64)
        forks = np.fromiter(self.forks, dtype=np.int64, count=len(self.forks))
        fork_successes, fork_visits = targets.successes[forks], targets.visits[forks]
        mixed_forks = int(np.count_nonzero(is_mixed(fork_successes, fork_visits)))
        return successes, visits, mixed_forks


@dataclass
class Ledger:
    """Rollouts, continuations and turns spent in a step, against the turn budget when there is one."""

    turn_budget: int | None
    rollouts: int = 0
    continuations: int = 0
    turns: int = 0
    fallback_units: int = 0
    flips: int = 0
    branch_depth: int = 0
    continuation_turns: int = 0

    @property
    def turns_left(self) -> int:
        assert self.turn_budget is not None  # only asked when counting turns
        return self.turn_budget - self.turns

    def charge(self, trajectories: Sequence[Sequence[RolloutState]], *, continuation: bool) -> None:
        self.rollouts += len(trajectories)
        self.continuations += len(trajectories) if continuation else 0
        self.turns += sum(len(trajectory) for trajectory in trajectories)
        if self.turn_budget is not None and self.turns > self.turn_budget:
            raise AssertionError("admission let the turn budget be exceeded")  # a bug, never a result
