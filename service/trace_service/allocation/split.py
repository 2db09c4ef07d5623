"""How much of an allocation follows the policy's rule, from the job's own evidence (pure).

Each allocation of a job is a two-armed experiment: a share ``π`` of its bare rollouts follows the
policy's rule and the rest, the *control* trees, uniform's (``allocation.control_share``).  Both arms are
random samples of what their rule does on the job's pools, so the job's complete trees estimate, without
bias, the gain ``R`` of the policy over uniform in mixed groups per generated turn
(``allocation.gain``).  The next allocation's share is the probability, on that evidence, that the
policy is no worse than uniform by more than ``c`` standard errors, kept within a floor ``ε`` on each
arm:

    π = clip(Φ(L / s + c),  ε, 1 − ε),       c = 1.645 − Φ⁻¹(0.8) ≈ 0.80,

``L`` the bias-corrected log gain per turn and ``s`` the smaller of its standard error and the one it
would have if the arms were alike (``Gain.null_error``; the first keeps the promise below, the second
keeps a poor arm's first mixed trees from lowering its share; an arm with no mixed tree yet counts
half of one, ``gain.arm_rate``), over the job's earlier steps each weighted
``2^(−age / h)`` (``h`` the evidence's half-life in steps, so a job whose predictor gets better, or
worse, is followed) over the last ``⌈10·h⌉`` of them (``evidence_steps``).  ``Φ(L/s)`` alone would be
probability matching (the deterministic form of
Thompson sampling); the tolerance ``c·s`` shrinks with the evidence, so the rule becomes it as the
evidence grows, and it fixes the two ends a user meets first: before any evidence the policy gets
``Φ(c) ≈ 0.79`` of the budget (a job starts on TRACE's rules, whose gain the benchmarks show), and as
soon as the job's 90% interval lies below 1 (``L/s ≤ −1.645``) it gets at most
``Φ(c − 1.645) = 0.2``: four fifths of the budget follow uniform.

What it guarantees against always playing the better arm, per step (``R`` the gain per turn and
``Δ = |1 − 1/R|`` the worse arm's shortfall in mixed groups relative to the better one's):

- the floor costs at most ``ε·Δ`` of a step's mixed groups, the price of keeping both estimates
  unbiased and of noticing when the better arm changes;
- above the floor the worse arm's share is ``Φ(c − |log R|/s)`` for a losing policy (``Φ(−c −
  |log R|/s)`` for a losing uniform).  With every step weighing alike ``s``
  shrinks as ``σ/√t`` (σ one step's standard error) and the summed cost is a constant of order
  ``σ²/Δ``, Thompson sampling's logarithmic regret; with the half-life the evidence is that of
  ``n_h = (1 + λ)/(1 − λ)`` steps (``λ = 2^(−1/h)``, 11.6 steps at h = 4), so ``s`` settles at
  ``σ/√n_h`` and the cost per step at ``Φ(−|log R|·√n_h/σ)·Δ``: negligible once a step's evidence
  tells the arms apart within ``n_h`` steps, at most ``Δ/2`` per step when it never does (and then
  the arms are within noise of each other; the tolerance lets a policy worse by less than about
  ``c·s`` keep more than half the budget, a loss of at most ``c·s`` in log gain on that share).
  The loss is never more than ``(1 − ε)·Δ`` a step.

A job whose policy loses keeps moving to ``1 − ε`` of uniform as its evidence grows, and one whose
policy wins keeps only the floor on controls.  A floor of ``ε ≥ 1/2`` pins the share at ``1 − ε``
(no adaptation).

The same rule chooses the shape of the policy's Stage 2 (``decide_shape``).  Whether continuations from
deep prefixes pay depends on the task: where the predictor ranks a rollout's turns well they find contrast
cheaply (a continuation from turn d generates only what follows it), where it does not a continuation from
the first turn, nearly a fresh rollout of the prompt, flips the group's outcome more often.  So each policy
tree is drawn, at random, one of two shapes, and the job's evidence of which finds more mixed groups per
generated turn sets the odds: the share that may branch at any depth the request allows (*deep*) is

    π_deep = clip(Φ(L_deep / s_deep + c),  ε, 1 − ε),

``L_deep`` the bias-corrected log gain of the deep trees over the *first-turn* trees, with the same
floor, tolerance and half-life, so that both estimates stay unbiased and a job starts on the paper's
shape with ``Φ(c)`` of its trees.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from trace_service.allocation.gain import (
    BRANCH_DEEP,
    BRANCH_FIRST,
    CONTROL,
    POLICY,
    Z_90,
    ArmSums,
    Gain,
    Unit,
    gain_ratio,
)

#: The unit the split is decided in: what a user pays for is generated turns.
SPLIT_UNIT: Unit = "turns"
#: How many half-lives of steps the split reads (``evidence_steps``).
EVIDENCE_HALF_LIVES = 10
#: ``c``: the standard errors of shortfall the policy is allowed before it gives up half the budget,
#: such that a 90% interval below 1 leaves it a fifth.
TOLERANCE = Z_90 - NormalDist().inv_cdf(0.8)
#: A log gain or standard error this small is rounding: zero.
_NO_SPREAD = 1e-12


@dataclass(frozen=True, slots=True)
class Split:
    """The share of an allocation's bare rollouts that follows the policy, and the evidence it read."""

    policy_share: float
    policy_better: float
    gain: Gain | None

    @property
    def control_share(self) -> float:
        return 1.0 - self.policy_share


