"""A dry run of the verl side on a CPU: the simulator generates the turns in place of the inference server,
and everything else is verl's own (verl 0.9.1).

What runs for real: verl's Hydra config (`ppo_trainer` with `trace_overrides()`), a local Ray cluster
with TransferQueue, `TraceAgentLoopManager` creating verl's `AgentLoopWorkerTQ` actors (which load a
byte-level tokenizer written to a temporary model directory, since nothing can be downloaded), verl's
per-prompt `__rollout_n__` sessions, the registered agent loop `trace_sim` (`SimTraceAgentLoop`), the
outputs in TransferQueue, the replay buffer verl loads for the trainer mode (`TraceReplayBuffer`, or
`TraceReplayBufferAsync` over verl's `ReplayBufferAsync`) with its `sample` calls, and the trainer's
`PPOTrainer._compute_advantage` with the `trace` estimator and `PPOTrainer._compute_metrics`, with the
step's metrics gathered as `PPOTrainer.step` gathers them. What does not: the FSDP actor, reference and
critic workers (log-probabilities and the update need a model on an accelerator), so a step ends with
the advantages the actor would train on and the metrics verl would log, less the actor's own.

In an asynchronous mode (`--mode colocate_async` or `separate_async`) the schedule is the trainer's:
`num_warmup_batches` batches are dispatched before the first step and one batch at each step, a step
samples its groups oldest first (in `parameter_sync_step` parts under `separate_async`) while later
batches are still generating, and a group the buffer evicts is refilled with a fresh prompt.

    python -m trace_lab.verl_dry_run --url http://127.0.0.1:8000 --steps 3
    python -m trace_lab.verl_dry_run --url http://127.0.0.1:8000 --mode colocate_async
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import logging
import math
import multiprocessing
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

import numpy as np
import ray
import transfer_queue as tq
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.metric_utils import RolloutMoELoadBalanceMetricsAccumulator
from verl.trainer.ppo.v1 import PPOTrainer
from verl.trainer.ppo.v1.utils import MetricsAggregator
from verl.utils import tensordict_utils as tu

from trace_client.driver import History, TurnResult, TurnTokens
from trace_client.integrations.verl import (
    ROLLOUT_N_FIELD,
    SAMPLERS,
    TraceAgentLoop,
    TraceAgentLoopManager,
    trace_overrides,
)
from trace_lab.sim import SimConfig, SimWorkload
from trace_lab.sim.workers import SimAgent

#: The config section of the simulated workload: both sides build the same one from it.
SIM_SECTION: Final = "trace_sim"
#: The agent loop's name in verl's registry, and the registry file that lists it beside `trace`.
SIM_AGENT_LOOP: Final = "trace_sim"
AGENT_LOOPS_FILE: Final = Path(__file__).with_name("verl_agent_loops.yaml")
AGENT_LOOPS_KEY: Final = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
DATA_SOURCE: Final = "trace-sim"
_OBSERVATION: Final = "\nObservation:"


# --- the simulator as the agent loop's turns ----------------------------------------------------------


@cache
def _sim_agent(prompts: int, seed: int) -> SimAgent:
    """One simulated workload per worker process (the same tasks the trainer side samples from)."""
    return SimAgent(SimWorkload(SimConfig(prompts=prompts), seed=seed), np.random.default_rng(seed + 1))


class SimTraceAgentLoop(TraceAgentLoop):
    """Agent loop `trace_sim`: the tree's turns come from the simulator, tokenized with verl's tokenizer;
    an observation's tokens are the environment's (loss mask 0). The reward is the simulator's."""

    async def next_turn(self, history: History) -> TurnResult:
        section = self.config[SIM_SECTION]
        turn = await _sim_agent(int(section.prompts), int(section.seed)).next_turn(history)
        policy, marker, observation = (turn.text or "").partition(_OBSERVATION)
        tokenizer: Any = self.tokenizer
        policy_ids = tokenizer.encode(policy, add_special_tokens=False)
        environment_ids = tokenizer.encode(marker + observation, add_special_tokens=False)
        ids = (*policy_ids, *environment_ids)
        return TurnResult(
            text=turn.text,
            done=turn.done,
            reward=turn.reward,
            features=turn.features,
            tokens=TurnTokens(ids, mask=(1,) * len(policy_ids) + (0,) * len(environment_ids)),
            state=turn.state,
        )


