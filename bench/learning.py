"""Learning speed per unit of rollout compute: a policy-gradient learner on each policy workload family,
with arms that differ only in how the rollouts are allocated.

    python bench/learning.py                          # defaults: every policy family, see --help
    python bench/learning.py --quick --family math    # a one-minute smoke run
    python bench/learning.py --family math,toolcall --arms uniform,trace,oracle
    python bench/learning.py --tune-on math           # report only on the other families
    python bench/learning.py --arms uniform,trace,trace@global --turn-weight rollout   # ablations
    python bench/learning.py --arms uniform,trace,trace+pilot --pilot-share 0.5         # a pilot wave

Arms, each with its own copy of the policy θ (the family's initial policy) and its own service job:
  uniform        GRPO: R = M + ⌊M·N⌋ bare rollouts dealt evenly over the pool, no branching
  <policy>       every allocation policy of the v1 contract (`trace_proto.Policy`) with M bare rollouts
                 and expansion N (the contract's `uniform` policy, uniform Stage 1 and 2, is `uniform_tree`)
  oracle         TRACE Stage 1 and Stage 2 on the workload's true probabilities, in process
                 (`bench.harness.run_step`, the same `trace_service.allocation` functions the service uses):
                 the rules of the service's `trace`; `oracle_joint` with the joint Stage 1 objective at
                 the freshness learned from its own trees and half the trees' continuations shared, as
                 the service's `trace_joint`; `oracle_shared` with all of them shared, as `trace_shared`

One `trace-rollout serve` process on one redis-server serves every arm of a family and seed, each arm
its own job, so each arm's predictor learns only from that arm's trees (the service keeps a predictor
per job). A step: the pool is the family's epoch slice
(`epoch_pool(step, B)`, the training seed); the arm allocates over HTTP with its policy, the driver runs
the rollouts with the arm's policy (θ fixed during the step), every tree is fetched, and θ takes one
policy-gradient step. Then the held-out success — the exact mean success of the held-out tasks (another
seed of the family) under θ — is recorded.

The gradient: each sampled turn t (a tree node: shared prefixes count once) contributes
A_t ∇_θ log π_θ(a_t | c_t), averaged over every sampled turn of the step (token-level averaging as in
DAPO, one turn being one token). A_t is the service's per-node tree advantage (`GET /v1/trees/{id}`) on
arms that branch, and the GRPO group baseline r − mean(group) on uniform's flat groups (not divided by
the group's std, as in Dr. GRPO: the tree advantages are not either, and without it the estimate stays a
fixed multiple of the true gradient). DAPO's arm trains on its mixed groups only (its filter). The step
is Adam (default) or plain SGD with `--lr`. Ablations: an arm `<arm>@<variant>` trains on a tree
advantage of `bench.advantages` computed from the tree's rewards instead of the service's, and
`--turn-weight rollout` averages over rollouts instead of turns (each tree weighs its scored leaves,
shared alike among its turns), for every arm. An arm `<arm>+pilot` spends `--pilot-share` of M in a first
allocation over the pool and the rest in a second, whose Stage 1 reads the first wave's outcomes in the
prompts' history (two steps of its job per learning step; each wave's trees are their own groups).

The horizon: uniform takes `--steps` steps. Under `--horizon turns` (the default) every other arm then
steps on until it has generated as many turns as uniform did, at most twice the steps: a branching arm's
continuations start mid-rollout, so it spends fewer turns per step, and at equal steps it would be cut
off with less compute than uniform had. `--horizon steps` stops every arm after `--steps`.

Reported per family and seed: each arm's held-out success at uniform's total turns and its steps; the
turns and the rollouts it needed to reach uniform's final success (the first crossing of its curve over
cumulative cost, interpolated linearly between steps), as ratios to uniform's own; mixed groups per
step; effective ratio (mixed / active groups). Then a summary over seeds, and learning curves as PNGs
(`bench/results/`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.advantages import ADVANTAGES, exported_tree_advantages
from bench.estimators import FinishedTree as ForestTree
from bench.estimators import Query, oracle_estimator
from bench.gain import checks, print_report
from bench.harness import StepConfig, Strategy, run_step
from bench.plotting import FIXED, line_colors
from bench.protocol import (
    add_family_arguments,
    check_sizes,
    chosen_families,
    comma_list,
    mean_spread,
    mean_std,
    protocol_line,
)
from trace_client import AsyncTraceClient
from trace_client.driver import DriverConfig, FinishedTree, RolloutDriver
from trace_lab.local import RedisServer, ServiceProcess
from trace_lab.sim import FAMILIES, Prompt, RolloutState, make_workload
from trace_lab.sim.base import PolicyWorkload
from trace_lab.sim.tabular import softmax_rows as softmax  # π_θ(· | c) row by row
from trace_lab.sim.workers import SimAgent, prompt_in
from trace_proto import DEFAULT_CONTROL_SHARE, AllocateRequest, GainEstimate, Policy
from trace_service.allocation import POLICIES, continuation_budget
from trace_service.allocation.gain import ArmSums
from trace_service.allocation.tree import FreshnessEstimate, tree_targets

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

UNIFORM = "uniform"
UNIFORM_TREE = "uniform_tree"
ORACLE = "oracle"
ORACLE_JOINT = "oracle_joint"
ORACLE_SHARED = "oracle_shared"
#: Held-out tasks of training seed s come from seed s + this: another draw of the same family.
HELD_OUT_SEED_OFFSET = 10_000
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
#: One torch thread per service (several share two cores); a short training interval so that a step's
#: trees reach the predictor soon after the step.
TRAIN_INTERVAL_SECONDS = 0.5
SERVICE_SETTINGS = {
    "TRACE_TORCH_THREADS": "1",
    "TRACE_PREDICTOR_DEVICE": "cpu",
    "TRACE_TRAIN_INTERVAL_SECONDS": str(TRAIN_INTERVAL_SECONDS),
    "TRACE_LOG_LEVEL": "WARNING",
}


# --- the learner ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampledTurns:
    """The sampled turns of a batch: the context each action was chosen in, the action, its advantage."""

    contexts: IntArray
    actions: IntArray
    advantages: FloatArray

    @property
    def size(self) -> int:
        return int(self.contexts.size)

    @staticmethod
    def concat(parts: Sequence[SampledTurns]) -> SampledTurns:
        if not parts:
            return SampledTurns(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        return SampledTurns(
            np.concatenate([part.contexts for part in parts]),
            np.concatenate([part.actions for part in parts]),
            np.concatenate([part.advantages for part in parts]),
        )


#: How the turns of a step are weighted in the gradient's mean: every sampled turn alike (token-level),
#: or every rollout alike (a tree weighs its leaves' count, shared among its turns).
TURN_WEIGHTS = ("turn", "rollout")


def weighted_turns(trees: Sequence[tuple[SampledTurns, int]], weighting: str) -> SampledTurns:
    """The step's turns from (turns of a tree, its scored leaves) pairs; under "rollout" a tree's turns
    are scaled by (leaves / turns of the tree) · (turns / leaves of the step), so the mean over turns
    that `policy_gradient` takes is a mean over rollouts of each tree's per-turn mean."""
    parts = [part for part, _ in trees]
    if weighting == "turn" or not parts:
        return SampledTurns.concat(parts)
    total_turns = sum(part.size for part in parts)
    total_leaves = sum(leaves for part, leaves in trees if part.size)
    scaled = [
        replace(part, advantages=part.advantages * (leaves / part.size) * (total_turns / total_leaves))
        for part, leaves in trees
        if part.size
    ]
    return SampledTurns.concat(scaled)


