"""A simulated workload family as the worker driver's callables: it plays the generation workers in the
demo, the tests, the benchmarks and anyone's dry run of the driver.

Each turn's `TurnResult.state` is the simulator's `RolloutState` after that turn, so a continuation
resumes exactly from its prefix. Turns requested in the same event-loop pass are stepped together in one
vectorised `Workload.step_many` call.
"""

from __future__ import annotations

import asyncio

import numpy as np

from trace_client.driver import History, StepResult, TurnResult
from trace_lab.sim import Prompt, RolloutState
from trace_lab.sim.base import Workload
from trace_proto import PromptIn


def prompt_in(prompt: Prompt) -> PromptIn:
    """A simulated prompt as a pool entry of `/v1/allocate`."""
    features = None if prompt.features is None else list(prompt.features)
    return PromptIn(prompt_id=prompt.prompt_id, text=prompt.text, features=features)


class SimAgent:
    """`next_turn` over any `Workload`; `learn` feeds a finished step back in learning mode."""

    def __init__(self, workload: Workload, rng: np.random.Generator) -> None:
        self.workload = workload
        self.rng = rng
        self._pending: list[tuple[RolloutState, asyncio.Future[RolloutState]]] = []

    async def next_turn(self, history: History) -> TurnResult:
        """The turn after `history`, drawn with every other turn requested in this pass of the loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RolloutState] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._step_pending)
        self._pending.append((self._state(history), future))
        after = await future
        turn = after.last_turn
        assert turn is not None  # a stepped state always has a turn
        return TurnResult(
            text=turn.text, done=turn.done, reward=turn.reward, features=turn.features, state=after
        )

    def learn(self, result: StepResult) -> None:
        """Learning mode: every tree of the step trains the simulated policy on its prompt if it was mixed."""
        for finished in result.trees:
            self.workload.learn(finished.prompt.prompt_id, finished.tree.mixed)

    def _state(self, history: History) -> RolloutState:
        last = history.last_turn
        if last is None:
            return self.workload.start(history.prompt.prompt_id)
        if not isinstance(last.state, RolloutState):
            raise ValueError(
                "the history's last turn carries no simulator state: it was not made by SimAgent"
            )
        return last.state

    def _step_pending(self) -> None:
        batch, self._pending = self._pending, []
        waiting = [(state, future) for state, future in batch if not future.done()]  # cancelled rollouts
        if not waiting:
            return
        try:
            stepped = self.workload.step_many([state for state, _ in waiting], self.rng)
        except Exception as error:
            for _, future in waiting:
                future.set_exception(error)
            return
        for (_, future), after in zip(waiting, stepped, strict=True):
            future.set_result(after)
