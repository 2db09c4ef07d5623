"""A workload whose difficulty cues flip (`bench/learning.py --mislead-after K`): from step K on, each
task is offered to the service under the id and text of the task half the ranking away in difficulty
under the arm's policy then (ranks rotated by half: the tasks of middling difficulty, where groups are
mixed, carry the labels of the easiest and hardest, and those the labels of middling ones).  What the
job's predictor learned of each id and each text, its outcome history included, then points the wrong
way: Stage 1 spends on the labels it expects to be mixed and skips the ones it expects to agree, a job
whose policy loses by following it.  The agent runs the true task behind
each label, so the learner and its held-out evaluation are untouched."""

from __future__ import annotations

import numpy as np

from trace_client.driver import History
from trace_lab.sim.base import Workload
from trace_lab.sim.state import Prompt, RolloutState
from trace_lab.sim.workers import SimAgent


class Relabelling:
    """Which task each label stands for: none relabelled until :meth:`swap_difficulty`."""

    def __init__(self) -> None:
        self._shown: dict[str, Prompt] = {}
        self._true: dict[str, str] = {}

    def swap_difficulty(self, workload: Workload) -> None:
        """Rank the tasks by their true success now and give the task of rank r the label of rank
        r + n/2 (mod n)."""
        prompts = workload.prompts
        order = np.argsort(workload.true_success_many([p.prompt_id for p in prompts]), kind="stable")
        for rank, index in enumerate(order):
            task, partner = prompts[index], prompts[order[(rank + len(order) // 2) % len(order)]]
            self._shown[task.prompt_id] = partner
            self._true[partner.prompt_id] = task.prompt_id

    def shown(self, prompt: Prompt) -> Prompt:
        """The prompt as the service sees it."""
        return self._shown.get(prompt.prompt_id, prompt)

    def true_id(self, label: str) -> str:
        """The task behind a label the service knows."""
        return self._true.get(label, label)


class RelabelledAgent(SimAgent):
    """`SimAgent` that starts each rollout on the true task behind its prompt's label."""

    def __init__(self, workload: Workload, rng: np.random.Generator, labels: Relabelling) -> None:
        super().__init__(workload, rng)
        self.labels = labels

    def _state(self, history: History) -> RolloutState:
        if history.last_turn is None:
            return self.workload.start(self.labels.true_id(history.prompt.prompt_id))
        return super()._state(history)
