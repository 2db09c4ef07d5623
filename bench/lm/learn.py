"""A language-model learner through the real service: held-out accuracy per generated token, per arm.

    python -m bench.lm.learn            # arithmetic: uniform, dapo, trace_joint, trace; one seed
    python -m bench.lm.learn --quick    # a smoke run of about a minute
    python -m bench.lm.learn --task arithmetic,lookup --seeds 3 \\
        --arms uniform,dapo,greso,knapsack,trace_joint,trace_prefix,trace   # the full matrix

The policy is a small decoder-only transformer over characters (`bench.lm.model`), warm-started by
supervised training on noisy demonstrations of the task (cached per task, seed and configuration in
`bench/results/lm-cache/`, so every arm starts from the same weights), then trained by GRPO-style policy
gradient over tokens. Its rollouts run as the worker callables of `trace_client.driver` against
`trace-rollout serve` over HTTP with the embedded store, exactly as a trainer would use the service: the
predictor, the store, Stage 1 and Stage 2 all take part. One service process serves every arm, each arm
its own job, so each arm's predictor learns from that arm's trees only.

A step of an arm: the pool (B prompts of the task's training stream, the same for every arm) is
allocated with the arm's policy and budget; the driver runs the rollouts, every agent turn sampled
by the arm's policy in batches (`LMAgent`: one batched forward with a KV cache per wave of turns), the
environment answering each action from the history alone, so a continuation resumes from any turn
boundary by replaying it; each tree comes back with the service's values and advantages. The update:
each sampled action's tokens get its node's advantage — the service's tree advantage on arms that
branch, r − mean(group) on uniform's flat groups (`bench.lm.grpo.group_advantages`'s rule: a node of a
flat group lies on one rollout, so V̂(node) − V̂(root) is exactly that) — and the loss averages over every
generated token of the step (DAPO's token-level mean); one Adam step. DAPO's arm keeps only mixed groups.

The budget unit is the generated token: uniform takes `--steps` steps with R = M + ⌊M·N⌋ bare
rollouts; every other arm (M bare, expansion N) steps on until it has generated as many tokens as
uniform did (at most twice the steps). Reported per task and seed: held-out accuracy (greedy pass@1,
and sampled pass@1 over `--eval-samples` episodes per prompt, on a fixed test set of another seed)
every `--eval-every` updates (and after an arm's last) against cumulative generated tokens; each arm's
accuracy at uniform's total tokens (and, sampled, at uniform's total rollouts: the equal-rollouts
comparison); the tokens it needed to reach uniform's final sampled accuracy as a fraction of uniform's
(the first crossing, linear between evaluations); the share of mixed groups. Then mean ± spread over
seeds, and curves as PNGs in `bench/results/`. Each (task, seed, arm)'s curve is saved in
`bench/results/lm-runs/` (`--runs`) under a key of every argument that shapes it, so a matrix can run
in parts (one process per task, `--threads 1`), an arm added later runs beside the others' saved
curves, and the full command then reports it all without running again.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import hashlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from bench.advantages import ADVANTAGES
from bench.learning import fresh_job, service_settings, wait_for_training
from bench.learning_arms import SHARE_MARK, UNIFORM, Arm
from bench.lm import vocab
from bench.lm.agent import LMAgent, LMPolicy, TrainingSequence, training_sequences
from bench.lm.model import ModelConfig, TinyLM
from bench.lm.report import TokenCurve, collapses, load_curve, plot, run_path, save_curve, summary
from bench.lm.tasks import TASKS, Prompt, Task
from bench.protocol import comma_list
from trace_client import AsyncTraceClient
from trace_client.driver import DriverConfig, RolloutDriver
from trace_lab.local import ServiceProcess
from trace_proto import DEFAULT_CONTROL_SHARE, AllocateRequest, Policy, PromptIn
from trace_service.allocation import continuation_budget

DEFAULT_ARMS = ("uniform", "dapo", "trace_joint", "trace")
#: Every policy of the contract; `uniform` is GRPO's flat groups at R = M + ⌊M·N⌋ rollouts.
ALL_ARMS = tuple(policy.value for policy in Policy)
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results"
#: Under the token horizon an arm steps on at most this many times `--steps` to match uniform's tokens.
MAX_STEPS_FACTOR = 2


# --- evaluation and warm start -------------------------------------------------------------------------


def play(policy: LMPolicy, prompts: Sequence[Prompt], *, greedy: bool) -> list[float]:
    """Each prompt's reward over one episode played in process (all episodes in one batch per turn)."""
    task = policy.task
    actions: list[list[str]] = [[] for _ in prompts]
    observations: list[list[str]] = [[] for _ in prompts]
    rewards: list[float | None] = [None] * len(prompts)
    for _ in range(task.max_turns):
        live = [i for i, reward in enumerate(rewards) if reward is None]
        if not live:
            break
        prefixes = {
            i: vocab.prefix(prompts[i].text, list(zip(actions[i], observations[i], strict=True)))
            for i in live
        }
        for i in [i for i in live if not policy.fits(prefixes[i])]:
            rewards[i] = 0.0  # out of context: failed, as in training
        live = [i for i in live if rewards[i] is None]
        for i, (tokens, _) in zip(live, policy.act([prefixes[i] for i in live], greedy=greedy), strict=True):
            actions[i].append(vocab.decode(tokens))
            observation = task.step(prompts[i], actions[i])
            observations[i].append(observation.text)
            if observation.done:
                rewards[i] = observation.reward or 0.0
    return [reward or 0.0 for reward in rewards]