def policy_gradient(theta: FloatArray, turns: SampledTurns) -> FloatArray:
    """(1/T) Σ_t A_t ∇_θ log π_θ(a_t | c_t) over the T sampled turns; ∇_θ[c] log softmax(θ[c])_a is
    e_a − π_θ(· | c), and zero in every other row."""
    gradient = np.zeros_like(theta)
    if turns.size == 0:
        return gradient
    np.add.at(gradient, (turns.contexts, turns.actions), turns.advantages)
    per_context = np.bincount(turns.contexts, weights=turns.advantages, minlength=theta.shape[0])
    gradient -= per_context[:, None] * softmax(theta)
    return gradient / turns.size


def _sampled_turns(
    workload: PolicyWorkload, prompt_id: str, turns: Iterable[tuple[RolloutState, RolloutState | None, float]]
) -> SampledTurns:
    """(state after the turn, state before it or None at the prompt, advantage) → sampled turns."""
    start_context = workload.context_of(workload.start(prompt_id))
    contexts, actions, values = [], [], []
    for after, before, advantage in turns:
        action = after.history[-1].action
        if action is None:
            raise ValueError(f"a turn of {prompt_id!r} records no action: not a policy family's turn")
        contexts.append(start_context if before is None else workload.context_of(before))
        actions.append(action)
        values.append(advantage)
    return SampledTurns(
        np.asarray(contexts, dtype=np.int64), np.asarray(actions, dtype=np.int64), np.asarray(values)
    )


def service_tree_turns(
    workload: PolicyWorkload, finished: FinishedTree, *, flat: bool, advantage: str = "service"
) -> SampledTurns:
    """A tree the service exported: per node the service's advantage (or the `bench.advantages`
    variant named, computed from the tree's rewards), or on a flat group (bare rollouts only) the GRPO
    baseline V̂(node) − V̂(root) = r − mean(group), each node lying on exactly one rollout. Failure
    leaves (not policy turns) and nodes without a scored leaf are left out."""
    tree = finished.tree
    variant = exported_tree_advantages(tree, advantage)

    def state_of(node_id: str) -> RolloutState:
        state = finished.turns[node_id].state
        if not isinstance(state, RolloutState):
            raise TypeError(f"node {node_id!r} carries no simulator state: it was not made by SimAgent")
        return state

    rows = []
    for i, node in enumerate(tree.nodes):
        if node.node_id not in finished.turns or node.value is None or tree.value is None:
            continue
        node_advantage = node.value - tree.value if flat else float(variant[i])
        before = None if node.parent_id is None else state_of(node.parent_id)
        rows.append((state_of(node.node_id), before, node_advantage))
    return _sampled_turns(workload, tree.prompt_id, rows)


