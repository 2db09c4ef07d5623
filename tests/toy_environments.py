"""Toy stateful environments the trainer integrations' tests run their continuations on."""

from __future__ import annotations

from trace_client.envs import Step


class Countdown:
    """A toy stateful environment: the observation counts down from 2; at 0 the episode ends, reward 1."""

    def reset(self, seed: int) -> object:
        self.left = 2
        return "2"

    def step(self, action: object) -> Step:
        self.left -= 1
        return Step(str(self.left), float(self.left == 0), self.left == 0)

    def close(self) -> None:
        pass
