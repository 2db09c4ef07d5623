"""Simulated multi-turn agentic workloads whose true conditional success is known at every prefix.

They stand in for an LLM agent and its generation workers in the demo, the tests and the benchmarks, and
let the oracle allocation be computed. Needs numpy only: the `sim` extra (`pip install
'trace-rollout[sim]'`). `trace_lab.sim.workers` runs a workload as the worker driver's callables.

Every family is a `Workload` (`trace_lab.sim.base`): a population of tasks (`prompts`, larger than a
step's pool; `epoch_pool(step, size)` visits it epoch by epoch), immutable rollout prefixes
(`RolloutState`) that carry the exact P(reward = 1 | prefix) as `p` and can be continued any number of
times, vectorised stepping (`step_many`, `run`), `true_success_many`, `expected_remaining_turns`, and a
learning mode (`learn`). `FAMILIES[name](seed, prompts, **config_overrides)` or `make_workload(name,
seed, prompts)` builds one; another seed gives other tasks of the same family (same types, contexts and
words): held-out tasks.

Families
--------
"react" (`SimWorkload`, `SimConfig`): a martingale on p rendered as ReAct turns (below); 2–12 turns,
a U-shaped Beta mixture of success rates.

The others are `PolicyWorkload`s: each task is a small tabular MDP (`TabularWorkload`) and the agent
picks one of `actions` actions per turn with π_θ(a | c) = softmax(θ[c]), where the context c is what it
can observe (its task's visible type, read from the prompt with noise, times its progress). Contexts are
shared across tasks, so θ learned on some tasks transfers to others of the family; which action is right
depends on the true type and the progress (`right_actions()` is the expert). Every turn records its
action (`Turn.action`) and every state its hidden MDP state (`RolloutState.latent`).

- "math" (`MathWorkload`, `MathConfig`) — mathematical reasoning: 2–4 reasoning steps, then an answer
  (3–5 turns). Success is decided mostly by the task's latent difficulty (a bimodal mix: the highest
  intraclass correlation); a sound or unsound step moves the answer's logit by only ±0.3 (weak prefix
  signal); prompts carry modest text signal (graded words, equation length), steps noisy verdicts.
- "multihop" (`MultihopWorkload`, `MultihopConfig`) — multi-hop QA: 2–4 documents must be found by
  search turns (document observations) before answering, up to 10 turns. A search finds the next
  document, misses, or is misled by a wrong bridge entity that derails the rest of the rollout, so
  observations move the odds a lot (about half the outcome's variance is resolved before the answer,
  against a few per cent in "math"); answering early is usually wrong. A wide unimodal mix (the most
  in-between tasks, the lowest intraclass correlation); strong prompt signal.
- "toolcall" (`ToolcallWorkload`, `ToolcallConfig`) — function calling: 2–4 JSON tool calls in sequence,
  up to 7 turns. A failed call is either a recoverable error (the right fix is another variant) or fatal,
  an absorbing failure that ends the rollout with reward 0; a mix skewed to failure; weak prompt signal,
  responses that show the status exactly but mislabel `retryable` sometimes.
- "maze" (`MazeWorkload`, `MazeConfig`) — slippery mazes: 2–6 junctions to pass, one exit a turn, up to 8
  turns; a move gets through, stays, slides back a junction or drops into a pit. The no-signal control:
  prompts say nothing about how slippery a maze is and a benchmark's pools never repeat one (4,096
  tasks), so only the turns carry signal. "maze_drift" (`MazeDriftWorkload`) is the drift control:
  512 recurring mazes of 3–7 junctions whose right exit matters a lot, so success rates move fast as a
  policy learns and a prompt's outcome history goes stale within a few steps.

Each family spells its own generated words (`trace_lab.sim.lexicon`: marker letters make the
families' words disjoint by construction) in its own surface form, and none reuses the ReAct template.

Exactness of the policy families (`trace_lab.sim.tabular`): with P the per-task transition tables and
N the next-state tables, backward dynamic programming under the current θ,

    V_H(s) = [s = SUCCESS],   V_t(s) = Σ_a π_θ(a | c_t(s)) Σ_k P_t(k | s, a) · V_{t+1}(N_t(s, a, k)),

is P(reward = 1 | state s after t turns), because a rollout draws a and k from exactly these
distributions; a state's `p` is V_t(s), so E[p' | s] = p(s) and the reward is Bernoulli(p) from any
prefix. Setting `policy` re-solves every task (a few ms for 2,000 tasks); `learn` raises one task's
competence (a logit offset on its success-relevant transitions) and re-solves that task.

At the defaults (seeds 0–4, all tasks; `python -m trace_lab.sim` prints `root_summary` per family):
share of tasks with root success < 0.05 / > 0.95, intraclass correlation Var(p_i) / (p̄(1 − p̄)), mean
turns of a rollout:

    react     0.44 / 0.22   0.76   5.6
    math      0.42 / 0.34   0.81   3.8
    multihop  0.33 / 0.06   0.55   6.5
    toolcall  0.34 / 0.13   0.63   3.1
    maze      0.28 / 0.27   0.70   4.3
    maze_drift  0.33 / 0.15   0.65   4.9

The "react" family
------------------
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
>>> math = make_workload("math", seed=0, prompts=64)  # a policy family: θ has one row per context
>>> state = math.start(math.prompts[0].prompt_id)
>>> math.policy = math.policy + 1.0 * np.eye(math.actions)[math.right_actions()]
>>> math.start(state.prompt_id).p > state.p  # the expert's direction raises success
True
"""

from trace_lab.sim.base import PolicyWorkload, Workload
from trace_lab.sim.config import (
    DEFAULT_DIFFICULTY,
    BetaComponent,
    SimConfig,
    TextConfig,
    VocabularyConfig,
)
from trace_lab.sim.family_config import (
    MATH_DIFFICULTY,
    MULTIHOP_DIFFICULTY,
    TOOLCALL_DIFFICULTY,
    LogitComponent,
    MathConfig,
    MazeConfig,
    MultihopConfig,
    ToolcallConfig,
)
from trace_lab.sim.lexicon import Lexicon, Spelling
from trace_lab.sim.math_reasoning import MathWorkload
from trace_lab.sim.maze import MazeDriftWorkload, MazeWorkload
from trace_lab.sim.multihop import MultihopWorkload
from trace_lab.sim.registry import FAMILIES, RootSummary, WorkloadFactory, make_workload, root_summary
from trace_lab.sim.state import Prompt, RolloutState, Turn
from trace_lab.sim.tabular import TabularWorkload, TurnDraw
from trace_lab.sim.toolcall import ToolcallWorkload
from trace_lab.sim.vocabulary import Vocabulary
from trace_lab.sim.workload import SimWorkload

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
    "MazeConfig",
    "MazeDriftWorkload",
    "MazeWorkload",
    "MultihopConfig",
    "MultihopWorkload",
    "PolicyWorkload",
    "Prompt",
    "RolloutState",
    "RootSummary",
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
    "root_summary",
]