def forest_tree_turns(workload: PolicyWorkload, tree: ForestTree, advantage: str = "service") -> SampledTurns:
    """A tree of the in-process oracle, with the service's advantage or the variant named."""
    parent = np.asarray(tree.parent, dtype=np.int64)
    advantage_of = ADVANTAGES[advantage](parent, tree_targets(parent, tree.reward))
    rows = [
        (state, None if up < 0 else tree.states[up], float(advantage_of[i]))
        for i, (state, up) in enumerate(zip(tree.states, tree.parent, strict=True))
    ]
    return _sampled_turns(workload, tree.prompt.prompt_id, rows)


class Adam:
    """Adam (Kingma & Ba) ascending the objective."""

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999) -> None:
        self.lr, self.beta1, self.beta2 = lr, beta1, beta2
        self.mean: FloatArray | float = 0.0
        self.square: FloatArray | float = 0.0
        self.steps = 0

    def step(self, gradient: FloatArray) -> FloatArray:
        """The change of θ for one ascent step along `gradient`."""
        self.steps += 1
        self.mean = self.beta1 * self.mean + (1 - self.beta1) * gradient
        self.square = self.beta2 * self.square + (1 - self.beta2) * gradient**2
        mean = self.mean / (1 - self.beta1**self.steps)
        square = self.square / (1 - self.beta2**self.steps)
        return np.asarray(self.lr * mean / (np.sqrt(square) + 1e-8), dtype=np.float64)


