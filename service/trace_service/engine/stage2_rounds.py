"""Stage 2: one round's continuations for one tree, placed by its policy's rule and recorded under the
round's claim."""

from __future__ import annotations

import logging

import numpy as np
from redis.exceptions import RedisError

from trace_proto import Instruction, Policy
from trace_service.allocation import (
    POLICIES,
    Need,
    PolicyRules,
    Sharing,
    is_mixed,
    spread_evenly,
)
from trace_service.allocation.books import TreeBooks
from trace_service.allocation.branching import can_branch, place_round, round_candidates
from trace_service.allocation.tree import PrefixCandidates
from trace_service.engine.common import Clock, IntArray, fresh_ids
from trace_service.engine.completion import Completion
from trace_service.metrics import Metrics
from trace_service.offload import off_loop, release
from trace_service.predictor import OutcomeCounts, Query
from trace_service.predictor.job_predictors import PredictorRegistry
from trace_service.settings import Settings
from trace_service.store import StoredTree, TreeMeta, TreeStore

logger = logging.getLogger(__name__)


class Stage2:
    def __init__(
        self,
        store: TreeStore,
        predictors: PredictorRegistry,
        settings: Settings,
        metrics: Metrics,
        completion: Completion,
        clock: Clock,
    ) -> None:
        self.store = store
        self.predictors = predictors
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
            rules = POLICIES[Policy(tree.meta.policy)]
            try:
                candidates: PrefixCandidates | None = await off_loop(
                    len(tree.nodes), self._candidates, tree, rules
                )
            except Exception:
                logger.exception("tree %s has no readable prefixes; its share is returned", tree_id)
                candidates = None
            books = tree.meta.books
            budget = None
            if round_ == 1 and rules.sharing is not None:
                branches = candidates is not None and can_branch(candidates)
                budget = await self._draw(tree.meta, books, rules.sharing, branches)
            opened = books.open_round(round_, budget)
            counts, node_ids, predictions, fallback = await self._placement(
                tree, rules, candidates, opened.share
            )
            placed = [(node_ids[i], count) for i, count in enumerate(counts.tolist()) if count > 0]
            instructions = [
                Instruction(instruction_id=instruction_id, tree_id=tree_id, node_id=node_id, count=count)
                for (node_id, count), instruction_id in zip(placed, fresh_ids(len(placed)), strict=True)
            ]
            # What this round does not place (no candidate, the caller asked for it back, or every
            # candidate already mixed) is returned: never promised, never spent twice.
            closed = opened.close(int(counts.sum()))
            meta, now = tree.meta, self.clock()
            recorded, completed = await self.store.commit_decision(
                tree_id,
                job=meta.job,
                offered_from=now + self.settings.lease_seconds if inline else now,
                round=round_,
                token=token,
                instructions=[(i.instruction_id, i.node_id, i.count) for i in instructions],
                predictions=predictions,
                books=closed,
                fallback=fallback,
                now=now,
            )
        if not recorded:  # another replica took the decision over; its instructions stand
            await self.store.dequeue_instructions(
                meta.job, [(tree_id, i.instruction_id) for i in instructions]
            )
            return [], False
        label = self.metrics.job_label(meta.job)
        self.metrics.instructions_issued.labels(label).inc(len(instructions))
        self.metrics.budget_fallback.labels(label).inc(fallback)
        self.metrics.budget_unspent.labels(label).inc(closed.returned)
        if completed:
            await self.completion.completed(tree_id, meta)
        return instructions, completed

    async def _draw(self, meta: TreeMeta, books: TreeBooks, sharing: Sharing, branches: bool) -> int:
        """The tree's continuations: the part of its share it keeps, and its draw from its allocation's
        shared reserve of the pooled parts (``allocation.reserve``): it takes when its bare rollouts
        agree and it ``branches`` (``allocation.branching.can_branch``); else it leaves its pooled
        part to the allocation's other trees."""
        kept, pooled = books.pooled(sharing)
        return kept + await self.store.draw_continuations(
            meta.job,
            meta.allocation_id,
            meta.tree_id,
            share=pooled,
            mixed_chance=meta.mixed_chance,
            agrees=not is_mixed(meta.bare_successes, meta.bare_leaves),
            can_branch=branches,
        )

    def _candidates(self, tree: StoredTree, rules: PolicyRules) -> PrefixCandidates:
        meta = tree.meta
        targets = tree.targets(self.settings.success_threshold)
        return round_candidates(targets, rules, meta.max_branch_depth, meta.bare_successes, meta.bare_leaves)

    async def _placement(
        self, tree: StoredTree, rules: PolicyRules, candidates: PrefixCandidates | None, share: int
    ) -> tuple[IntArray, list[str], dict[str, float], int]:
        """The round's continuations per candidate by the policy's rule (``branching.place_round``),
        the candidates' ids, Ṽ at them when the rule reads it, and the units its fallback placed.  A
        rule that fails spreads the share evenly (all fallback); without readable candidates nothing
        is placed."""
        meta = tree.meta
        if candidates is None:
            return np.zeros(0, dtype=np.int64), [], {}, 0
        node_ids = [tree.nodes[i].node_id for i in candidates.nodes]
        p, predictions = None, {}
        try:
            if node_ids and share > 0 and Need.PREFIX_PREDICTIONS in rules.prefixes.needs:
                size = len(tree.nodes)
                _, encoded = await off_loop(
                    size, self.predictors.encode_tree, tree, candidates.nodes.tolist()
                )
                outcomes = OutcomeCounts(*meta.prior_outcomes)
                queries = [Query(encoded[node_id], outcomes) for node_id in node_ids]
                _, p = await (await self.predictors.get(meta.job)).predict(queries)
                predictions = {node_id: float(value) for node_id, value in zip(node_ids, p, strict=True)}
            placement = place_round(
                rules,
                candidates,
                share,
                predicted=p,
                bare_successes=meta.bare_successes,
                bare_trials=meta.bare_leaves,
                fallback=not meta.return_unspent,
                rng=self._rng,
            )
        except (RedisError, OSError):
            raise  # the store is down: the claim lapses and the sweeper decides again
        except Exception:
            # A decision that cannot be made must not leave the tree waiting for it forever.
            logger.exception("Stage 2 of tree %s failed; its continuations are spread evenly", meta.tree_id)
            counts = _spread(meta, len(node_ids), share)
            return counts, node_ids, {}, int(counts.sum())
        return placement.counts, node_ids, predictions, placement.fallback_units


def _spread(meta: TreeMeta, candidates: int, share: int) -> IntArray:
    """What a round places when its rule failed: the share spread evenly over the candidates (all
    fallback), or nothing when the caller asked for its unspent share back."""
    if meta.return_unspent:
        return np.zeros(candidates, dtype=np.int64)
    return spread_evenly(np.ones(candidates, dtype=bool), share)
