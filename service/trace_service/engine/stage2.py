"""Stage 2: one round's continuations for one tree, placed by its policy's rule and recorded under the
round's claim."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
from redis.exceptions import RedisError

from trace_proto import Instruction, Policy
from trace_service.allocation import (
    POLICIES,
    Need,
    PrefixInputs,
    Sharing,
    bare_mixed_chance,
    is_mixed,
    spread_evenly,
)
from trace_service.engine.common import Clock, IntArray, fresh_ids
from trace_service.engine.completion import Completion
from trace_service.lifecycle import round_share
from trace_service.metrics import Metrics
from trace_service.offload import off_loop, release
from trace_service.predictor import OutcomeCounts, Query
from trace_service.runtime import PredictorRuntime
from trace_service.settings import Settings
from trace_service.store import StoredTree, TreeMeta, TreeStore
from trace_service.tree import PrefixCandidates, prefix_candidates

logger = logging.getLogger(__name__)

#: A Stage 2 round's placement: continuations per candidate node, the candidates' ids, Ṽ at them, the
#: fallback units among the continuations, and the round's budget share.
Placement = tuple[IntArray, list[str], dict[str, float], int, int]


class Stage2:
    def __init__(
        self,
        store: TreeStore,
        predictor: PredictorRuntime,
        settings: Settings,
        metrics: Metrics,
        completion: Completion,
        clock: Clock,
    ) -> None:
        self.store = store
        self.predictor = predictor
        self.settings = settings
        self.metrics = metrics
        self.completion = completion
        self.clock = clock
        self._rng = np.random.default_rng()

    async def decide(
        self, tree_id: str, round_: int, token: str, *, inline: bool, tree: StoredTree | None = None
    ) -> tuple[list[Instruction], bool]:
        """Run Stage 2 round ``round_`` for one tree under the claim ``token``; record its instructions.

        ``tree`` is the tree as the claim saw it, when the caller has it (else it is loaded, and freed
        beside the loop when large).  ``inline`` instructions go back to the worker whose events
        triggered them, so they start leased to it; others are free to claim at once.  A failure here
        loses nothing: the claim lapses and the sweeper decides the round again.
        """
        if tree is not None:
            return await self._decide(tree_id, round_, token, inline, tree)
        loaded = await self.store.load_tree(tree_id)
        if loaded is None:
            return [], False
        size, holder = len(loaded.nodes), [loaded]
        del loaded
        try:
            return await self._decide(tree_id, round_, token, inline, holder[0])
        finally:
            await release(size, holder)

    async def _decide(
        self, tree_id: str, round_: int, token: str, inline: bool, tree: StoredTree
    ) -> tuple[list[Instruction], bool]:
        with self.metrics.stage2_duration.time():
            budget = None
            sharing = POLICIES[Policy(tree.meta.policy)].sharing
            if round_ == 1 and sharing is not None:
                budget = await self._draw(tree, sharing)
                tree = replace(tree, meta=replace(tree.meta, expansion_budget=budget))
            meta = tree.meta
            try:
                counts, node_ids, predictions, fallback, share = await self._prefix_counts(tree, round_)
            except (RedisError, OSError):
                raise  # the store is down: the claim lapses and the sweeper decides again
            except Exception:
                # A decision that cannot be made must not leave the tree waiting for it forever.
                logger.exception("Stage 2 of tree %s failed; its continuations are spread evenly", tree_id)
                counts, node_ids, predictions, fallback, share = self._fallback_counts(tree, round_)
            placed = [(node_ids[i], count) for i, count in enumerate(counts.tolist()) if count > 0]
            instructions = [
                Instruction(instruction_id=instruction_id, tree_id=tree_id, node_id=node_id, count=count)
                for (node_id, count), instruction_id in zip(placed, fresh_ids(len(placed)), strict=True)
            ]
            # What this round does not place (no candidate, the caller asked for it back, or every
            # candidate already mixed) is returned: never promised, never spent twice.
            returned = share - int(counts.sum())
            now = self.clock()
            recorded, completed = await self.store.commit_decision(
                tree_id,
                job=meta.job,
                offered_from=now + self.settings.lease_seconds if inline else now,
                round=round_,
                token=token,
                instructions=[(i.instruction_id, i.node_id, i.count) for i in instructions],
                predictions=predictions,
                returned=returned,
                fallback=fallback,
                now=now,
                expansion_budget=budget,
            )
        if not recorded:  # another replica took the decision over; its instructions stand
            await self.store.dequeue_instructions(
                meta.job, [(tree_id, i.instruction_id) for i in instructions]
            )
            return [], False
        label = self.metrics.job_label(meta.job)
        self.metrics.instructions_issued.labels(label).inc(len(instructions))
        self.metrics.budget_fallback.labels(label).inc(fallback)
        self.metrics.budget_unspent.labels(label).inc(returned)
        if completed:
            await self.completion.completed(tree_id, meta)
        return instructions, completed

    async def _draw(self, tree: StoredTree, sharing: Sharing) -> int:
        """The tree's continuations: the part of its share it keeps, and its draw from its allocation's
        shared reserve of the pooled parts (``allocation.reserve``): it takes when its bare rollouts
        agree and it has a prefix to branch from (a turn that is not a leaf); else it leaves its pooled
        part to the allocation's other trees."""
        meta = tree.meta
        kept, pooled = sharing.split(meta.expansion_budget)
        return kept + await self.store.draw_continuations(
            meta.job,
            meta.allocation_id,
            meta.tree_id,
            share=pooled,
            mixed_chance=float(bare_mixed_chance(meta.predicted_success, meta.rollouts)),
            agrees=not is_mixed(meta.bare_successes, meta.bare_leaves),
            can_branch=any(not node.done for node in tree.nodes),
        )

    def _candidates(self, tree: StoredTree) -> PrefixCandidates:
        """The tree's branching candidates, within the depth its request (and, for a tree whose bare
        rollouts agree, its policy's sharing) allows."""
        meta = tree.meta
        sharing = POLICIES[Policy(meta.policy)].sharing
        depth = meta.max_branch_depth
        if sharing is not None:
            agrees = not is_mixed(meta.bare_successes, meta.bare_leaves)
            depth = sharing.branch_depth(agrees=agrees, requested=depth)
        return prefix_candidates(tree.targets(self.settings.success_threshold), depth)

    def _fallback_counts(self, tree: StoredTree, round_: int) -> Placement:
        """What :meth:`_prefix_counts` returns when its rule failed: the share spread evenly over the
        candidates and counted as fallback, or returned (the caller asked for that, or not even the
        candidates are known)."""
        share = _round_share(tree.meta, round_)
        nothing: Placement = np.zeros(0, dtype=np.int64), [], {}, 0, share
        if tree.meta.return_unspent:
            return nothing
        try:
            candidates = self._candidates(tree)
        except Exception:
            logger.exception("tree %s has no readable prefixes; its share is returned", tree.meta.tree_id)
            return nothing
        node_ids = [tree.nodes[i].node_id for i in candidates.nodes]
        counts = spread_evenly(np.ones(len(node_ids), dtype=bool), share)
        return counts, node_ids, {}, int(counts.sum()), share

    async def _prefix_counts(self, tree: StoredTree, round_: int) -> Placement:
        """Stage 2 for one round of ``tree``, by its policy's rule."""
        meta = tree.meta
        share = _round_share(meta, round_)
        size = len(tree.nodes)
        candidates = await off_loop(size, self._candidates, tree)
        node_ids = [tree.nodes[i].node_id for i in candidates.nodes]
        if not node_ids or share == 0:
            return np.zeros(len(node_ids), dtype=np.int64), node_ids, {}, 0, share
        rule = POLICIES[Policy(meta.policy)].prefixes
        p, predictions = None, {}
        if Need.PREFIX_PREDICTIONS in rule.needs:
            _, encoded = await off_loop(size, self.predictor.encode_tree, tree, candidates.nodes.tolist())
            outcomes = OutcomeCounts(*meta.prior_outcomes)
            _, p = await self.predictor.predict([Query(encoded[node_id], outcomes) for node_id in node_ids])
            predictions = {node_id: float(value) for node_id, value in zip(node_ids, p, strict=True)}
        placement = rule.place(
            PrefixInputs(
                budget=share,
                outcome=candidates.outcome,
                blocked=candidates.blocked,
                fallback=not meta.return_unspent,
                predicted=p,
                bare_successes=meta.bare_successes,
                bare_trials=meta.bare_leaves,
                rng=self._rng,
            )
        )
        return placement.counts, node_ids, predictions, placement.fallback_units, share


def _round_share(meta: TreeMeta, round_: int) -> int:
    """The continuations round ``round_`` may place (:func:`trace_service.lifecycle.round_share`)."""
    return round_share(meta.expansion_budget, meta.rounds, round_, meta.promised, meta.returned)