class SGD:
    """Plain gradient ascent."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def step(self, gradient: FloatArray) -> FloatArray:
        return self.lr * gradient


OPTIMIZERS = {"adam": Adam, "sgd": SGD}


# --- arms ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """An allocation rule and its budget; `policy` None is an in-process oracle whose rules are those of
    `oracle_of` (`trace`: the joint Stage 1 objective; `trace_paper`: the paper's)."""

    name: str
    policy: Policy | None
    budget: int
    expansion: float
    oracle_of: Policy = Policy.TRACE
    #: The tree advantage it trains on: a `bench.advantages` name (arm `<arm>@<name>` on the command line).
    advantage: str = "service"
    #: The share of M spent in a first wave over the pool, before the rest is allocated with the first
    #: wave's outcomes in the prompts' history (arm `<arm>+pilot`; 0: one allocation per step).
    pilot: float = 0.0
    #: The request's control share ε (arm `<arm>~<share>`; the contract's default otherwise).
    control_share: float = DEFAULT_CONTROL_SHARE

    @property
    def flat(self) -> bool:
        """Bare rollouts only: its groups are GRPO groups."""
        return self.expansion == 0

    @property
    def reads_predictor(self) -> bool:
        """Whether its rules read Ṽ (`POLICIES`): only those wait for their job's predictor to train."""
        return self.policy is not None and POLICIES[self.policy].uses_predictor

    @property
    def waves(self) -> list[int]:
        """The bare rollouts of each allocation in a step: M at once, or the pilot's share of it first."""
        pilot = round(self.pilot * self.budget)
        return [pilot, self.budget - pilot] if 0 < pilot < self.budget else [self.budget]

    @property
    def mixed_groups_only(self) -> bool:
        """DAPO's dynamic sampling keeps only the mixed groups for training."""
        return self.policy is not None and POLICIES[self.policy].keeps_only_mixed_groups


#: An arm named `<arm>+pilot` allocates twice per step (`Arm.pilot`).
PILOT_SUFFIX = "+pilot"
#: An arm named `<arm>~<share>` allocates with that control share (`Arm.control_share`).
SHARE_MARK = "~"


def variant_arm(name: str, known: dict[str, Arm], pilot_share: float) -> Arm | None:
    """The ablation `name` names, None when it names none: `<arm>~<share>` allocates with another control
    share; `<arm>@<advantage>` trains on another tree advantage; `<arm>+pilot` (an arm of the service,
    after any `@<advantage>`) allocates in two waves."""
    named, _, share = name.partition(SHARE_MARK)
    piloted = named.endswith(PILOT_SUFFIX)
    base, _, advantage = named.removesuffix(PILOT_SUFFIX).partition("@")
    arm = known.get(base)
    if arm is None or base == UNIFORM or (advantage and advantage not in ADVANTAGES):
        return None
    if (piloted or share) and arm.policy is None:
        return None
    try:
        control_share = float(share) if share else arm.control_share
    except ValueError:
        return None
    if not 0.0 <= control_share <= 1.0:
        return None
    return replace(
        arm,
        name=name,
        advantage=advantage or arm.advantage,
        pilot=pilot_share if piloted else 0.0,
        control_share=control_share,
    )


def build_arms(bare: int, expansion: float) -> list[Arm]:
    """uniform, every policy of the contract at (M, N), and the oracle, all at R = M + ⌊M·N⌋ rollouts."""
    total = bare + continuation_budget(bare, expansion)
    arms = [Arm(UNIFORM, Policy.UNIFORM, total, 0.0)]
    arms += [
        Arm(UNIFORM_TREE if policy is Policy.UNIFORM else policy.value, policy, bare, expansion)
        for policy in Policy
    ]
    arms.append(Arm(ORACLE, None, bare, expansion))
    arms.append(Arm(ORACLE_JOINT, None, bare, expansion, Policy.TRACE_JOINT))
    arms.append(Arm(ORACLE_SHARED, None, bare, expansion, Policy.TRACE_SHARED))
    return arms


@dataclass
class Curve:
    """One arm's run: held-out success after 0, 1, … updates, cumulative cost, per-step groups."""

    success: list[float] = field(default_factory=list)
    rollouts: list[int] = field(default_factory=lambda: [0])
    turns: list[int] = field(default_factory=lambda: [0])
    mixed: list[int] = field(default_factory=list)
    active: list[int] = field(default_factory=list)
    #: The sums of the arm's policy trees and of its control trees (`trace_service.allocation.gain`).
    policy_trees: ArmSums = field(default_factory=ArmSums)
    control_trees: ArmSums = field(default_factory=ArmSums)
    #: The service's estimate of the arm's gain over uniform, read from its job's stats after the run,
    #: and the slope of the trust map its Stage 1 read the predictor through then.
    estimate: GainEstimate | None = None
    trust: float | None = None

    @property
    def effective_ratio(self) -> float:
        return statistics.fmean(m / a if a else 0.0 for m, a in zip(self.mixed, self.active, strict=True))


@dataclass(frozen=True)
class StepOutcome:
    turns: SampledTurns
    rollouts: int
    turns_spent: int
    mixed: int
    active: int
    policy_trees: ArmSums = field(default_factory=ArmSums)
    control_trees: ArmSums = field(default_factory=ArmSums)


def success_at(costs: Sequence[float], success: Sequence[float], cost: float) -> float:
    """The curve's success at `cost`, linear between points; its last point's when it ends before
    (`np.interp` holds the end values outside the curve)."""
    return float(np.interp(cost, costs, success))


def cost_to_reach(costs: Sequence[float], success: Sequence[float], target: float) -> float | None:
    """The cost at which the curve (costs[k], success[k]) first reaches `target`, linear between
    points; None when it never does (past the horizon)."""
    for k, value in enumerate(success):
        if value >= target:
            if k == 0:
                return float(costs[0])
            low, high = success[k - 1], value
            return float(costs[k - 1] + (target - low) / (high - low) * (costs[k] - costs[k - 1]))
    return None


class ArmRun:
    """One arm on one (family, seed): its own workload copy (whose policy is the arm's θ), its optimiser
    and its curve."""

    def __init__(self, arm: Arm, family: str, seed: int, args: argparse.Namespace) -> None:
        self.arm = arm
        workload = make_workload(family, seed, prompts=args.prompts)
        if not isinstance(workload, PolicyWorkload):
            raise TypeError(f"family {family!r} is not a policy family")
        self.workload = workload
        self.theta = workload.policy
        self.optimizer = OPTIMIZERS[args.optimizer](args.lr)
        self.turn_weight: str = args.turn_weight
        self.curve = Curve()

    def update(self, outcome: StepOutcome) -> None:
        self.theta = self.theta + self.optimizer.step(policy_gradient(self.theta, outcome.turns))
        curve = self.curve
        curve.rollouts.append(curve.rollouts[-1] + outcome.rollouts)
        curve.turns.append(curve.turns[-1] + outcome.turns_spent)
        curve.mixed.append(outcome.mixed)
        curve.active.append(outcome.active)
        curve.policy_trees += outcome.policy_trees
        curve.control_trees += outcome.control_trees


class ServiceArm(ArmRun):
    """An arm that allocates through its own service process and runs rollouts with the driver."""

    def __init__(
        self, arm: Arm, family: str, seed: int, args: argparse.Namespace, service: ServiceProcess
    ) -> None:
        super().__init__(arm, family, seed, args)
        self.service = service
        self.client = AsyncTraceClient(service.url, timeout=120.0)
        self.job = fresh_job("learn", family, f"s{seed}", arm.name)
        agent = SimAgent(self.workload, np.random.default_rng([seed, 1, *arm.name.encode()]))
        # Every rollout of a step in flight at once: SimAgent steps them in one vectorised batch per turn.
        driver_config = DriverConfig(concurrency=4 * arm.budget + 64, step_timeout=args.step_timeout)
        self.driver = RolloutDriver(self.client, agent.next_turn, config=driver_config)
        self.max_rollouts = args.max_rollouts
        self.max_branch_depth = args.max_branch_depth

    async def step(self, step: int, pool: Sequence[Prompt]) -> StepOutcome:
        self.workload.policy = self.theta
        trees: list[FinishedTree] = []
        waves = self.arm.waves
        for wave, budget in enumerate(waves):
            trees += await self.allocate_and_run(step * len(waves) + wave, budget, pool)
        kept = [finished for finished in trees if finished.tree.mixed or not self.arm.mixed_groups_only]
        turns = weighted_turns(
            [
                (
                    service_tree_turns(self.workload, tree, flat=self.arm.flat, advantage=self.arm.advantage),
                    sum(node.reward is not None for node in tree.tree.nodes),
                )
                for tree in kept
            ],
            self.turn_weight,
        )
        arms = {True: ArmSums(), False: ArmSums()}
        for finished in trees:
            tree = finished.tree
            arms[tree.control] += ArmSums.of_tree(mixed=tree.mixed, bare=tree.rollouts, turns=len(tree.nodes))
        return StepOutcome(
            turns=turns,
            rollouts=sum(sum(node.reward is not None for node in finished.tree.nodes) for finished in trees),
            turns_spent=sum(len(finished.tree.nodes) for finished in trees),
            mixed=sum(finished.tree.mixed for finished in trees),
            active=len(trees),
            policy_trees=arms[False],
            control_trees=arms[True],
        )

    async def allocate_and_run(self, step: int, budget: int, pool: Sequence[Prompt]) -> list[FinishedTree]:
        assert self.arm.policy is not None
        request = AllocateRequest(
            job=self.job,
            step=step,
            budget=budget,
            expansion=self.arm.expansion,
            max_rollouts=self.max_rollouts,
            policy=self.arm.policy,
            control_share=self.arm.control_share,
            max_branch_depth=self.max_branch_depth,
            prompts=[prompt_in(prompt) for prompt in pool],
        )
        result = await self.driver.run_step(request)
        if result.timed_out:
            print(f"  {self.arm.name}: step {step} timed out; its open trees were closed", file=sys.stderr)
        return list(result.trees)

    async def wait_for_training(self, patience: float) -> None:
        await wait_for_training(self.client, self.job, patience)


class _TrueProbabilities:
    """The oracle's estimator: the true conditional success, keeping the trees of every step."""

    def __init__(self) -> None:
        self.trees: list[ForestTree] = []

    def __call__(self, queries: Sequence[Query]) -> FloatArray:
        return oracle_estimator(queries)

    def observe(self, trees: Sequence[ForestTree]) -> None:
        self.trees = list(trees)


def leaves(tree: ForestTree) -> int:
    return int(np.isfinite(tree.reward).sum())


class OracleArm(ArmRun):
    """TRACE on the true probabilities, in process."""

    def __init__(self, arm: Arm, family: str, seed: int, args: argparse.Namespace) -> None:
        super().__init__(arm, family, seed, args)
        self.seed = seed
        self.estimator = _TrueProbabilities()
        self.strategy = Strategy(arm.name, arm.oracle_of, self.estimator)
        self.config = StepConfig(
            bare_rollouts=arm.budget,
            expansion=arm.expansion,
            max_rollouts=args.max_rollouts,
            max_branch_depth=args.max_branch_depth,
        )
        self.freshness = FreshnessEstimate()

    def step(self, step: int, pool: Sequence[Prompt]) -> StepOutcome:
        self.workload.policy = self.theta
        rng = np.random.default_rng([self.seed, step, 2])
        # No outcome history: the oracle reads the truth. No learning mode: θ is the only thing that learns.
        result = run_step(
            self.workload,
            self.strategy,
            pool,
            {},
            self.config,
            rng,
            learn=False,
            freshness=self.freshness.value,
        )
        self.freshness = self.freshness.add(*result.freshness_evidence)
        turns = weighted_turns(
            [
                (forest_tree_turns(self.workload, tree, self.arm.advantage), leaves(tree))
                for tree in self.estimator.trees
            ],
            self.turn_weight,
        )
        return StepOutcome(turns, result.rollouts, result.turns, result.mixed, result.active)


async def wait_for_training(client: AsyncTraceClient, job: str, patience: float) -> None:
    """Until the job's predictor has trained on the step's trees (at most `patience` seconds). The
    service trains in the background, a round every TRAIN_INTERVAL_SECONDS on the trees completed since
    the last; every tree is complete now, so the next new version has seen them all, and when nothing
    is ingested for two intervals, the last round already had them."""
    before = await client.predictor_info(job)
    now = time.monotonic()
    deadline, quiet_until = now + patience, now + 2 * TRAIN_INTERVAL_SECONDS
    while time.monotonic() < deadline:
        # Not faster: each GET /v1/predictor scores the predictor's held-out trees.
        await asyncio.sleep(TRAIN_INTERVAL_SECONDS)
        info = await client.predictor_info(job)
        if info.version > before.version:
            return
        if info.examples_seen != before.examples_seen:
            quiet_until = deadline  # a round is training on new trees: wait for its version
        elif time.monotonic() > quiet_until:
            return


# --- one family and seed -------------------------------------------------------------------------------


def fresh_job(*parts: str) -> str:
    """A new job id of the v1 contract (letters, digits and ``_.-``) naming ``parts``: an arm's name may
    hold ``@`` (``trace@global``)."""
    named = "-".join(parts)
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in named) + f"-{uuid.uuid4().hex[:6]}"