def accuracy(policy: LMPolicy, prompts: Sequence[Prompt], samples: int) -> tuple[float, float]:
    """Greedy pass@1 on `prompts`, and sampled pass@1 averaged over `samples` episodes of each (a
    held-out set of a hundred prompts has a standard error of 0.04 from one draw each)."""
    greedy = statistics.fmean(play(policy, prompts, greedy=True))
    sampled = statistics.fmean(play(policy, [p for p in prompts for _ in range(samples)], greedy=False))
    return greedy, sampled


@dataclass(frozen=True)
class WarmStart:
    """Supervised training on noisy demonstrations, so that RL starts from a policy that succeeds
    sometimes."""

    steps: int = 800
    batch: int = 32
    lr: float = 3e-3
    error_rate: float = 0.3
    prompts: int = 4096


def warm_started(
    task: Task, config: ModelConfig, warm: WarmStart, seed: int, cache: Path, device: str = "cpu"
) -> TinyLM:
    """The warm-started model for (task, seed, configuration), on ``device``, from the cache when it was
    made before (on any device)."""
    key = json.dumps([task.name, seed, asdict(config), asdict(warm)], sort_keys=True)
    path = cache / f"{task.name}-s{seed}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.pt"
    torch.manual_seed(seed)
    model = TinyLM(config).to(device)
    if path.exists():
        model.load_state_dict(torch.load(path, map_location=device, weights_only=True))
        return model
    rng = np.random.default_rng([seed, 7])
    prompts = task.sample_prompts(rng, warm.prompts)
    policy = LMPolicy(model, task, lr=warm.lr, feature_dim=0, seed=seed)
    started = time.perf_counter()
    for step in range(warm.steps):
        sequences = []
        for index in rng.integers(len(prompts), size=warm.batch).tolist():
            prompt = prompts[index]
            actions = task.demonstration(prompt, rng, warm.error_rate)
            turns = [(action, task.step(prompt, actions[: k + 1]).text) for k, action in enumerate(actions)]
            transcript = vocab.transcript(prompt.text, turns)
            # Imitation: every action of the demonstration, advantage 1 (the loss is then the mean
            # negative log-likelihood of the demonstrated tokens).
            sequences.append(TrainingSequence(transcript.ids, tuple(transcript.action_spans), 1.0))
        loss = policy.update(sequences)
        if step % 100 == 0:
            print(f"  warm start {task.name} seed {seed}: step {step} loss {loss:.3f} "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)  # fmt: skip
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return model


# --- arms ----------------------------------------------------------------------------------------------


