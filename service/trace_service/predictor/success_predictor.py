"""The shared success predictor: inference, online training, versioned weights, checkpoints.

Training examples come from completed trees: for node y, the history ending at y, the target
V̂(y) = (1/n_y) Σ_{c ∈ children(y)} n_c V̂(c) (the success rate of the n_y leaves below y; a leaf's target
is its reward) and the weight n_y. The loss is the weighted mean squared error

    L = Σ_y n_y (Ṽ(y) − V̂(y))² / Σ_y n_y

because V̂(y) averages n_y Bernoulli outcomes, its variance is V(1 − V)/n_y, and weighting each squared
error by the inverse of its noise variance (∝ n_y) is the efficient choice.

The network reads no outcome history; it learns the prior mean μ(H) from what histories carry. A
prompt's own outcomes (s successes in n earlier bare rollouts) enter at prediction time by the exact
conjugate update of Beta(κμ, κ(1 − μ)) at the root, (κ·m + s) / (κ + n), and a prefix inherits its
root's change of log-odds (:meth:`SuccessPredictor._predict_with`). After every training round the
calibration (:class:`Calibration`) fits κ by marginal likelihood to the groups of bare rollouts of
finished trees (:class:`RootGroup`; held-out ones once there are enough, else all), for two sources of
the root prior mean m: the network's μ(x), and one constant for every prompt (the pooled bare success
rate: the history-only posterior). The source with the higher mean log-likelihood per group is served.

Replay buffer: FIFO of the most recent ``replay_capacity`` training examples. FIFO rather than a
reservoir because the policy being trained drifts, so old targets describe an older policy. Each new
example allows ``replay_ratio`` minibatch samples; training beyond that would only memorise the buffer. Every
``holdout_every``-th completed tree is kept out of training, in a FIFO of ``holdout_capacity`` examples,
and :meth:`SuccessPredictor.diagnostics` scores the published weights on it.

Regularisation: dropout on the MLP input while training, and the published weights are an exponential
moving average of the trained ones (avg ← avg + (1 − ``weight_averaging``)·(w − avg) after every step),
which removes most of the noise of the last minibatches; the replay buffer is revisited many times
between new trees, and both lowered the calibration error on unseen simulated prompts (see
``bench/predictor.py``).

Concurrency: :meth:`SuccessPredictor.train_round` trains a private copy of the model under a lock and
publishes a frozen snapshot with the next version number in one reference assignment;
:meth:`SuccessPredictor.predict` reads that reference once, so it always sees one complete version and
never waits for training.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from trace_service.allocation.tree import FreshnessEstimate
from trace_service.predictor.archive import (
    TENSOR_PREFIX,
    TrainingData,
    pack_training_data,
    unpack_training_data,
)
from trace_service.predictor.calibration import Calibration, fit_calibration, posterior_mean, shift_log_odds
from trace_service.predictor.checkpoint import (
    CheckpointError,
    decode_checkpoint,
    encode_checkpoint,
    write_checkpoint,
)
from trace_service.predictor.checkpoint_content import (
    TRAINER_PREFIX,
    PredictorHeader,
    compact_weights,
    expand_weights,
    pack_random_streams,
    restore_random_streams,
    round_to_checkpoint,
)
from trace_service.predictor.config import PredictorConfig
from trace_service.predictor.diagnostics import (
    PredictorDiagnostics,
    brier_by_group,
    brier_score,
    expected_calibration_error,
    spearman,
    spearman_by_group,
)
from trace_service.predictor.examples import (
    FifoBuffer,
    RootGroup,
    RunningMoments,
    TrainingExample,
    training_data_bytes,
)
from trace_service.predictor.features import EncodedHistory, HistoryFeaturizer
from trace_service.predictor.model import (
    ModelInputs,
    Query,
    SuccessModel,
    collate,
    dense_dim,
    dense_features,
    resolve_device,
)

#: Bare-rollout groups kept for fitting the calibration (training and held-out, each).
_GROUP_CAPACITY = 4_096
#: Held-out groups needed before the calibration is fitted on them alone (else on all groups), and
#: groups needed before it is fitted at all (until then κ = α + β, the configured prior's).
_HELD_OUT_GROUPS = 64
_MIN_GROUPS = 16


class Predictive(NamedTuple):
    """Each query's Ṽ and the concentration of its prompt's Beta posterior, κ + n (κ the served
    calibration's, n the prompt's earlier bare rollouts): the root's success is believed to be
    ``Beta(concentration·Ṽ, concentration·(1 − Ṽ))``.  A prefix query carries its prompt's."""

    mean: npt.NDArray[np.float64]
    concentration: npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class TrainRoundResult:
    """Outcome of one :meth:`SuccessPredictor.train_round`."""

    version: int
    steps: int
    mean_loss: float | None
    buffered_examples: int