def service_settings(prefix: str, feature_dim: int, jobs: int) -> dict[str, str]:
    """One service for every arm: ``jobs`` arms' predictors fit in its memory at once."""
    return {
        **SERVICE_SETTINGS,
        "TRACE_STORE_PREFIX": prefix,
        "TRACE_PREDICTOR_FEATURE_DIM": str(feature_dim),
        "TRACE_PREDICTOR_MAX_JOBS": str(max(jobs, 1)),
    }


def start_service(
    family: str, seed: int, arms: Sequence[Arm], redis: RedisServer, directory: Path, template: PolicyWorkload
) -> ServiceProcess:
    """The one service process every arm allocates through (module docstring)."""
    features = template.prompts[0].features
    feature_dim = 0 if features is None else len(features)
    settings = service_settings(f"learn-{family}-{seed}", feature_dim, len(arms))
    return ServiceProcess(redis.url, directory, settings).start()


def held_out_success(held_out: PolicyWorkload, theta: FloatArray, prompt_ids: Sequence[str]) -> float:
    """The exact mean success of the held-out tasks under θ."""
    held_out.policy = theta
    return float(np.mean(held_out.true_success_many(prompt_ids)))


#: Under the turns horizon an arm steps on at most this many times `--steps` to match uniform's turns.
MAX_STEPS_FACTOR = 2
HORIZONS = ("turns", "steps")