def build_arms(names: Sequence[str], bare: int, expansion: float) -> list[Arm]:
    """uniform's flat groups at R = M + ⌊M·N⌋; every other name a policy at (M, N), or
    ``<policy>@<variant>``: that policy trained on a `bench.advantages` variant, and ``…~<share>``: with
    that control share (the contract's default otherwise)."""
    total = bare + continuation_budget(bare, expansion)
    arms = []
    for name in names:
        named, _, share = name.partition(SHARE_MARK)
        policy, _, variant = named.partition("@")
        if name == UNIFORM:
            arms.append(Arm(UNIFORM, Policy.UNIFORM, total, 0.0))
        else:
            arms.append(
                Arm(
                    name,
                    Policy(policy),
                    bare,
                    expansion,
                    advantage=variant or "service",
                    control_share=float(share) if share else DEFAULT_CONTROL_SHARE,
                )
            )
    return arms


def known_arm(name: str) -> bool:
    named, marked, share = name.partition(SHARE_MARK)
    policy, _, variant = named.partition("@")
    if marked:
        try:
            if not 0.0 <= float(share) <= 1.0:
                return False
        except ValueError:
            return False
    return policy in ALL_ARMS and (not variant or (policy != UNIFORM and variant in ADVANTAGES))


class ArmRun:
    """One arm on one (task, seed): its own copy of the warm-started policy, its service, its curve."""

    def __init__(self, arm: Arm, policy: LMPolicy, service: ServiceProcess, args: argparse.Namespace) -> None:
        self.arm = arm
        self.policy = policy
        self.service = service
        self.args = args
        self.client = AsyncTraceClient(service.url, timeout=120.0)
        self.job = fresh_job("lm", arm.name)
        self.curve = TokenCurve()

    async def step(self, step: int, pool: Sequence[Prompt]) -> None:
        assert self.arm.policy is not None
        prompts = {prompt.prompt_id: prompt for prompt in pool}
        agent = LMAgent(self.policy, prompts)
        config = DriverConfig(concurrency=4 * self.arm.budget + 64, step_timeout=self.args.step_timeout)
        driver = RolloutDriver(self.client, agent.next_turn, config=config)
        request = AllocateRequest(
            job=self.job,
            step=step,
            budget=self.arm.budget,
            expansion=self.arm.expansion,
            max_rollouts=self.args.max_rollouts,
            policy=self.arm.policy,
            control_share=self.arm.control_share,
            prompts=[PromptIn(prompt_id=p.prompt_id, text=p.text) for p in pool],
        )
        result = await driver.run_step(request)
        trained = [tree for tree in result.trees if tree.tree.mixed or not self.arm.mixed_groups_only]
        sequences = [
            sequence
            for tree in trained
            for sequence in training_sequences(
                tree, prompts[tree.prompt.prompt_id], flat=self.arm.flat, advantage=self.arm.advantage
            )
        ]
        await asyncio.to_thread(self.policy.update, sequences)
        curve = self.curve
        curve.tokens.append(curve.tokens[-1] + agent.tokens)
        curve.rollouts.append(
            curve.rollouts[-1] + sum(sum(n.reward is not None for n in t.tree.nodes) for t in result.trees)
        )
        curve.mixed.append(sum(tree.tree.mixed for tree in result.trees))
        curve.active.append(len(result.trees))


def takes_step(curve: TokenCurve, uniform: TokenCurve, step: int, steps: int) -> bool:
    """Every arm takes the first `steps`; then an arm that generated fewer tokens than uniform did steps
    on (equal compute), at most `MAX_STEPS_FACTOR × steps` in all."""
    if step < steps:
        return True
    return curve is not uniform and step < MAX_STEPS_FACTOR * steps and curve.tokens[-1] < uniform.tokens[-1]


def start_service(arms: Sequence[Arm], directory: Path, feature_dim: int) -> ServiceProcess:
    """One service process on the embedded store for every arm, each arm its own job."""
    data = Path(tempfile.mkdtemp(prefix="lm-", dir="/tmp"))  # a short path: the store's socket
    settings = {**service_settings("lm", feature_dim, len(arms)), "TRACE_DATA_DIR": str(data)}
    return ServiceProcess("", directory, settings).start()


