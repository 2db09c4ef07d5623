"""The rollouts of a run: the user's callables called turn by turn, each turn sent on as an event."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Final, TypeVar

from trace_client.driver._books import Tally, Tree, Trees
from trace_client.driver._events import Outbox
from trace_client.driver.types import DriverConfig, History, NextTurn, Score, TurnRecorded, TurnResult
from trace_proto import Instruction

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Characters of an error message kept in a failure leaf's text.
_FAILURE_TEXT_CHARS: Final = 2_000


class Agent:
    """The user's callables as the driver calls them: in a worker thread when `threaded`, each call
    within `turn_timeout`, and what they return checked."""

    def __init__(
        self,
        next_turn: Callable[[], NextTurn],
        score: Callable[[], Score | None],
        on_turn: Callable[[], TurnRecorded | None],
        config: DriverConfig,
    ) -> None:
        # getters, called at each turn: a caller may swap the driver's callables between calls
        self._next_turn = next_turn
        self._score_callable = score
        self._on_turn = on_turn
        self._config = config

    async def next_turn(self, history: History) -> TurnResult:
        """The turn after `history`; a final turn without a reward gets the score's."""
        turn = await self._call(self._next_turn(), history)
        if not isinstance(turn, TurnResult):
            raise TypeError(f"next_turn returned {type(turn).__name__}, not a TurnResult")
        if turn.done and turn.reward is None:
            turn = replace(turn, reward=await self._score(history.then(turn)))
        return turn

    def recorded(self, tree_id: str, node_id: str, turn: TurnResult) -> None:
        """Tell the user's `on_turn`, if any, that `turn` was recorded as `node_id`."""
        on_turn = self._on_turn()
        if on_turn is not None:
            on_turn(tree_id, node_id, turn)

    async def _score(self, history: History) -> float:
        score = self._score_callable()
        if score is None:
            raise ValueError("the final turn carries no reward and the driver was given no score callable")
        reward = await self._call(score, history)
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ValueError(f"score returned {reward!r}, not a finite number")
        return float(reward)

    async def _call(self, function: Callable[[History], T | Awaitable[T]], history: History) -> T:
        async def call() -> T:
            if self._config.threaded and not inspect.iscoroutinefunction(function):
                value = await asyncio.to_thread(function, history)
            else:
                value = function(history)
            if inspect.isawaitable(value):
                return await value
            return value

        if self._config.turn_timeout is None:
            return await call()
        async with asyncio.timeout(self._config.turn_timeout):
            return await call()


class Rollouts:
    """The run's rollouts, at most `concurrency` at a time: each runs turn by turn from its start history
    to a leaf and sends every turn as an event; a failure becomes a failure leaf. Bare rollouts start
    with their tree, continuations from an instruction's node."""

    def __init__(
        self, agent: Agent, config: DriverConfig, trees: Trees, outbox: Outbox, tally: Tally
    ) -> None:
        self._config = config
        self._agent = agent
        self._trees = trees
        self._outbox = outbox
        self._tally = tally
        self._slots = asyncio.Semaphore(self._config.concurrency)
        self.tasks: set[asyncio.Task[None]] = set()
        self.instructions: list[Instruction] = []

    def start_bare(self, tree: Tree) -> None:
        self._tally.bare_rollouts += tree.allocation.rollouts
        for _ in range(tree.allocation.rollouts):
            self._spawn(tree, History(tree.prompt, tree.tree_id), None, None)

    def start_instruction(self, instruction: Instruction) -> None:
        """Start an instruction's continuations once, from the exact history that ends at its node."""
        tree = self._trees.get(instruction.tree_id)
        if tree is None or tree.finished or instruction.instruction_id in tree.instructions:
            return  # another worker's tree (left to its lease), or already started here
        start = tree.histories.get(instruction.node_id)
        if start is None:
            logger.warning(
                "instruction %s branches from node %s, which this driver did not run",
                instruction.instruction_id,
                instruction.node_id,
            )
            return
        tree.instructions.add(instruction.instruction_id)
        self.instructions.append(instruction)
        self._tally.continuations += instruction.count
        for _ in range(instruction.count):
            self._spawn(tree, start, instruction.node_id, instruction.instruction_id)

    def _spawn(self, tree: Tree, start: History, parent_id: str | None, instruction_id: str | None) -> None:
        tree.running += 1
        task = asyncio.create_task(self._rollout(tree, start, parent_id, instruction_id))
        for tasks in (self.tasks, tree.tasks):
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _rollout(
        self, tree: Tree, start: History, parent_id: str | None, instruction_id: str | None
    ) -> None:
        try:
            async with self._slots:
                ended = await self._turns(tree, start, parent_id, instruction_id)
            if ended:
                if instruction_id is None:
                    self._tally.bare_finished += 1
                else:
                    self._tally.continuations_finished += 1
        finally:
            tree.running -= 1
            self._trees.changed.set()

    async def _turns(
        self, tree: Tree, history: History, parent_id: str | None, instruction_id: str | None
    ) -> bool:
        """Run one rollout from `history` to its leaf; True once its leaf (or failure leaf) is reported."""
        parent, instruction = parent_id, instruction_id
        try:
            while not tree.finished:
                if history.depth >= self._config.max_turns:
                    raise RuntimeError(f"the rollout did not end within max_turns={self._config.max_turns}")
                turn = await self._agent.next_turn(history)
                history = history.then(turn)
                parent = self._outbox.send_turn(tree, parent, instruction, turn, history)
                self._agent.recorded(tree.tree_id, parent, turn)
                instruction = None
                if turn.done:
                    return True
            return False
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if tree.finished:
                return False
            self._report_failure(tree, parent, instruction, error)
            return True

    def _report_failure(
        self, tree: Tree, parent_id: str | None, instruction_id: str | None, error: Exception
    ) -> None:
        message = f"{type(error).__name__}: {error}"[:_FAILURE_TEXT_CHARS]
        logger.warning("rollout in tree %s failed: %s", tree.tree_id, message)
        self._tally.failed += 1
        self._outbox.send_failure(tree, parent_id, instruction_id, message, self._config.failure_reward)