def takes_step(curve: Curve, uniform: Curve, step: int, args: argparse.Namespace) -> bool:
    """Whether an arm takes step `step` (0-based): every arm takes the first `--steps`; under the turns
    horizon an arm that has generated fewer turns than uniform did in those steps steps on (equal
    compute: an arm whose rollouts are shorter is not cut off with less of it), at most
    `MAX_STEPS_FACTOR × --steps` steps in all."""
    if step < args.steps:
        return True
    return (
        args.horizon == "turns"
        and step < MAX_STEPS_FACTOR * args.steps
        and curve is not uniform
        and curve.turns[-1] < uniform.turns[-1]
    )


async def run_family_seed(
    family: str,
    seed: int,
    arms: Sequence[Arm],
    args: argparse.Namespace,
    redis: RedisServer,
    directory: Path,
) -> dict[str, Curve]:
    """Every arm on one family and training seed, in lockstep; the curves by arm name."""
    held_out = make_workload(family, seed + HELD_OUT_SEED_OFFSET, prompts=args.eval_prompts)
    assert isinstance(held_out, PolicyWorkload)
    evaluated = [prompt.prompt_id for prompt in held_out.prompts]
    template = make_workload(family, seed, prompts=args.prompts)
    assert isinstance(template, PolicyWorkload)
    service = start_service(family, seed, arms, redis, directory, template)
    try:
        service.wait_ready()
        service_arms = [ServiceArm(arm, family, seed, args, service) for arm in arms if arm.policy]
        oracle_arms = [OracleArm(arm, family, seed, args) for arm in arms if arm.policy is None]
        runs: list[ArmRun] = [*service_arms, *oracle_arms]
        for run in runs:
            run.curve.success.append(held_out_success(held_out, run.theta, evaluated))
        uniform = next(run for run in runs if run.arm.name == UNIFORM)
        started = time.perf_counter()
        for step in itertools.count():
            stepping = [run for run in runs if takes_step(run.curve, uniform.curve, step, args)]
            if not stepping:
                break
            pool = template.epoch_pool(step, args.pool)
            by_service = [run for run in service_arms if run in stepping]
            outcomes = list(await asyncio.gather(*(run.step(step, pool) for run in by_service)))
            in_process = [run for run in oracle_arms if run in stepping]
            outcomes += [run.step(step, pool) for run in in_process]
            for run, outcome in zip([*by_service, *in_process], outcomes, strict=True):
                run.update(outcome)
                run.curve.success.append(held_out_success(held_out, run.theta, evaluated))
            await asyncio.gather(
                *(run.wait_for_training(args.train_wait) for run in by_service if run.arm.reads_predictor)
            )
            progress = " ".join(f"{run.arm.name} {run.curve.success[-1]:.3f}" for run in stepping)
            print(
                f"[{time.perf_counter() - started:6.1f}s] {family} seed {seed} step {step + 1}: "
                f"held-out success {progress}",
                file=sys.stderr,
            )
        for run in service_arms:
            run.curve.estimate = (await run.client.job_stats(run.job)).gain
            info = await run.client.predictor_info(run.job)
            run.curve.trust = None if info.trust is None else info.trust.slope
            await run.client.aclose()
    finally:
        service.stop()
    return {run.arm.name: run.curve for run in runs}


# --- the report ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArmFigures:
    """What the tables show of one arm on one (family, seed): the held-out success at uniform's total
    turns (equal compute; after the arm's last step if it generated fewer), the steps it took, and the
    ratios, None past the horizon (or when uniform did not improve on its start, so there is nothing to
    reach)."""

    final_success: float
    steps: int
    turns_ratio: float | None
    rollouts_ratio: float | None
    mixed_per_step: float
    effective_ratio: float