async def run_task_seed(
    task: Task, seed: int, args: argparse.Namespace, directory: Path, saved: dict[str, TokenCurve]
) -> dict[str, TokenCurve]:
    """The arms of ``args.arms`` not in ``saved`` on one task and seed, in lockstep on the same pools;
    their curves by arm name. The others step on until they have generated uniform's tokens, so
    uniform's curve comes from ``saved`` or runs first."""
    config = ModelConfig(
        vocab_size=vocab.VOCAB_SIZE,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        max_len=args.max_len,
    )
    warm = WarmStart(steps=args.warm_steps)
    base = warm_started(task, config, warm, seed, args.out / "lm-cache", args.device)
    test = task.sample_prompts(np.random.default_rng([seed, 2]), args.test_prompts)
    stream = task.sample_prompts(np.random.default_rng([seed, 1]), args.pool * MAX_STEPS_FACTOR * args.steps)
    arms = [arm for arm in build_arms(args.arms, args.budget, args.expansion) if arm.name not in saved]
    service = start_service(arms, directory, args.features)
    runs = []
    try:
        service.wait_ready()
        for arm in arms:
            model = TinyLM(config).to(args.device)
            model.load_state_dict(base.state_dict())
            policy = LMPolicy(model, task, lr=args.lr, feature_dim=args.features, seed=seed)
            runs.append(ArmRun(arm, policy, service, args))
        start_greedy, start_sampled = accuracy(runs[0].policy, test, args.eval_samples)
        print_histogram(task, runs[0].policy, test)
        for run in runs:
            run.curve.record_accuracy(start_greedy, start_sampled)
        uniform = saved.get(UNIFORM) or next(run.curve for run in runs if run.arm.name == UNIFORM)
        started = time.perf_counter()
        for step in itertools.count():
            stepping = [run for run in runs if takes_step(run.curve, uniform, step, args.steps)]
            if not stepping:
                break
            pool = stream[(step * args.pool) % len(stream) :][: args.pool]
            for run in stepping:  # one at a time: the machine's cores go to one arm's sampling
                await run.step(step, pool)
                last = not takes_step(run.curve, uniform, step + 1, args.steps)
                if last or (step + 1) % args.eval_every == 0:
                    run.curve.record_accuracy(*accuracy(run.policy, test, args.eval_samples))
            await asyncio.gather(
                *(
                    wait_for_training(run.client, run.job, args.train_wait)
                    for run in stepping
                    if run.arm.reads_predictor
                )
            )
            progress = " ".join(f"{r.arm.name} {r.curve.sampled[-1]:.3f}" for r in stepping)
            elapsed = time.perf_counter() - started
            print(f"[{elapsed:6.1f}s] {task.name} seed {seed} step {step + 1}: {progress}", file=sys.stderr)
        for run in runs:
            await run.client.aclose()
    finally:
        service.stop()
    return {run.arm.name: run.curve for run in runs}


def print_histogram(task: Task, policy: LMPolicy, prompts: Sequence[Prompt], samples: int = 8) -> None:
    """The warm-started policy's per-prompt success on the test set (sampled, `samples` each)."""
    repeated = [prompt for prompt in prompts for _ in range(samples)]
    rewards = np.array(play(policy, repeated, greedy=False)).reshape(len(prompts), samples).mean(axis=1)
    counts, _ = np.histogram(rewards, bins=np.linspace(0, 1, samples + 2))
    bars = " ".join(f"{count}" for count in counts)
    print(
        f"  warm start {task.name}: per-prompt success (0 → 1, {samples} samples each): {bars}",
        file=sys.stderr,
    )