@dataclass(frozen=True, slots=True)
class BranchShape:
    """The share of the policy's trees that may branch below their first turn, and the evidence it read
    (the others branch from first turns only)."""

    deep_share: float
    deep_better: float
    gain: Gain | None


#: The shape of a job that keeps no evidence (no controls): every policy tree may branch at any depth.
ANY_DEPTH = BranchShape(deep_share=1.0, deep_better=0.5, gain=None)


def evidence_steps(now: int, half_life: float) -> range:
    """The earlier steps whose evidence the split reads: the last ``⌈10·h⌉``, older ones weighing under
    2^(−10) ≈ 0.001 (so an allocation reads a bounded window however long the job has run)."""
    return range(max(now - math.ceil(EVIDENCE_HALF_LIVES * half_life), 0), now)


def step_weights(steps: Mapping[int, object], now: int, half_life: float) -> dict[int, float]:
    """``2^(−(now − s)/h)`` for each earlier step ``s`` (later steps, a retry's own, weigh nothing)."""
    if half_life <= 0:
        raise ValueError(f"the evidence's half-life must be positive, got {half_life}")
    return {s: 2.0 ** (-(now - s) / half_life) for s in steps if s < now}


def decide_split(
    step_totals: Mapping[int, Mapping[str, int]], now: int, floor: float, half_life: float
) -> Split:
    """The module's share for the allocation of step ``now`` from the job's per-step totals
    (``ArmSums.figures`` of both arms), with the floor ``ε`` on each arm."""
    share, better, gain = _arm_share(step_totals, now, floor, half_life, POLICY, CONTROL)
    return Split(policy_share=share, policy_better=better, gain=gain)


def decide_shape(
    step_totals: Mapping[int, Mapping[str, int]], now: int, floor: float, half_life: float
) -> BranchShape:
    """The module's share of deep trees among the policy's trees of step ``now``, from the job's per-step
    totals of both shapes, with the floor ``ε`` on each."""
    share, better, gain = _arm_share(step_totals, now, floor, half_life, BRANCH_DEEP, BRANCH_FIRST)
    return BranchShape(deep_share=share, deep_better=better, gain=gain)


def _arm_share(
    step_totals: Mapping[int, Mapping[str, int]],
    now: int,
    floor: float,
    half_life: float,
    arm: str,
    other: str,
) -> tuple[float, float, Gain | None]:
    """``(π, Φ(L/s), gain)`` of ``arm`` against ``other`` (the module's rule)."""
    if not (math.isfinite(floor) and 0.0 <= floor <= 1.0):
        raise ValueError(f"the floor must lie in [0, 1], got {floor}")
    window = evidence_steps(now, half_life)
    weights = step_weights({s: None for s in step_totals if s in window}, now, half_life)
    mine = [(w, ArmSums.from_figures(step_totals[s], arm)) for s, w in weights.items()]
    theirs = [(w, ArmSums.from_figures(step_totals[s], other)) for s, w in weights.items()]
    gain = gain_ratio(mine, theirs, SPLIT_UNIT, haldane=True)
    if gain is None:
        return _clip(_normal_cdf(TOLERANCE), floor), 0.5, None
    # The smaller of the two errors: the usual one keeps the promise of an interval below 1, the one
    # at the pooled rate keeps a poor arm's first mixed trees from counting against it.
    error = min(gain.log_error, gain.null_error)
    if error <= _NO_SPREAD:  # every tree alike in both arms: z is 0 or infinite
        if abs(gain.log_ratio) <= _NO_SPREAD:
            return _clip(_normal_cdf(TOLERANCE), floor), 0.5, gain
        better = float(gain.log_ratio > 0)
        return _clip(better, floor), better, gain
    z = gain.log_ratio / error
    return _clip(_normal_cdf(z + TOLERANCE), floor), _normal_cdf(z), gain


def draw_deep(
    eligible: npt.NDArray[np.bool_], deep_share: float, rng: np.random.Generator
) -> npt.NDArray[np.bool_]:
    """Which of the ``eligible`` trees may branch at any depth: ``⌊π_deep·n + U⌋`` of the ``n`` eligible,
    drawn uniformly (``U ~ Uniform[0, 1)``, so the share is exact on average); the others branch from
    first turns."""
    if not (math.isfinite(deep_share) and 0.0 <= deep_share <= 1.0):
        raise ValueError(f"the deep share must lie in [0, 1], got {deep_share}")
    slots = np.flatnonzero(eligible)
    deep = np.zeros(eligible.size, dtype=bool)
    count = min(math.floor(deep_share * slots.size + rng.random()), slots.size)
    deep[rng.choice(slots, size=count, replace=False)] = True
    return deep


def _clip(share: float, floor: float) -> float:
    """``clip(share, ε, 1 − ε)``, and ``1 − ε`` when the floors cross."""
    if floor >= 0.5:
        return 1.0 - floor
    return min(max(share, floor), 1.0 - floor)


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))
