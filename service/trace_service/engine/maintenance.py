"""The sweeper: what failed part-way on any replica, finished in the background."""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from trace_service.engine.common import Clock
from trace_service.engine.completion import Completion
from trace_service.engine.stage2_rounds import Stage2
from trace_service.settings import Settings
from trace_service.store import TreeProgress, TreeStore

logger = logging.getLogger(__name__)

#: Open trees the sweeper checks per store round trip (small: Redis runs one script at a time, and
#: requests wait behind it), and round trips per job and sweep.
_SWEEP_PAGE = 200
_SWEEP_PAGES = 50


class Sweeper:
    def __init__(
        self, store: TreeStore, settings: Settings, stage2: Stage2, completion: Completion, clock: Clock
    ) -> None:
        self.store = store
        self.settings = settings
        self.stage2 = stage2
        self.completion = completion
        self.clock = clock
        # Where each job's sweep resumes (an SSCAN cursor) when its open list is longer than one sweep.
        self._sweep_cursors: dict[str, int] = {}

    async def sweep(self) -> int:
        """Finish what failed part-way on any replica: decide Stage 2 rounds whose claims lapsed (their
        replica died mid-decision) and account for finished trees that are still listed as open.
        Returns the number of trees acted on.

        Reads three fields per open tree, a page at a time, and at most ``_SWEEP_PAGES`` pages per job
        and call, resuming where the previous call stopped: a long open list (abandoned steps stay
        open until they expire) costs a bounded slice of each interval, never a stall.
        """
        acted = 0
        for job in await self.store.jobs():
            cursor = self._sweep_cursors.get(job, 0)
            for _ in range(_SWEEP_PAGES):
                cursor, page = await self.store.open_trees(job, cursor, _SWEEP_PAGE)
                if cursor:  # resume after this page next time, even if something below fails
                    self._sweep_cursors[job] = cursor
                else:
                    self._sweep_cursors.pop(job, None)
                acted += await self._sweep_page(job, page)
                if cursor == 0:
                    break
        return acted

    async def _sweep_page(self, job: str, tree_ids: list[str]) -> int:
        if not tree_ids:
            return 0
        acted = 0
        now = self.clock()
        for tree_id, progress in zip(tree_ids, await self.store.progress(tree_ids), strict=True):
            try:
                acted += await self._sweep_tree(job, tree_id, progress, now)
            except (RedisError, OSError):
                raise  # the store is down: the whole sweep waits for the next interval
            except Exception:  # one damaged tree must not keep the sweeper from the others
                logger.exception("sweeper: tree %s of job %s failed", tree_id, job)
        return acted

    async def _sweep_tree(self, job: str, tree_id: str, progress: TreeProgress | None, now: float) -> int:
        if progress is None:  # expired
            await self.store.forget_open(job, tree_id)
            return 0
        if progress.finished:
            await self.completion.completed(tree_id)
            return 1
        if progress.claim_lapsed(now):
            round_, token = await self.store.take_over_decision(
                tree_id, now=now, lease=self.settings.decision_lease_seconds
            )
            if round_:
                await self.stage2.decide(tree_id, round_, token, inline=False)
                return 1
        return 0
