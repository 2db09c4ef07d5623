"""The estimators Ṽ the harness's strategies consult: what an estimator sees of a history (`Query`), the
trees a learning one observes (`FinishedTree`), the Beta posterior of each prompt's outcomes (MoPPS-style,
`posterior_estimator`), the oracle that reads the simulator's truth, and the references built on them
(`TruthAt`: the truth at roots or prefixes only; `KnowableRoots`: what the workloads let one know)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from trace_lab.sim import Prompt, RolloutState
from trace_lab.sim.base import Workload

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Query:
    """What an estimator sees of one history: the prompt, the prefix state, and the prompt's observed
    outcomes (bare rollouts of earlier steps, plus this step's once they are scored).

    `state.p` is the simulator's truth: only the oracle may read it.
    """

    prompt: Prompt
    state: RolloutState
    successes: int
    trials: int


Estimator = Callable[[Sequence[Query]], FloatArray]


@dataclass(frozen=True)
class FinishedTree:
    """One prompt's tree at the end of a step, for estimators that learn (those with an ``observe``):
    node states (each carries its history), parents as local indices (-1: the prompt), leaf rewards
    (NaN elsewhere), the prompt's outcomes from before this step, and this step's bare rollouts'."""

    prompt: Prompt
    states: list[RolloutState]
    parent: list[int]
    reward: list[float]
    successes: int
    trials: int
    bare_successes: int
    bare_trials: int


@runtime_checkable
class PredictiveEstimator(Protocol):
    """An estimator that also says how sure it is: each query's Ṽ and the concentration κ of its Beta
    belief, ``p ~ Beta(κṼ, κ(1 − Ṽ))`` (what `RootBelief.thompson` reads)."""

    def __call__(self, queries: Sequence[Query]) -> FloatArray: ...

    def predictive(self, queries: Sequence[Query]) -> tuple[FloatArray, FloatArray]: ...


class PosteriorEstimator:
    """MoPPS-style: the Beta(1, 1) posterior of the prompt's own outcomes, mean (1 + s) / (2 + n) and
    concentration 2 + n.

    The same value for a root and for every prefix of its rollouts.
    """

    def __call__(self, queries: Sequence[Query]) -> FloatArray:
        return self.predictive(queries)[0]

    def predictive(self, queries: Sequence[Query]) -> tuple[FloatArray, FloatArray]:
        count = len(queries)
        successes = np.fromiter((query.successes for query in queries), dtype=np.float64, count=count)
        trials = np.fromiter((query.trials for query in queries), dtype=np.float64, count=count)
        return (1.0 + successes) / (2.0 + trials), 2.0 + trials


posterior_estimator = PosteriorEstimator()


def oracle_estimator(queries: Sequence[Query]) -> FloatArray:
    """The simulator's true conditional success at each history: TRACE's ceiling."""
    return np.fromiter((query.state.p for query in queries), dtype=np.float64, count=len(queries))


class _Wrapping:
    """An estimator around another: the wrapped one still answers every query and learns from every
    tree (``observe``), so it trains exactly as it would alone; the wrapper only replaces some values."""

    def __init__(self, estimator: Estimator) -> None:
        self.estimator = estimator

    def observe(self, trees: Sequence[FinishedTree]) -> None:
        observe = getattr(self.estimator, "observe", None)
        if observe is not None:
            observe(trees)


def _at_root(queries: Sequence[Query]) -> npt.NDArray[np.bool_]:
    return np.fromiter((query.state.turns == 0 for query in queries), dtype=bool, count=len(queries))


class TruthAt(_Wrapping):
    """Ṽ from the simulator's truth at the roots (``roots=True``) or at the prefixes (``roots=False``)
    and from ``estimator`` everywhere else: which stage's predictions the gap to the oracle comes from."""

    def __init__(self, estimator: Estimator, *, roots: bool) -> None:
        super().__init__(estimator)
        self.roots = roots

    def __call__(self, queries: Sequence[Query]) -> FloatArray:
        estimated = estimate(self.estimator, queries)
        return np.where(_at_root(queries) == self.roots, oracle_estimator(queries), estimated)


#: Success probabilities are kept this far from 0 and 1, where the logit is infinite.
_LOGIT_FLOOR = 1e-6


class KnowableRoots(_Wrapping):
    """Ṽ at the roots as the Bayes posterior of what a workload lets one know, and from ``estimator``
    everywhere else: a reference for how far any Stage 1 estimator could get.

    Root i of one call is scored against the true successes p_j of the call's other roots (the
    population, known exactly: an empirical prior), its own outcomes (s_i of n_i) and a reading of its
    text, x_i = logit p_i + σ·ε_i with ε_i ~ N(0, 1) fixed per prompt (crc32 of its id):

        w_ij ∝ p_j^s_i · (1 − p_j)^(n_i − s_i) · exp(−(x_i − logit p_j)² / 2σ²)   (j ≠ i),
        Ṽ_i = Σ_j w_ij p_j / Σ_j w_ij.

    σ = `text_noise`, the family's declared text offset (`declared_text_noise`); σ = ∞ reads no text
    (history only). Generous where it matters: the prior is the truth, the text's noise is only its
    shared offset (no per-word blur, no missing words). Not a strict bound: it ignores what earlier
    rollouts' turns and the policy's drift tell, and its likelihood reads today's p for old outcomes.
    """

    def __init__(self, estimator: Estimator, *, text_noise: float) -> None:
        if not text_noise > 0:
            raise ValueError(f"text_noise must be > 0 (math.inf: no text), got {text_noise}")
        super().__init__(estimator)
        self.text_noise = text_noise

    def __call__(self, queries: Sequence[Query]) -> FloatArray:
        values = estimate(self.estimator, queries).copy()
        roots = np.flatnonzero(_at_root(queries))
        if roots.size >= 2:
            values[roots] = self._posterior_means([queries[i] for i in roots.tolist()])
        return values

    def _posterior_means(self, roots: Sequence[Query]) -> FloatArray:
        p = np.clip(oracle_estimator(roots), _LOGIT_FLOOR, 1.0 - _LOGIT_FLOOR)
        successes = np.array([query.successes for query in roots], dtype=np.float64)
        failures = np.array([query.trials - query.successes for query in roots], dtype=np.float64)
        log_weight = np.outer(successes, np.log(p)) + np.outer(failures, np.log1p(-p))
        if math.isfinite(self.text_noise):
            logit = np.log(p) - np.log1p(-p)
            error = np.array([text_error(query.prompt.prompt_id) for query in roots])
            reading = logit + self.text_noise * error
            log_weight -= 0.5 * ((reading[:, None] - logit[None, :]) / self.text_noise) ** 2
        np.fill_diagonal(log_weight, -np.inf)
        weight = np.exp(log_weight - log_weight.max(axis=1, keepdims=True))
        return np.asarray(weight @ p / weight.sum(axis=1), dtype=np.float64)


def text_error(prompt_id: str) -> float:
    """ε of `KnowableRoots`: one standard normal draw per prompt, the same in every run."""
    return float(np.random.default_rng(zlib.crc32(prompt_id.encode())).standard_normal())


def declared_text_noise(workload: Workload) -> float:
    """How far a family's text says a prompt's difficulty is off, on the logit scale: its config's
    `text_bias` (`FamilyConfig`), or ∞ (read nothing from the text) for a family that declares none."""
    return float(getattr(getattr(workload, "config", None), "text_bias", math.inf))


def estimate(estimator: Estimator, queries: Sequence[Query]) -> FloatArray:
    """Call a pluggable estimator and check its answer: one probability per query."""
    return check_estimates(np.asarray(estimator(queries), dtype=np.float64), len(queries))


def check_estimates(estimates: FloatArray, count: int) -> FloatArray:
    if estimates.shape != (count,):
        raise ValueError(f"the estimator returned shape {estimates.shape} for {count} queries")
    if not np.all((estimates >= 0.0) & (estimates <= 1.0)):
        raise ValueError("the estimator returned values outside [0, 1] (or NaN)")
    return estimates
