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
prompts' history (two steps of its job per learning step; each wave's trees are their own groups). An
arm `<arm>-shape` allocates with `shape_from_evidence: false` (every tree deep), and `<arm>~<share>`
with that control share.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.advantages import ADVANTAGES
from bench.estimators import FinishedTree as ForestTree
from bench.estimators import Query, oracle_estimator
from bench.gain import checks, print_report
from bench.harness import StepConfig, Strategy, run_step
from bench.learning_arms import PILOT_SUFFIX, UNIFORM, Arm, build_arms, variant_arm
from bench.learning_report import Curve, plot, print_seed_table, print_summary
from bench.misleading import RelabelledAgent, Relabelling
from bench.policy_gradient import (
    OPTIMIZERS,
    TURN_WEIGHTS,
    SampledTurns,
    forest_tree_turns,
    policy_gradient,
    service_tree_turns,
    weighted_turns,
)
from bench.protocol import add_family_arguments, check_sizes, chosen_families, comma_list, protocol_line
from trace_client import AsyncTraceClient
from trace_client.driver import DriverConfig, FinishedTree, RolloutDriver
from trace_lab.local import RedisServer, ServiceProcess
from trace_lab.sim import FAMILIES, Prompt, make_workload
from trace_lab.sim.base import PolicyWorkload
from trace_lab.sim.workers import prompt_in
from trace_service.allocation.gain import ArmSums
from trace_service.allocation.tree import FreshnessEstimate

FloatArray = npt.NDArray[np.float64]

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


# --- arms ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepOutcome:
    turns: SampledTurns
    rollouts: int
    turns_spent: int
    mixed: int
    active: int
    policy_trees: ArmSums = field(default_factory=ArmSums)
    control_trees: ArmSums = field(default_factory=ArmSums)
    #: The share of the step's bare rollouts meant for the policy's trees (1 without controls), and the
    #: share of the policy's trees that could branch below their first turn.
    policy_share: float = 1.0
    deep_share: float = 1.0


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
        curve.policy_share.append(outcome.policy_share)
        curve.deep_share.append(outcome.deep_share)


class ServiceArm(ArmRun):
    """An arm that allocates through its own service process and runs rollouts with the driver."""

    def __init__(
        self, arm: Arm, family: str, seed: int, args: argparse.Namespace, service: ServiceProcess
    ) -> None:
        super().__init__(arm, family, seed, args)
        self.service = service
        self.client = AsyncTraceClient(service.url, timeout=120.0)
        self.job = fresh_job("learn", family, f"s{seed}", arm.name)
        #: From step `--mislead-after` on, each task is offered under another task's id and text
        #: (`bench.misleading`); the agent runs the true task behind the label.
        self.mislead_after: int | None = args.mislead_after
        self.labels = Relabelling()
        agent = RelabelledAgent(
            self.workload, np.random.default_rng([seed, 1, *arm.name.encode()]), self.labels
        )
        # Every rollout of a step in flight at once: SimAgent steps them in one vectorised batch per turn.
        driver_config = DriverConfig(concurrency=4 * arm.budget + 64, step_timeout=args.step_timeout)
        self.driver = RolloutDriver(self.client, agent.next_turn, config=driver_config)
        self.max_rollouts = args.max_rollouts
        self.max_branch_depth = args.max_branch_depth

    async def step(self, step: int, pool: Sequence[Prompt]) -> StepOutcome:
        self.workload.policy = self.theta
        if step == self.mislead_after:
            self.labels.swap_difficulty(self.workload)
        trees: list[FinishedTree] = []
        shares: list[tuple[float, float]] = []
        waves = self.arm.waves
        for wave, budget in enumerate(waves):
            wave_trees, share = await self.allocate_and_run(step * len(waves) + wave, budget, pool)
            trees += wave_trees
            shares.append(share)
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
            policy_share=statistics.fmean(share for share, _ in shares),
            deep_share=statistics.fmean(deep for _, deep in shares),
        )

    async def allocate_and_run(
        self, step: int, budget: int, pool: Sequence[Prompt]
    ) -> tuple[list[FinishedTree], tuple[float, float]]:
        """The wave's finished trees, the share of its budget meant for the policy and the share of the
        policy's trees that could branch below their first turn."""
        request = self.arm.request(
            job=self.job,
            step=step,
            budget=budget,
            prompts=[prompt_in(self.labels.shown(prompt)) for prompt in pool],
            max_rollouts=self.max_rollouts,
            max_branch_depth=self.max_branch_depth,
        )
        result = await self.driver.run_step(request)
        if result.timed_out:
            print(f"  {self.arm.name}: step {step} timed out; its open trees were closed", file=sys.stderr)
        split = result.allocation.split
        shares = (1.0, 1.0) if split is None else (split.policy_share, split.deep_branch_share)
        return list(result.trees), shares

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


# --- command line --------------------------------------------------------------------------------------


def policy_families() -> list[str]:
    """The registered families a policy-gradient learner can train (those with a policy)."""
    return [name for name in FAMILIES if isinstance(make_workload(name, 0, prompts=8), PolicyWorkload)]


def argument_parser() -> argparse.ArgumentParser:
    """The command line of this script (module docstring), with its defaults."""
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
        "--mislead-after",
        type=int,
        default=None,
        help="from this step on, offer each task to the service under the id and text of the task half "
        "the difficulty ranking away (`bench.misleading`): a job whose predictor's ranking misleads",
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
    return parser


def chosen_arms(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Arm]:
    """The arms `--arms` names (every arm when none), uniform first when it names no uniform; an unknown
    name is the parser's error."""
    arms = build_arms(args.budget, args.expansion)
    if args.arms is None:
        return arms
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
    return [known[name] for name in wanted]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.prompts, args.pool, args.budget, args.eval_prompts = 1, 3, 64, 32, 64, 64
    check_sizes(parser, args, ("seeds", "steps", "prompts", "pool", "budget", "eval_prompts"))
    args.families = chosen_families(parser, args, policy_families())
    args.arm_list = chosen_arms(parser, args)
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