def arm_figures(curves: dict[str, Curve]) -> dict[str, ArmFigures]:
    uniform = curves[UNIFORM]
    target = uniform.success[-1]
    improved = target > uniform.success[0]

    def ratio(curve: Curve, unit: str) -> float | None:
        mine = cost_to_reach(getattr(curve, unit), curve.success, target)
        theirs = cost_to_reach(getattr(uniform, unit), uniform.success, target)
        if not improved or mine is None or not theirs:
            return None
        return mine / theirs

    return {
        name: ArmFigures(
            final_success=success_at(curve.turns, curve.success, uniform.turns[-1]),
            steps=len(curve.mixed),
            turns_ratio=ratio(curve, "turns"),
            rollouts_ratio=ratio(curve, "rollouts"),
            mixed_per_step=statistics.fmean(curve.mixed),
            effective_ratio=curve.effective_ratio,
        )
        for name, curve in curves.items()
    }


def _ratio_cell(value: float | None) -> str:
    return "> horizon" if value is None else f"{value:.2f}"


def print_seed_table(family: str, seed: int, curves: dict[str, Curve]) -> None:
    figures = arm_figures(curves)
    uniform = curves[UNIFORM]
    print(
        f"\n{family}, seed {seed}: uniform's held-out success {uniform.success[0]:.3f} → "
        f"{uniform.success[-1]:.3f} in {uniform.turns[-1]} turns, {uniform.rollouts[-1]} rollouts"
    )
    header = (
        f"{'arm':<14} {'final':>7} {'steps':>6} {'turns→uniform':>14} {'rollouts→uniform':>17}"
        f" {'mixed/step':>11} {'eff. ratio':>11}"
    )
    print(header)
    print("-" * len(header))
    for name, row in figures.items():
        print(
            f"{name:<14} {row.final_success:>7.3f} {row.steps:>6} {_ratio_cell(row.turns_ratio):>14} "
            f"{_ratio_cell(row.rollouts_ratio):>17} {row.mixed_per_step:>11.1f} {row.effective_ratio:>11.3f}"
        )


def print_summary(results: dict[str, dict[int, dict[str, Curve]]]) -> None:
    print("\nSummary: mean ± std over seeds; (k/S): only k of S seeds reached uniform's final success")
    header = (
        f"{'family':<10} {'arm':<14} {'final success':>15} {'steps':>6} {'turns→uniform':>20}"
        f" {'rollouts→uniform':>20} {'mixed/step':>14} {'eff. ratio':>13}"
    )
    print(header)
    print("-" * len(header))
    for family, per_seed in results.items():
        figures = [arm_figures(curves) for curves in per_seed.values()]
        for name in figures[0]:
            rows = [seed_figures[name] for seed_figures in figures]
            final_mean, final_spread = mean_std([row.final_success for row in rows])
            final = f"{final_mean:.3f} ± {final_spread:.3f}"
            steps = statistics.fmean(row.steps for row in rows)
            print(
                f"{family:<10} {name:<14} {final:>15} {steps:>6.1f} "
                f"{mean_spread([r.turns_ratio for r in rows]):>20} "
                f"{mean_spread([r.rollouts_ratio for r in rows]):>20} "
                f"{mean_spread([r.mixed_per_step for r in rows]):>14} "
                f"{mean_spread([r.effective_ratio for r in rows]):>13}"
            )
    print(
        "final success: exact mean success of the held-out tasks once the arm has generated uniform's\n"
        "turns (equal compute, linear between steps), or after its last update if it generated fewer.\n"
        "steps: policy-gradient steps taken (--horizon turns: until uniform's turns are matched).\n"
        "turns→uniform, rollouts→uniform: the turns (rollouts) an arm needed to reach uniform's final\n"
        "success over uniform's own (< 1: faster than uniform). mixed/step: mixed groups per step;\n"
        "eff. ratio: mixed / active groups."
    )