# --- a model directory verl can load without a download -------------------------------------------------


def write_byte_model(directory: Path) -> Path:
    """A byte-level tokenizer (every text round-trips) and a one-layer Llama config: enough for verl's
    `HFModelConfig` and its tokenization path. Returns the directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1}
    for character in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[character] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tokenizer.save_pretrained(directory)
    LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32_768,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(directory)
    return directory


# --- the run -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DryRunOptions:
    url: str = "http://127.0.0.1:8000"
    pool: int = 16
    budget: int = 16
    expansion: float = 1.0
    prompts: int = 64
    seed: int = 0
    response_length: int = 8192
    job: str | None = None
    mode: str = "sync"  # verl's trainer.v1.trainer_mode


def dry_run_config(options: DryRunOptions, model_dir: Path) -> DictConfig:
    """verl's own `ppo_trainer` config with the TRACE overrides and a CPU-sized rollout side."""
    import verl

    job = options.job or f"verl-dry-run-{uuid.uuid4().hex[:8]}"
    integration = trace_overrides(
        options.url,
        mode=options.mode,
        job=job,
        budget=options.budget,
        expansion=options.expansion,
        agent_loop=SIM_AGENT_LOOP,
        prompt_id_key="index",  # the simulator's own prompt ids
    )
    # the integration's agent-loop registry lists `trace` only; this run's lists `trace_sim` too
    overrides = [
        f"{AGENT_LOOPS_KEY}={AGENT_LOOPS_FILE}" if line.startswith(f"{AGENT_LOOPS_KEY}=") else line
        for line in integration
    ]
    overrides += [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.prompt_length=1024",
        f"actor_rollout_ref.rollout.response_length={options.response_length}",
        f"data.train_batch_size={options.pool}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        f"++{SIM_SECTION}.prompts={options.prompts}",
        f"++{SIM_SECTION}.seed={options.seed}",
    ]
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


@dataclass(frozen=True)
class StepReport:
    """One dry-run step: what the allocation asked of verl and what reached the update."""

    step: int
    rollout_n: dict[str, int]  # uid -> sessions verl ran for it (0: skipped), of the step's dispatches
    keys: list[str]  # TransferQueue keys of the sampled trajectories, `{uid}_{session}_{index}`
    advantages: list[list[float]]  # per key: the advantages the actor would train on (response tokens)
    fields: list[dict[str, Any]]  # per key: `extra_fields` (trace_reward, trace_tree_id, trace_leaf_id, ...)
    rm_scores: list[list[float]]  # per key: what verl's reward panels read (the reward at the last token)
    loss_masks: list[list[int]]  # per key: verl's response_mask (1: the token enters the loss)
    metrics: dict[str, Any]  # what verl's trainer would log for the step, less the actor's own figures

    def line(self) -> str:
        ratio = self.metrics.get("trace/effective_ratio")
        return (
            f"step {self.step} | prompts {self.metrics.get('trace/prompts', 0):.0f}"
            f" (skipped {self.metrics.get('trace/skipped_prompts', 0):.0f})"
            f" | trees {self.metrics.get('trace/trees', 0):.0f}"
            f" | paths {self.metrics.get('trace/paths', 0):.0f}"
            f" (bare rollouts {self.metrics.get('trace/bare_rollouts', 0):.0f},"
            f" continuations {self.metrics.get('trace/continuations', 0):.0f})"
            f" | effective ratio {'-' if ratio is None else f'{ratio:.2f}'}"
            f" | critic/score/mean {self.metrics.get('critic/score/mean', 0.0):.2f}"
        )


