"""Polling for the trees that wait on the service: with no local work left, no answer to an event of
theirs will move them on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

from trace_client.client import AsyncTraceClient
from trace_client.driver._books import Tree, Trees
from trace_client.driver._rollouts import Rollouts
from trace_client.driver.types import DriverConfig
from trace_client.errors import TraceError
from trace_proto import TreeStatus
from trace_proto.v1.limits import MAX_CLAIM

logger = logging.getLogger(__name__)

#: Longest pause between two status checks of a tree that waits on the service (the pause doubles
#: from `poll_interval` while the tree stays open, so a long wait costs the service little).
_MAX_CHECK_SECONDS: Final = 10.0


class Supervisor:
    """Looks after the trees that wait on the service, at most every `poll_interval`: claims the job's
    leased instructions, checks each waiting tree's status (less often while it stays open) and closes
    those nothing can finish any more."""

    def __init__(
        self, client: AsyncTraceClient, config: DriverConfig, job: str, trees: Trees, rollouts: Rollouts
    ) -> None:
        self._client = client
        self._config = config
        self._job = job
        self._trees = trees
        self._rollouts = rollouts
        self._last_poll = 0.0

    async def run(self) -> None:
        while True:
            self._trees.changed.clear()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that comes
            # as the event is set, and the run could then never be stopped
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._config.poll_interval):
                    await self._trees.changed.wait()
            waiting = self._trees.waiting()
            if waiting and time.monotonic() - self._last_poll >= self._config.poll_interval:
                self._last_poll = time.monotonic()
                await self._poll(waiting)

    async def _poll(self, waiting: list[Tree]) -> None:
        """An unreachable service is tried again at the next poll."""
        try:
            await self._poll_service(waiting)
        except TraceError as error:
            logger.warning("polling the service failed, trying again: %s", error)

    async def _poll_service(self, waiting: list[Tree]) -> None:
        claimed = await self._client.claim_instructions(self._job, MAX_CLAIM)
        for instruction in claimed.instructions:
            self._rollouts.start_instruction(instruction)
        for tree in waiting:
            if not tree.waiting:
                continue  # a claimed instruction gave it work
            if tree.broken:
                await self._close(tree)
                continue
            now = time.monotonic()
            if now < tree.next_check:
                continue
            status = (await self._client.get_tree(tree.tree_id)).status
            if status in (TreeStatus.COMPLETE, TreeStatus.CLOSED):
                self._trees.finish(tree)
            elif status is TreeStatus.COLLECTING:
                await self._close(tree)  # its bare rollouts all ended here, yet not all were scored
            else:  # expanding: a decision or a leased instruction is pending elsewhere
                tree.check_pause = min(
                    max(2 * tree.check_pause, self._config.poll_interval), _MAX_CHECK_SECONDS
                )
                tree.next_check = now + tree.check_pause

    async def _close(self, tree: Tree) -> None:
        logger.warning("closing tree %s: nothing can finish it", tree.tree_id)
        await self._client.close_tree(tree.tree_id)
        self._trees.finish(tree)
