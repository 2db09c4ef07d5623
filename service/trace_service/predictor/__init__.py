"""The shared success predictor Ṽ(H): probability that a rollout continued from history H succeeds.

One model serves roots (H = the prompt alone) and prefixes (the prompt and the turns so far). Typical
use by the service::

    predictor = SuccessPredictor(PredictorConfig(feature_dim=0, device="auto"))
    featurizer = predictor.featurizer

    root = featurizer.encode_prompt(prompt_id, prompt_text, prompt_features)   # store per node
    node = featurizer.extend(root, turn_text, turn_features)                   # O(new turn)
    counts = OutcomeCounts(successes, trials)       # the prompt's bare-rollout outcomes in earlier steps
    version, (values, concentration) = predictor.predict_versioned([Query(root, counts), Query(node, counts)])

    # when a tree completes: one call per tree, with V̂ and visits n of every scored node
    predictor.add_examples(
        [TrainingExample(node, target=v_hat, weight=n, outcomes=counts), ...],
        RootGroup(root, bare_successes, bare_rollouts, counts),
    )
    predictor.train_round(max_steps=100)        # background thread; publishes version + 1
    blob = predictor.to_bytes()                 # publish to other replicas (checksummed)
    other.update_from_bytes(blob)               # adopts newer weights; CheckpointError keeps its own
    report = predictor.diagnostics()            # Brier, ECE, Spearman overall and by depth (held out)

The network predicts a prior μ(H) from what the history carries (text, structure, client features)
and never reads the prompt's outcomes; those enter exactly, by a conjugate update of Beta(κμ, κ(1 − μ))
whose concentration κ is fitted to the bare-rollout groups of finished trees (pass each tree's
``RootGroup`` to ``add_examples``), and a prefix inherits its root's change of odds. Each version also
compares the network's prior with one constant for every prompt (the history-only posterior) on
held-out groups and serves the better (``predictor.calibration``). Until the first training round
(version 0) a prediction is the prompt's Beta posterior mean (s + 1) / (n + 2), i.e. 0.5 for a prompt
never seen. ``predictive`` also gives each prompt's posterior concentration κ + n, the belief Stage 1's
predictive value takes. ``predict`` never waits for training: each call uses one published version.
Training steps are bounded by ``replay_ratio`` samples per example added, so calling ``train_round`` in
a loop is safe. Modules: ``features`` (stable hashed n-grams, incremental encoding), ``model`` (torch
network and batching), ``config`` (its settings), ``examples`` (training examples, groups, buffers),
``calibration`` (the Beta prior and its fit), ``success_predictor`` (online training, versions, checkpoints),
``checkpoint`` (the checksummed format), ``checkpoint_content`` (a checkpoint's header and the trainer's
state), ``diagnostics`` (pure numpy measures). Bad input raises ValueError with a message that names
the problem (CheckpointError, a ValueError, for damaged checkpoints).
"""

from trace_service.predictor.calibration import Calibration
from trace_service.predictor.checkpoint import CheckpointError
from trace_service.predictor.config import PredictorConfig
from trace_service.predictor.diagnostics import PredictorDiagnostics
from trace_service.predictor.examples import RootGroup, TrainingExample
from trace_service.predictor.features import (
    EncodedHistory,
    FeaturizerConfig,
    HistoryFeaturizer,
    OutcomeCounts,
    Turn,
)
from trace_service.predictor.model import Query
from trace_service.predictor.success_predictor import Predictive, SuccessPredictor, TrainRoundResult

__all__ = [
    "Calibration",
    "CheckpointError",
    "EncodedHistory",
    "FeaturizerConfig",
    "HistoryFeaturizer",
    "OutcomeCounts",
    "Predictive",
    "PredictorConfig",
    "PredictorDiagnostics",
    "Query",
    "RootGroup",
    "SuccessPredictor",
    "TrainRoundResult",
    "TrainingExample",
    "Turn",
]