class DryRun:
    """verl's rollout side against a trace-rollout service, one step at a time (see the module doc)."""

    def __init__(self, options: DryRunOptions, model_dir: Path) -> None:
        self.options = options
        self.config = dry_run_config(options, model_dir)
        self.workload = SimWorkload(SimConfig(prompts=options.prompts), seed=options.seed)
        # Ray nices its workers to 15 by default: on a machine kept busy by other work they would get a
        # hundredth of a core, and the step would wait on them for many minutes.
        ray.init(
            num_cpus=8,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
            _system_config={"worker_niceness": 0},
        )
        tq.init(self.config.transfer_queue)
        self.manager = TraceAgentLoopManager.create(
            config=self.config, llm_client=None, teacher_client=None, reward_loop_worker_handles=None
        )
        mode = options.mode
        self.mode_config = self.config.trainer.v1.get(mode, {})
        self.drawn = 0  # prompts dispatched so far: the position in the workload's stream of prompts
        self.step_number = 0
        self.rollout_n: dict[str, int] = {}  # the prompts dispatched during the current step
        sampler = self.config.trainer.v1.sampler
        # the arguments verl's `_build_replay_buffer` hands a custom sampler, and a shorter poll
        self.replay_buffer = SAMPLERS[mode](
            trainer_mode=mode,
            trainer_config=self.mode_config,
            max_off_policy_threshold=sampler.max_off_policy_threshold,
            max_off_policy_strategy=sampler.max_off_policy_strategy,
            sampler_kwargs=sampler.sampler_kwargs,
            refill_fn=self.dispatch,
            poll_interval=0.2,
        )
        # what the trainer's `_compute_advantage` and `_compute_metrics` read of it: they run as verl's
        # trainer runs them
        self.trainer_view = SimpleNamespace(
            config=self.config,
            use_critic=False,
            _rollout_moe_lb_metrics_accumulator=RolloutMoELoadBalanceMetricsAccumulator(
                model_config=self.config.actor_rollout_ref.model
            ),
            _get_n_gpus_for_throughput=lambda: 1,
        )

    def batch(self, prompts: int) -> TensorDict:
        """The next `prompts` prompts as verl's dataloader and `_next_train_batch` make them, tagged with
        the current step."""
        pool = [self.workload.epoch_pool(self.drawn + k, 1)[0] for k in range(prompts)]
        self.drawn += prompts
        batch = tu.get_tensordict(
            {
                "raw_prompt": [[{"role": "user", "content": p.text}] for p in pool],
                "data_source": [DATA_SOURCE] * len(pool),
                "index": [p.prompt_id for p in pool],
                "reward_model": [{"ground_truth": None}] * len(pool),
                "uid": [str(uuid.uuid4()) for _ in pool],
            }
        )
        tu.assign_non_tensor_data(batch, "global_steps", self.step_number)
        return batch

    def dispatch(self, prompts: int) -> int:
        """Register `prompts` new prompts in TransferQueue and hand them to the manager, as the trainer's
        `_submit_batch_to_rollout` does (also the async buffer's refill)."""
        batch = self.batch(prompts)
        uids = list(batch["uid"])
        tags = [{"is_prompt": True, "status": "pending", "global_steps": self.step_number} for _ in uids]
        tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
        self.manager.generate_sequences(batch)  # allocates, then verl's workers run the sessions
        self.rollout_n.update(zip(uids, batch[ROLLOUT_N_FIELD].tolist(), strict=True))
        return len(uids)

    def step(self, step: int) -> StepReport:
        started = time.monotonic()
        timing: dict[str, float] = {}
        self.step_number = step
        self.rollout_n = {}
        # warm-up batches and several updates a step are settings of the asynchronous modes only
        warmup = float(self.mode_config.get("num_warmup_batches", 0))
        if warmup > 0 and self.drawn == 0:
            self.dispatch(math.floor(warmup * self.options.pool))
        self.dispatch(self.options.pool)
        # as `PPOTrainer.step` and `_step_once` gather a step's metrics: one sample per update
        updates = int(self.mode_config.get("parameter_sync_step", 1))
        aggregator = MetricsAggregator()
        keys: list[str] = []
        tags: list[dict[str, Any]] = []
        view: Any = self.trainer_view  # the trainer's own methods, on what they read of the trainer
        for _ in range(updates):
            iteration: dict[str, Any] = {}
            sampled, sampler_metrics = self.replay_buffer.sample(
                global_steps=step, partition_id="train", batch_size=self.options.pool // updates
            )
            iteration.update(sampler_metrics)
            timing["gen"] = time.monotonic() - started
            sampled = PPOTrainer._compute_advantage(view, sampled, metrics=iteration)
            aggregator.add_step_metrics(iteration, sample_count=len(sampled.keys))
            keys += sampled.keys
            tags += sampled.tags
        metrics = aggregator.get_aggregated_metrics()
        timing["step"] = time.monotonic() - started
        batch = KVBatchMeta(partition_id="train", keys=keys, tags=tags)
        PPOTrainer._compute_metrics(view, batch, metrics, timing, global_steps=step, epoch=0)
        data = tq.kv_batch_get(
            keys=keys,
            partition_id="train",
            select_fields=["advantages", "rm_scores", "response_mask", "extra_fields"],
        )
        report = StepReport(
            step=step,
            rollout_n=self.rollout_n,
            keys=keys,
            advantages=[row.tolist() for row in data["advantages"].unbind(0)],
            fields=list(data["extra_fields"]),
            rm_scores=[row.tolist() for row in data["rm_scores"].unbind(0)],
            loss_masks=[row.tolist() for row in data["response_mask"].unbind(0)],
            metrics=metrics,
        )
        tq.kv_clear(keys=keys, partition_id="train")
        return report

    def close(self) -> None:
        tq.close()
        ray.shutdown()


