"""The values every simulated workload trades in: prompts, turns, and immutable rollout prefixes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Prompt:
    """A task: its id, its text, and (when the config asks for them) numeric features."""

    prompt_id: str
    text: str
    features: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of a rollout; `reward` is set exactly when `done`. `action` is the index of the action
    the agent chose in this turn, for families driven by a policy (`PolicyWorkload`), else None."""

    text: str
    done: bool
    reward: float | None = None
    features: tuple[float, ...] | None = None
    action: int | None = None


@dataclass(frozen=True, slots=True)
class RolloutState:
    """A rollout prefix: the prompt, the turns so far, and the exact P(success | this prefix) `p`.

    A value, never mutated: continuing a state any number of times shares its prefix exactly. After the
    final turn `p` equals the reward. `latent` is the family's hidden MDP state after these turns (empty
    for families without one, such as `SimWorkload`).
    """

    prompt_id: str
    p: float
    history: tuple[Turn, ...] = ()
    latent: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p is a probability and must lie in [0, 1], got {self.p}")

    @property
    def turns(self) -> int:
        return len(self.history)

    @property
    def done(self) -> bool:
        return bool(self.history) and self.history[-1].done

    @property
    def reward(self) -> float | None:
        return self.history[-1].reward if self.history else None

    @property
    def last_turn(self) -> Turn | None:
        return self.history[-1] if self.history else None