@dataclass(frozen=True, slots=True)
class _Published:
    version: int
    model: SuccessModel | None  # None: not trained yet, the prior mean is the configured μ₀
    calibration: Calibration


class SuccessPredictor:
    """Estimates Ṽ(H), the probability that a rollout continued from history H succeeds.

    Thread-safe: ``predict`` and ``diagnostics`` may run in any number of threads while one other
    thread calls ``add_examples`` and ``train_round``.
    """

    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config or PredictorConfig()
        self.featurizer = HistoryFeaturizer(self.config.featurizer_config())
        self.device = resolve_device(self.config.device)
        self._dense_width = dense_dim(self.config.feature_dim)
        self._data_lock = threading.Lock()
        self._train_lock = threading.Lock()
        self._replay: FifoBuffer[TrainingExample] = FifoBuffer(self.config.replay_capacity)
        self._holdout: FifoBuffer[TrainingExample] = FifoBuffer(self.config.holdout_capacity)
        self._groups: FifoBuffer[RootGroup] = FifoBuffer(_GROUP_CAPACITY)
        self._holdout_groups: FifoBuffer[RootGroup] = FifoBuffer(_GROUP_CAPACITY)
        self._moments = RunningMoments(self._dense_width)
        self._trees_added = 0
        self._examples_seen = 0
        self._sample_allowance = 0.0
        self._rng = np.random.default_rng(self.config.seed)
        self._dropout_generator = torch.Generator(self.device).manual_seed(self.config.seed)
        self._trainer_model = self._new_model()
        self._average_model = self._frozen_copy(self._trainer_model)
        self._optimizer = self._new_optimizer()
        self._published = _Published(0, None, self._cold_calibration())
        self._freshness = FreshnessEstimate()

    @property
    def version(self) -> int:
        """Version of the published weights; 0 until the first training round."""
        return self._published.version

    @property
    def examples_seen(self) -> int:
        """Training examples accepted so far (held-out ones not counted)."""
        return self._examples_seen

    @property
    def calibration(self) -> Calibration:
        """How the published version combines a prompt's outcome history with its prior."""
        return self._published.calibration

    @property
    def freshness(self) -> float:
        """How much a Stage 2 continuation behaves like a fresh rollout (ρ of Stage 1's joint objective),
        estimated from the continuations of the trees trained on (:func:`continuation_flips`)."""
        return self._freshness.value

    def observe_continuations(self, flips: float, fresh_flips: float) -> None:
        """Count one tree's continuation flips (:func:`~trace_service.allocation.tree.continuation_flips`)."""
        with self._data_lock:
            self._freshness = self._freshness.add(flips, fresh_flips)

    # -- inference -------------------------------------------------------------------------------

    def predict(self, queries: Sequence[Query]) -> npt.NDArray[np.float64]:
        """Ṽ for each query, in [0, 1], in batches of ``inference_batch_size`` under inference mode."""
        return self._predict_with(self._published, queries).mean

    def predictive(self, queries: Sequence[Query]) -> Predictive:
        """:meth:`predict` with each query's posterior concentration (:class:`Predictive`)."""
        return self._predict_with(self._published, queries)

    def predict_versioned(self, queries: Sequence[Query]) -> tuple[int, Predictive]:
        """:meth:`predictive` together with the version of the weights that made every value (record it
        next to decisions taken from them)."""
        published = self._published
        return published.version, self._predict_with(published, queries)

    def _predict_with(self, published: _Published, queries: Sequence[Query]) -> Predictive:
        """The network's prior μ(H) for every query, with the prompt's outcome history applied exactly:

            root:    (κ·m + s) / (κ + n),                       m = the root prior mean (``Calibration``)
            prefix:  σ(logit μ(H) − logit μ(x) + logit root),   x = the prefix's prompt alone,

        i.e. the history moves a prompt's odds and its prefixes inherit the move.  The root's posterior
        is Beta(κm + s, κ(1 − m) + n − s), of concentration κ + n, whichever source m comes from: κ is
        the one fitted for the served source."""
        for query in queries:
            if not isinstance(query, Query):
                raise ValueError(f"predict takes Query values, got {type(query).__name__}")
            self.featurizer.check_compatible(query.history)
        calibration = published.calibration
        # The prompt alone of every prefix query: one row per distinct prompt encoding (the nodes of a
        # tree share theirs), scored in the same forward pass as the queries.
        root_row: dict[int, int] = {}
        roots: list[EncodedHistory] = []
        for query in queries:
            if query.history.depth:
                row = root_row.setdefault(id(query.history.prompt_tokens), len(queries) + len(roots))
                if row == len(queries) + len(roots):
                    roots.append(query.history.root())
        scored = self._prior_means(published.model, [query.history for query in queries] + roots)
        prior = scored[: len(queries)]
        network_root = np.array(
            [
                scored[root_row[id(q.history.prompt_tokens)]] if q.history.depth else prior[i]
                for i, q in enumerate(queries)
            ],
            dtype=np.float64,
        )
        successes = np.array([query.outcomes.successes for query in queries], dtype=np.float64)
        trials = np.array([query.outcomes.trials for query in queries], dtype=np.float64)
        depth = np.array([query.history.depth for query in queries], dtype=np.int64)
        root_mean = (
            network_root
            if calibration.prior == "network"
            else np.full(len(queries), calibration.history_mean)
        )
        root = posterior_mean(root_mean, calibration.concentration, successes, trials)
        shifted = shift_log_odds(prior, network_root, root)
        return Predictive(np.where(depth == 0, root, shifted), calibration.concentration + trials)

    def _prior_means(
        self, model: SuccessModel | None, histories: Sequence[EncodedHistory]
    ) -> npt.NDArray[np.float64]:
        """The network's μ(H) (μ₀ before the first training round), in inference batches."""
        if model is None:
            return np.full(len(histories), self._cold_mean)
        queries = [Query(history) for history in histories]
        step = self.config.inference_batch_size
        chunks = [
            model.predict(self._collate(queries[start : start + step]))
            for start in range(0, len(queries), step)
        ]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float64)

    # -- training --------------------------------------------------------------------------------

    def add_examples(
        self, examples: Sequence[TrainingExample], group: RootGroup | None = None
    ) -> Literal["training", "holdout"]:
        """Add the examples of ONE completed tree, and the group of its bare rollouts (for the
        calibration); every ``holdout_every``-th tree is held out.

        All examples are validated first: on a ValueError nothing is added.
        """
        for example in examples:
            if not isinstance(example, TrainingExample):
                raise ValueError(f"add_examples takes TrainingExample values, got {type(example).__name__}")
            self.featurizer.check_compatible(example.history)
        if group is not None:
            if not isinstance(group, RootGroup):
                raise ValueError(f"group must be a RootGroup, got {type(group).__name__}")
            self.featurizer.check_compatible(group.root)
        groups = [group] if group is not None else []
        rows = dense_features([example.query for example in examples], self.config.feature_dim)
        with self._data_lock:
            self._trees_added += 1
            every = self.config.holdout_every
            if every and self._trees_added % every == 0:
                self._holdout.extend(examples)
                self._holdout_groups.extend(groups)
                return "holdout"
            self._replay.extend(examples)
            self._groups.extend(groups)
            self._moments.update(rows)
            self._examples_seen += len(examples)
            ratio = self.config.replay_ratio
            self._sample_allowance = min(
                self._sample_allowance + ratio * len(examples), ratio * len(self._replay)
            )
            return "training"

    def train_round(self, max_steps: int) -> TrainRoundResult:
        """Up to ``max_steps`` optimiser steps on minibatches drawn uniformly (with replacement) from
        the replay buffer, then publish the averaged weights as the next version.

        Steps are limited by the replay ratio: each training example added allows ``replay_ratio``
        minibatch samples (the allowance is capped at ``replay_ratio`` times the buffer's size), so
        calling this in a loop while no new trees arrive cannot overfit the buffer. With no allowance
        left nothing happens and the version stays.
        """
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        batch_size = self.config.batch_size
        with self._train_lock:
            with self._data_lock:
                examples = self._replay.snapshot()
                mean, std = self._moments.mean.copy(), self._moments.std()
                steps = min(max_steps, int(self._sample_allowance // batch_size))
                self._sample_allowance -= steps * batch_size
            if steps == 0:
                return TrainRoundResult(
                    self.version, steps=0, mean_loss=None, buffered_examples=len(examples)
                )
            model = self._trainer_model
            model.set_dense_standardisation(mean, std)
            total_loss = torch.zeros((), device=self.device)
            for _ in range(steps):
                picks = self._rng.integers(len(examples), size=batch_size)
                batch = [examples[index] for index in picks]
                inputs = self._collate([example.query for example in batch]).to(self.device)
                target = torch.tensor([example.target for example in batch], device=self.device)
                weight = torch.tensor([example.weight for example in batch], device=self.device)
                probability = torch.sigmoid(model(inputs, self._dropout_generator))
                loss = (weight * (probability - target) ** 2).sum() / weight.sum()
                self._optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                self._optimizer.step()
                self._update_average()
                total_loss += loss.detach()
            version = self._published.version + 1
            self._average_model.set_dense_standardisation(mean, std)
            model = self._frozen_copy(self._average_model)
            round_to_checkpoint(model)  # served here as every replica that loads it serves it
            self._published = _Published(version, model, self._fit_calibration(model))
            return TrainRoundResult(
                version,
                steps=steps,
                mean_loss=float(total_loss.item()) / steps,
                buffered_examples=len(examples),
            )

    # -- diagnostics -----------------------------------------------------------------------------

    def diagnostics(self) -> PredictorDiagnostics:
        """Brier score and ECE (weighted by visits) and Spearman ρ (per node, unweighted; overall and by
        depth) of the published weights on the held-out trees."""
        published = self._published
        with self._data_lock:
            held_out = self._holdout.snapshot()
            seen = self._examples_seen
        if not held_out:
            return PredictorDiagnostics(published.version, seen, 0, brier=None, ece=None, spearman=None)
        predicted = self._predict_with(published, [example.query for example in held_out]).mean
        target = np.array([example.target for example in held_out])
        weight = np.array([example.weight for example in held_out])
        depth = np.array([example.history.depth for example in held_out])
        return PredictorDiagnostics(
            version=published.version,
            examples_seen=seen,
            holdout_examples=len(held_out),
            brier=brier_score(predicted, target, weight),
            ece=expected_calibration_error(predicted, target, weight, self.config.calibration_bins),
            spearman=spearman(predicted, target),
            spearman_by_depth=spearman_by_group(predicted, target, depth),
            brier_by_depth=brier_by_group(predicted, target, depth, weight),
        )

    def memory_bytes(self) -> int:
        """An estimate of the bytes this predictor holds in memory: its trained, averaged and published
        models with the gradients and the optimiser's two moments (six copies of the weights), and its
        training data."""
        weights = sum(p.numel() * p.element_size() for p in self._trainer_model.parameters())
        with self._data_lock:
            histories = [e.history for e in (*self._replay.snapshot(), *self._holdout.snapshot())]
            histories += [g.root for g in (*self._groups.snapshot(), *self._holdout_groups.snapshot())]
        return 6 * weights + training_data_bytes(histories)

    # -- checkpoints -----------------------------------------------------------------------------

    def to_bytes(self, *, with_training_data: bool = False) -> bytes:
        """The published weights as a self-checking checkpoint (see ``checkpoint``; embedding tables in
        eight bits, exactly as they are served); with ``with_training_data``, also what the predictor
        learns from (``archive``, bounded by ``training_data_bytes``) and its trainer's random streams,
        so that :meth:`from_bytes` gives back a predictor that serves the same and goes on training.

        The trained weights and the optimiser's moments are not kept (each would be two to four times
        the published weights): the predictor given back trains on from its published weights, with
        fresh moments, which costs no measured quality (``bench/predictor.py --set-down``)."""
        with self._train_lock:
            published = self._published
            model = published.model or self._average_model
            state = compact_weights(model.state_dict())
            with self._data_lock:
                header = PredictorHeader(
                    published.version,
                    self._examples_seen,
                    self._moments,
                    self._freshness,
                    published.calibration,
                ).to_json(self.config.architecture())
                if with_training_data:
                    header["training_data"], tensors = pack_training_data(
                        self._training_data(), self.config.num_buckets, self.config.training_data_bytes
                    )
                    state.update(tensors)
                    header["trainer"], tensors = pack_random_streams(self._dropout_generator, self._rng)
                    state.update(tensors)
            return encode_checkpoint(header, state)

    def _restore_random_streams(self, header: Any, state: dict[str, torch.Tensor]) -> None:
        with self._train_lock:
            restore_random_streams(header, state, self._dropout_generator, self._rng)

    def _training_data(self) -> TrainingData:
        return TrainingData(
            replay=self._replay.oldest_first(),
            holdout=self._holdout.oldest_first(),
            groups=self._groups.oldest_first(),
            holdout_groups=self._holdout_groups.oldest_first(),
            trees_added=self._trees_added,
            sample_allowance=self._sample_allowance,
        )

    def _restore_training_data(self, data: TrainingData) -> None:
        with self._data_lock:
            self._replay.restore(data.replay)
            self._holdout.restore(data.holdout)
            self._groups.restore(data.groups)
            self._holdout_groups.restore(data.holdout_groups)
            self._trees_added = data.trees_added
            self._sample_allowance = min(data.sample_allowance, self.config.replay_ratio * len(self._replay))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_bytes` to ``path`` atomically (a reader never sees half a file)."""
        write_checkpoint(path, self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, config: PredictorConfig | None = None) -> SuccessPredictor:
        """A predictor with the checkpoint's weights and version, and its training data when it holds
        them (``to_bytes(with_training_data=True)``). Without ``config`` the checkpoint's architecture
        is used with default runtime settings; with one, its architecture must match."""
        header, state = decode_checkpoint(data)
        if config is None:
            try:
                config = PredictorConfig(**header["architecture"])
            except (KeyError, TypeError, ValueError) as error:
                raise CheckpointError(f"checkpoint has a malformed architecture: {error}") from None
        predictor = cls(config)
        predictor._install(header, state, only_if_newer=False)
        if "trainer" in header:
            predictor._restore_random_streams(header["trainer"], state)
        if "training_data" in header:
            predictor._restore_training_data(
                unpack_training_data(
                    header["training_data"],
                    state,
                    num_buckets=predictor.config.num_buckets,
                    feature_dim=predictor.config.feature_dim,
                )
            )
        return predictor

    @classmethod
    def load(cls, path: str | os.PathLike[str], config: PredictorConfig | None = None) -> SuccessPredictor:
        """:meth:`from_bytes` of the file at ``path``."""
        return cls.from_bytes(Path(path).read_bytes(), config)

    def update_from_bytes(self, data: bytes) -> bool:
        """Adopt published weights from another replica if they are newer than ours.

        Returns whether they were adopted. A corrupt or incompatible checkpoint raises
        :class:`CheckpointError` and leaves this predictor exactly as it was.
        """
        header, state = decode_checkpoint(data)
        return self._install(header, state, only_if_newer=True)

    def _install(
        self, header: dict[str, Any], state: dict[str, torch.Tensor], *, only_if_newer: bool
    ) -> bool:
        checked = PredictorHeader.from_json(header, self.config.architecture(), self._dense_width)
        model = self._new_model()
        weights = {
            name: value
            for name, value in state.items()
            if not name.startswith((TENSOR_PREFIX, TRAINER_PREFIX))
        }
        try:
            model.load_state_dict(expand_weights(weights))
        except (RuntimeError, KeyError, TypeError) as error:
            raise CheckpointError(f"checkpoint weights do not fit the model: {error}") from None
        with self._train_lock:
            if only_if_newer and checked.version <= self._published.version:
                return False
            self._trainer_model = model
            self._average_model = self._frozen_copy(model)
            self._optimizer = self._new_optimizer()
            with self._data_lock:
                self._moments = checked.moments
                self._examples_seen = checked.examples_seen
                self._freshness = checked.freshness
            self._published = _Published(
                checked.version,
                self._frozen_copy(model) if checked.version > 0 else None,
                checked.calibration,
            )
            return True

    # -- helpers ---------------------------------------------------------------------------------

    def _new_model(self) -> SuccessModel:
        # A private RNG stream: seeding must not disturb the caller's global torch RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            model = SuccessModel(
                self.config.num_buckets,
                self._dense_width,
                self.config.embed_dim,
                self.config.hidden_dim,
                self.config.dropout,
            )
        return model.to(self.device)

    def _new_optimizer(self) -> torch.optim.Optimizer:
        # The fused kernel updates the embedding tables several times faster than the per-tensor loop.
        return torch.optim.AdamW(
            self._trainer_model.parameters(),
            lr=self.config.learning_rate,
            weight_decay=self.config.weight_decay,
            fused=True,
        )

    def _update_average(self) -> None:
        """Exponential moving average of the trained weights: avg ← avg + (1 − decay)·(w − avg)."""
        weight = 1.0 - self.config.weight_averaging
        with torch.no_grad():
            for average, current in zip(
                self._average_model.parameters(), self._trainer_model.parameters(), strict=True
            ):
                average.lerp_(current, weight)

    @staticmethod
    def _frozen_copy(model: SuccessModel) -> SuccessModel:
        frozen = copy.deepcopy(model)
        frozen.requires_grad_(False)
        return frozen

    def _collate(self, queries: Sequence[Query]) -> ModelInputs:
        return collate(
            queries,
            feature_dim=self.config.feature_dim,
            max_history_tokens=self.config.max_history_tokens,
            prior_mean=self._cold_mean,
        )

    @property
    def _cold_mean(self) -> float:
        """μ₀ = α / (α + β), the configured Beta prior's mean."""
        return self.config.prior_successes / (self.config.prior_successes + self.config.prior_failures)

    def _cold_calibration(self) -> Calibration:
        """Before any group is seen: the configured Beta(α, β) prior; a prediction is (s + α)/(n + α + β)."""
        return Calibration(
            concentration=self.config.prior_successes + self.config.prior_failures,
            history_mean=self._cold_mean,
        )

    def _fit_calibration(self, model: SuccessModel) -> Calibration:
        """:func:`fit_calibration` for ``model``, prequential: on held-out groups once there are enough,
        which the network never trained on."""
        with self._data_lock:
            held_out, trained = self._holdout_groups.snapshot(), self._groups.snapshot()
        groups = held_out if len(held_out) >= _HELD_OUT_GROUPS else trained + held_out
        if len(groups) < _MIN_GROUPS:
            return self._cold_calibration()
        return fit_calibration(
            groups,
            trained or groups,  # the history-only prior: the bare success rate of the training groups
            self._prior_means(model, [group.root for group in groups]),
            self.config.prior_successes,
            self.config.prior_failures,
        )