@contextlib.contextmanager
def dry_run(options: DryRunOptions) -> Iterator[DryRun]:
    """A `DryRun` over a temporary model directory; Ray and TransferQueue are shut down after."""
    with tempfile.TemporaryDirectory(prefix="trace-verl-") as directory:
        run = DryRun(options, write_byte_model(Path(directory)))
        try:
            yield run
        finally:
            run.close()


def run_steps(options: DryRunOptions, steps: Sequence[int]) -> list[StepReport]:
    """The dry run's ``steps`` in a process of its own, started afresh.

    Ray cannot be started again safely in a process whose threads used an earlier session, and its
    native threads can crash the interpreter as it exits; a process per run keeps the caller's (a test
    session, a benchmark) free of both."""
    context = multiprocessing.get_context("spawn")  # a fork would copy the caller's threads' locks
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_steps_here, options, list(steps)).result()


def _steps_here(options: DryRunOptions, steps: list[int]) -> list[StepReport]:
    with dry_run(options) as run:
        return [run.step(step) for step in steps]


def sessions_per_uid(keys: Sequence[str]) -> Counter[str]:
    """Distinct sessions per uid among TransferQueue keys `{uid}_{session}_{index}`."""
    return Counter(uid for uid, _ in {tuple(key.rsplit("_", 2)[:2]) for key in keys})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", default=DryRunOptions.url, help="the trace-rollout service")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--pool", type=int, default=DryRunOptions.pool, help="prompts per step")
    parser.add_argument("--budget", type=int, default=DryRunOptions.budget, help="bare rollouts per step")
    parser.add_argument("--expansion", type=float, default=DryRunOptions.expansion)
    parser.add_argument("--seed", type=int, default=DryRunOptions.seed)
    parser.add_argument(
        "--mode", choices=sorted(SAMPLERS), default=DryRunOptions.mode, help="verl's trainer mode"
    )
    args = parser.parse_args(argv)
    # TransferQueue warns, per call, that it caps its threads at the machine's cores
    logging.getLogger("transfer_queue.utils.common").setLevel(logging.ERROR)
    options = DryRunOptions(
        url=args.url,
        pool=args.pool,
        budget=args.budget,
        expansion=args.expansion,
        seed=args.seed,
        mode=args.mode,
    )
    started = time.monotonic()
    with dry_run(options) as run:
        for step in range(1, args.steps + 1):
            report = run.step(step)
            print(report.line(), flush=True)  # noqa: T201 - the dry run's output
    print(f"done in {time.monotonic() - started:.0f}s")  # noqa: T201


if __name__ == "__main__":
    main()
