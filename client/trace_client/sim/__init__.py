"""Simulated multi-turn agentic workloads whose true conditional success is known at every prefix.

Families (`FAMILIES`, `make_workload`): "react" (`SimWorkload`, below), and three policy families
driven by a softmax policy over a finite action set — "math" (`MathWorkload`), "multihop"
(`MultihopWorkload`) and "toolcall" (`ToolcallWorkload`); see `trace_client.sim.tabular` for their
exactness argument.

The "react" family

It stands in for an LLM agent and its generation workers in the demo, the tests and the benchmarks, and
lets the oracle allocation be computed. Needs numpy only.

Model
-----
- Each prompt has a hidden success rate p0 from a Beta mixture (`SimConfig.difficulty`; U-shaped by
  default, so that uniform GRPO with 8 rollouts per prompt sees about 30% mixed groups).
- A rollout is a sequence of ReAct turns ("Thought: … / Action: tool[…] / Observation: …"). The state
  after t turns carries p_t = P(success | prefix) exactly. A non-final turn draws B ~ Bernoulli(p_t) and
  a step a, and sets p_{t+1} = (1 − a)·p_t + a·B, a martingale. Whether a turn is final is decided before
  it is drawn, from the turn count alone (between `min_turns` and `max_turns`), and the final turn sets
  p = B = the reward. So the reward is Bernoulli(p_t) given any prefix, for any turn count.
- Text carries real but noisy signal. Prompt words are partly graded "difficulty" words whose level
  follows logit(p0) plus noise, and partly Zipf-distributed distractors. Thoughts carry a few graded
  "confidence" words around the current p_t. Observations carry progress or setback words for B, more of
  them when the step a is larger, and a share of them is flipped. Optional numeric features are a noisy
  vector along logit(p) (`SimConfig.feature_dim`).
- Words are synthetic, spelled from `VocabularyConfig.seed`: a different seed gives different words.
- Learning mode: `SimWorkload.learn(prompt_id, mixed)` raises a prompt's logit(p0) when its group was mixed.

Usage
-----
>>> import numpy as np
>>> workload = SimWorkload(SimConfig(prompts=16), seed=1)
>>> rng = np.random.default_rng(0)
>>> prompt = workload.sample_pool(1, rng)[0]
>>> (trajectory,) = workload.run([workload.start(prompt.prompt_id)], rng)
>>> trajectory[-1].done and trajectory[-1].reward in (0.0, 1.0)
True
>>> prefix = trajectory[0]  # continue from after the first turn: the prefix is shared exactly
>>> (branch,) = workload.run([prefix], rng)
>>> branch[0].history[0] is prefix.history[0]
True
"""

from trace_client.sim.base import PolicyWorkload, Workload
from trace_client.sim.config import (
    DEFAULT_DIFFICULTY,
    BetaComponent,
    SimConfig,
    TextConfig,
    VocabularyConfig,
)
from trace_client.sim.family_config import (
    MATH_DIFFICULTY,
    MULTIHOP_DIFFICULTY,
    TOOLCALL_DIFFICULTY,
    LogitComponent,
    MathConfig,
    MultihopConfig,
    ToolcallConfig,
)
from trace_client.sim.lexicon import Lexicon, Spelling
from trace_client.sim.math_reasoning import MathWorkload
from trace_client.sim.multihop import MultihopWorkload
from trace_client.sim.registry import FAMILIES, WorkloadFactory, make_workload
from trace_client.sim.state import Prompt, RolloutState, Turn
from trace_client.sim.tabular import TabularWorkload, TurnDraw
from trace_client.sim.toolcall import ToolcallWorkload
from trace_client.sim.vocabulary import Vocabulary
from trace_client.sim.workload import SimWorkload

__all__ = [
    "DEFAULT_DIFFICULTY",
    "FAMILIES",
    "MATH_DIFFICULTY",
    "MULTIHOP_DIFFICULTY",
    "TOOLCALL_DIFFICULTY",
    "BetaComponent",
    "Lexicon",
    "LogitComponent",
    "MathConfig",
    "MathWorkload",
    "MultihopConfig",
    "MultihopWorkload",
    "PolicyWorkload",
    "Prompt",
    "RolloutState",
    "SimConfig",
    "SimWorkload",
    "Spelling",
    "TabularWorkload",
    "TextConfig",
    "ToolcallConfig",
    "ToolcallWorkload",
    "Turn",
    "TurnDraw",
    "Vocabulary",
    "VocabularyConfig",
    "Workload",
    "WorkloadFactory",
    "make_workload",
]