# --- command line --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--task", default="arithmetic", help=f"task or comma list of {', '.join(TASKS)}")
    parser.add_argument(
        "--arms",
        default=None,
        help=f"comma list of {', '.join(ALL_ARMS)}, or <arm>@<advantage> with one of "
        f"{', '.join(ADVANTAGES)} (default: {','.join(DEFAULT_ARMS)}; --quick: uniform,trace)",
    )
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=32, help="uniform's policy-gradient steps")
    parser.add_argument("--pool", type=int, default=32, help="prompts offered each step (B)")
    parser.add_argument("--budget", type=int, default=64, help="bare rollouts per step of branching arms (M)")
    parser.add_argument("--expansion", type=float, default=1.0, help="continuations per bare rollout (N)")
    parser.add_argument("--max-rollouts", type=int, default=16, help="most bare rollouts of one prompt")
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam's learning rate in RL")
    parser.add_argument("--warm-steps", type=int, default=800, help="supervised steps of the warm start")
    parser.add_argument("--test-prompts", type=int, default=128, help="held-out prompts evaluated")
    parser.add_argument("--eval-samples", type=int, default=4, help="sampled episodes per held-out prompt")
    parser.add_argument(
        "--eval-every", type=int, default=4, help="updates between evaluations (and after an arm's last)"
    )
    parser.add_argument("--features", type=int, default=0, help="hidden-state features sent per prefix")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--max-len", type=int, default=320)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the learner")
    parser.add_argument("--device", default=None, help="cpu or cuda[:n] (default: cuda when present)")
    parser.add_argument("--train-wait", type=float, default=10.0, help="most seconds a predictor may train")
    parser.add_argument("--step-timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--runs", type=Path, default=None, help="saved runs (default: OUT/lm-runs)")
    parser.add_argument("--quick", action="store_true", help="smoke run: a small model, 2 steps")
    args = parser.parse_args(argv)
    args.runs = args.runs or args.out / "lm-runs"
    if args.quick:
        args.arms = args.arms or "uniform,trace"
        args.steps, args.pool, args.budget = 2, 8, 16
        args.warm_steps, args.test_prompts, args.eval_samples, args.d_model = 30, 16, 1, 32
        args.eval_every = 1
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.tasks = comma_list(args.task)
    args.arms = comma_list(args.arms or ",".join(DEFAULT_ARMS))
    unknown = [name for name in args.tasks if name not in TASKS] + [a for a in args.arms if not known_arm(a)]
    if unknown:
        parser.error(f"unknown tasks or arms: {unknown}")
    # Every figure is relative to uniform, which steps first: the others read its tokens.
    args.arms = [UNIFORM, *(arm for arm in args.arms if arm != UNIFORM)]
    return args


#: glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8


def bound_heap_growth() -> None:
    """Sampling and updates run in worker threads on tensors of ever-changing shapes: glibc's
    per-thread heaps then fragment, and a run of a few hundred updates grew to 8 GB. Two heaps, large
    blocks mapped apart and freed memory trimmed keep it under a gigabyte (no-op off glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    for option, value in ((M_ARENA_MAX, 2), (M_MMAP_THRESHOLD, 1 << 16), (M_TRIM_THRESHOLD, 1 << 17)):
        mallopt(option, value)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    bound_heap_growth()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    results: dict[str, dict[int, dict[str, TokenCurve]]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for name in args.tasks:
            task = TASKS[name]()
            for seed in range(args.seeds):
                paths = {arm: run_path(task, seed, arm, args) for arm in args.arms}
                saved = {arm: curve for arm, path in paths.items() if (curve := load_curve(path)) is not None}
                if saved:
                    print(f"  {name} seed {seed}: saved curves of {', '.join(saved)}", file=sys.stderr)
                if len(saved) < len(paths):
                    ran = asyncio.run(run_task_seed(task, seed, args, Path(directory), saved))
                    for arm, curve in ran.items():
                        save_curve(paths[arm], curve)
                        saved[arm] = curve
                results.setdefault(name, {})[seed] = {arm: saved[arm] for arm in args.arms}
    total = args.budget + continuation_budget(args.budget, args.expansion)
    print(
        f"LM learner: {args.seeds} seed(s) × {args.steps} uniform steps, pool B = {args.pool}, uniform "
        f"{total} bare rollouts, the others M = {args.budget} + "
        f"N = {args.expansion:g}; d_model {args.d_model}, {args.layers} layers; equal generated tokens"
    )
    print("\n".join(summary(results)))
    print("\n".join(collapses(results)) or "no arm ended below its warm start")
    for path in plot(results, args.out):
        print(f"plot: {path}")
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