def plot(results: dict[str, dict[int, dict[str, Curve]]], out: Path) -> list[Path]:
    """Per family: held-out success over cumulative turns and over steps, mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    out.mkdir(parents=True, exist_ok=True)
    for family, per_seed in results.items():
        figure, (by_turns, by_step) = plt.subplots(1, 2, figsize=(13, 5))
        colors = line_colors(list(next(iter(per_seed.values()))))
        for name, color in colors.items():
            arm_curves = [curves[name] for curves in per_seed.values()]
            # Seeds may take different numbers of steps (--horizon turns): the steps every seed took.
            points = min(len(curve.success) for curve in arm_curves)
            success = np.mean([curve.success[:points] for curve in arm_curves], axis=0)
            turns = np.mean([curve.turns[:points] for curve in arm_curves], axis=0)
            style = {"color": color, "linewidth": 2.4 if name in FIXED else 1.2}
            by_turns.plot(turns, success, label=name, **style)
            by_step.plot(np.arange(success.size), success, label=name, **style)
        by_step.xaxis.set_major_locator(MaxNLocator(integer=True))
        by_turns.set_xlabel("cumulative turns generated")
        by_step.set_xlabel("policy-gradient steps")
        for axes in (by_turns, by_step):
            axes.set_ylabel("held-out success (exact)")
            axes.grid(alpha=0.3)
        by_step.legend(ncol=2, fontsize=8)
        figure.suptitle(f"{family}: held-out success, mean over {len(per_seed)} seeds")
        figure.tight_layout()
        path = out / f"learning-{family}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


# --- command line --------------------------------------------------------------------------------------


def policy_families() -> list[str]:
    """The registered families a policy-gradient learner can train (those with a policy)."""
    return [name for name in FAMILIES if isinstance(make_workload(name, 0, prompts=8), PolicyWorkload)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_family_arguments(parser, "every policy family")
    parser.add_argument("--seeds", type=int, default=3, help="training seeds per family")
    parser.add_argument("--steps", type=int, default=8, help="policy-gradient steps per seed")
    parser.add_argument(
        "--horizon",
        choices=HORIZONS,
        default="turns",
        help="turns: uniform takes --steps steps and every other arm steps on until it has generated as "
        f"many turns (equal compute; at most {MAX_STEPS_FACTOR}× --steps steps); steps: every arm takes "
        "--steps steps",
    )
    parser.add_argument(
        "--prompts", type=int, default=512, help="training tasks per seed: one recurs every prompts/B steps"
    )
    parser.add_argument("--pool", type=int, default=128, help="prompts offered each step (B)")
    parser.add_argument(
        "--budget", type=int, default=256, help="bare rollouts per step of branching arms (M)"
    )
    parser.add_argument("--expansion", type=float, default=1.0, help="continuations per bare rollout (N)")
    parser.add_argument("--max-rollouts", type=int, default=64, help="most bare rollouts of one prompt")
    parser.add_argument(
        "--max-branch-depth",
        type=int,
        default=None,
        help="branching arms continue only from prefixes at most this many turns deep (default: any)",
    )
    parser.add_argument(
        "--arms",
        default=None,
        help="comma list of arms (default: all, in table order); <arm>@<variant> trains that arm on a "
        f"`bench.advantages` variant ({', '.join(ADVANTAGES)})",
    )
    parser.add_argument(
        "--pilot-share",
        type=float,
        default=0.5,
        help=f"share of M an arm <policy>{PILOT_SUFFIX} spends in its first wave",
    )
    parser.add_argument(
        "--turn-weight", choices=TURN_WEIGHTS, default="turn", help="every turn alike, or every rollout"
    )
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam", help="policy update")
    parser.add_argument("--lr", type=float, default=0.3, help="learning rate of the policy update")
    parser.add_argument("--eval-prompts", type=int, default=256, help="held-out tasks evaluated exactly")
    parser.add_argument(
        "--train-wait",
        type=float,
        default=10.0,
        help="most seconds to wait for a predictor to train on a step",
    )
    parser.add_argument(
        "--step-timeout", type=float, default=300.0, help="seconds before a step's trees close"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the PNGs")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 seed, 3 steps, 64 tasks, pool 32, budget 64, 64 held-out tasks",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.prompts, args.pool, args.budget, args.eval_prompts = 1, 3, 64, 32, 64, 64
    check_sizes(parser, args, ("seeds", "steps", "prompts", "pool", "budget", "eval_prompts"))
    args.families = chosen_families(parser, args, policy_families())
    arms = build_arms(args.budget, args.expansion)
    if args.arms is not None:
        wanted = comma_list(args.arms)
        known = {arm.name: arm for arm in arms}
        for name in (name for name in wanted if name not in known):
            variant = variant_arm(name, known, args.pilot_share)
            if variant is not None:
                known[name] = variant
        unknown = [name for name in wanted if name not in known]
        if unknown:
            parser.error(
                f"unknown arms {unknown}; choose from {', '.join(known)} "
                f"(or <arm>@<variant>, <arm>{PILOT_SUFFIX})"
            )
        if UNIFORM not in wanted:
            wanted.insert(0, UNIFORM)  # every figure is relative to uniform
        arms = [known[name] for name in wanted]
    args.arm_list = arms
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    results: dict[str, dict[int, dict[str, Curve]]] = {}
    with tempfile.TemporaryDirectory() as directory:
        redis = RedisServer(Path(directory), append_only=False).start()
        try:
            for family in args.families:
                for seed in range(args.seeds):
                    curves = asyncio.run(
                        run_family_seed(family, seed, args.arm_list, args, redis, Path(directory))
                    )
                    results.setdefault(family, {})[seed] = curves
                    print_seed_table(family, seed, curves)
        finally:
            redis.stop()
    total = next(arm.budget for arm in args.arm_list if arm.name == UNIFORM)
    print(
        f"\nLearning: {args.seeds} seeds × {args.steps} steps, pool B = {args.pool} of {args.prompts} tasks; "
        f"uniform {total} bare "
        f"rollouts, the others M = {args.budget} bare + N = {args.expansion:g}; {args.optimizer} "
        f"lr {args.lr:g}; held-out success over {args.eval_prompts} tasks of another seed"
    )
    print(protocol_line(args, args.families))
    print_summary(results)
    print_report(checks(results))
    for path in plot(results, args.out):
        print(f"plot: {path}")
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
