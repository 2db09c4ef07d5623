"""`TraceRollout`: TRL's `rollout_func` and reward function that run each generation batch as one TRACE
step (see the package doc for what TRL is handed and why)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

import torch
from transformers import GenerationConfig
from trl.data_utils import is_conversational
from trl.models.utils import unwrap_model_for_generation

from trace_client import AsyncTraceClient, TraceError
from trace_client.driver import (
    DriverConfig,
    FinishedTree,
    History,
    RolloutDriver,
    StepResult,
    TurnResult,
    TurnTokens,
)
from trace_client.envs import Environment, EnvironmentWorker, Episode, Move
from trace_client.integrations.gain import gain_metrics
from trace_client.integrations.trl.rows import (
    PackedSlot,
    TrainingRow,
    pack_rows,
    row_capacity,
    rows_per_bare_rollout,
    safe_budget,
    training_rows,
)
from trace_proto import DEFAULT_CONTROL_SHARE, AllocateRequest, AllocateResponse, JobStats, Policy, PromptIn
from trace_proto.v1.limits import MAX_TEXT_LENGTH

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

#: TRL's losses that normalise by the batch's trained tokens (or a constant), so that splitting a path
#: into rows leaves each token's weight as it was; the per-sequence ones (`grpo`, `sapo`, `luspo`,
#: `vespo`) would weight a short row's tokens more.
TOKEN_LEVEL_LOSSES: Final = frozenset({"dapo", "bnpo", "dr_grpo", "cispo"})

#: One generation request: the context's token ids and the most tokens to add.
Request = tuple[list[int], int]

#: A completion scorer for the default turn: the dataset prompt (as TRL holds it) and the decoded response.
CompletionScore = Callable[[Any, str], float]


@dataclass(frozen=True)
class TraceSettings:
    """How `TraceRollout` allocates and runs a generation batch.

    Args:
        url: The trace-rollout service.
        token: Its bearer token (None: the client reads `TRACE_TOKEN`).
        job: The service's job name: one per training run (it keys the predictor and the statistics).
        budget: Bare rollouts per generation batch and process. None: the most whose rows always fit
            the batch (`safe_budget`); a larger one fails a step whose rows do not fit.
        expansion: Stage 2 continuations per bare rollout (`N`).
        policy: The allocation policy (`trace`, or `uniform` for the baseline at the same budget).
        control_share: The share of the budget spent on control trees, the random sample of uniform's
            allocation the job's gain (`trace/gain/*`) is measured on and Stage 1's trust is fitted to.
        min_rollouts / max_rollouts: Bare rollouts of a selected prompt.
        max_turns: Most turns of one rollout; the default turn ends the rollout at this turn.
        turn_tokens: The default turn: at most this many generated tokens (a long answer is cut into
            turns, so that Stage 2 has prefixes to branch from).
        concurrency: Rollouts in flight at once (their turns are generated together as one batch).
        step_timeout: Seconds one generation batch may take; past it the trees are closed with what
            they have.
    """

    url: str = "http://localhost:8000"
    token: str | None = None
    job: str = "trl"
    budget: int | None = None
    expansion: float = 1.0
    policy: Policy | str = Policy.TRACE
    control_share: float = DEFAULT_CONTROL_SHARE
    min_rollouts: int = 2
    max_rollouts: int = 16
    max_turns: int = 8
    turn_tokens: int = 64
    concurrency: int = 64
    step_timeout: float = 3600.0


@dataclass(frozen=True)
class TraceStep:
    """One generation batch as it went: the allocation, the finished trees and the rows handed to TRL."""

    allocation: AllocateResponse
    result: StepResult
    rows: list[TrainingRow]
    slots: int
    capacity: int
    stats: JobStats | None = None

    def metrics(self) -> dict[str, float]:
        """What the reward function logs under `trace/` (TRL's own `reward` is the rows' advantages)."""
        progress = self.result.progress
        rewards = [
            node.reward
            for finished in self.result.trees
            for node in finished.tree.nodes
            if node.reward is not None and node.node_id not in finished.failures
        ]
        return {
            "trace/prompts": float(len(self.allocation.trees) + len(self.allocation.skipped)),
            "trace/trees": float(len(self.allocation.trees)),
            "trace/skipped_prompts": float(len(self.allocation.skipped)),
            "trace/bare_rollouts": float(progress.bare_finished),
            "trace/continuations": float(progress.continuations_finished),
            "trace/failed_rollouts": float(progress.failed),
            "trace/closed_trees": float(sum(finished.closed for finished in self.result.trees)),
            "trace/reward": sum(rewards) / len(rewards) if rewards else 0.0,  # per rollout's leaf
            "trace/rows": float(len(self.rows)),
            "trace/row_fill": len(self.rows) / self.capacity,
            **gain_metrics(self.allocation, self.stats),
        }


def grpo_config(trainer: GRPOTrainer) -> GRPOConfig:
    """The trainer's arguments, which a GRPOTrainer holds as a `GRPOConfig`."""
    return cast("GRPOConfig", trainer.args)


def _mapping(value: dict[Any, Any] | str | None) -> dict[str, Any]:
    """A keyword-arguments field of the config: `TrainingArguments` has parsed a JSON string into a dict
    by now, whatever the field's type says."""
    return dict(cast("dict[str, Any] | None", value) or {})


def stable_prompt_id(prompt: Any) -> str:
    """The prompt's name across steps: a hash of the prompt as TRL holds it (text or messages)."""
    return "sha1:" + hashlib.sha1(json.dumps(prompt, sort_keys=True, default=str).encode()).hexdigest()


def prompt_text(prompt: Any) -> str:
    """The prompt as one text, for the service's predictor."""
    if isinstance(prompt, str):
        return prompt[:MAX_TEXT_LENGTH]
    text = "\n".join(str(message.get("content", "")) for message in prompt if isinstance(message, dict))
    return text[:MAX_TEXT_LENGTH]


def prompt_token_ids(
    prompt: Any, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """The prompt's token ids as TRL makes them: the chat template with the generation prompt for
    messages, the plain tokenizer for a text."""
    if is_conversational({"prompt": prompt}):
        encoded = tokenizer.apply_chat_template(
            prompt,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **(chat_template_kwargs or {}),
        )
        return [int(i) for i in encoded["input_ids"]]
    return [int(i) for i in tokenizer(text=prompt)["input_ids"]]


class TraceRollout:
    """TRL `GRPOTrainer`'s `rollout_func` (this object) and reward function (`trace_advantage`).

    Each call runs the generation batch's distinct prompts as one TRACE step (`RolloutDriver.run_step`):
    `/v1/allocate` decides the bare rollouts per prompt (0 skips it), the rollouts run with the trainer's
    model, `/v1/expand` brings the Stage 2 continuations, and the finished trees become the batch's rows
    (`rows.training_rows`, `rows.pack_rows`).

    The default turn is a chunk of at most `turn_tokens` generated tokens; the rollout ends at the
    end-of-sequence token, at `max_completion_length` response tokens or at `max_turns` turns, and is
    scored by `score(prompt, response_text)`. For a multi-turn task subclass and override `next_turn`
    (with `generate`, `context_ids`, `prompt`) and, if the last turn carries no reward, `score`.

    For a stateful environment pass `environment_factory(prompt) -> Environment` (`trace_client.envs`):
    each turn is then `act(episode)` (by default `turn_tokens` generated tokens, decoded, as the
    action) on the prompt's environment, followed by the observation's tokens (masked out); the reward
    is the episode's summed environment reward, and a continuation restores its node's environment
    state (by snapshot, or by a checked replay) before its first turn.
    """

    def __init__(
        self,
        settings: TraceSettings | None = None,
        *,
        score: CompletionScore | None = None,
        prompt_id: Callable[[Any], str] = stable_prompt_id,
        environment_factory: Callable[[PromptIn], Environment] | None = None,
    ) -> None:
        overridden = (
            type(self).next_turn is not TraceRollout.next_turn or type(self).score is not TraceRollout.score
        )
        if score is None and not overridden and environment_factory is None:
            raise ValueError(
                "pass score(prompt, response_text) or environment_factory, or override next_turn / score"
            )
        self.environment_factory = environment_factory
        self.settings = settings or TraceSettings()
        self.score_completion = score
        self.prompt_id = prompt_id
        self.last_step: TraceStep | None = None
        self._trainer: GRPOTrainer | None = None
        self._prompts: dict[str, tuple[Any, list[int]]] = {}
        self._batcher: _GenerationBatcher | None = None
        self._metrics: dict[str, float] = {}

    # --- what TRL calls ------------------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        """TRL's `rollout_func`: one TRACE step over the batch's prompts, one row (or filler) per slot."""
        self._check(trainer)
        args = grpo_config(trainer)
        group_size = int(args.num_generations or 0)
        slots = len(prompts)
        capacity = row_capacity(slots, group_size)
        budget = self._budget(slots, group_size)
        tokenizer = self.tokenizer_of(trainer)
        self._prompts = {}
        pool: list[PromptIn] = []
        for prompt in prompts:
            name = self.prompt_id(prompt)
            if name not in self._prompts:
                ids = prompt_token_ids(prompt, tokenizer, _mapping(args.chat_template_kwargs))
                self._prompts[name] = (prompt, ids)
                pool.append(PromptIn(prompt_id=name, text=prompt_text(prompt)))
        request = AllocateRequest(
            job=self.settings.job,
            step=int(trainer.state.global_step),
            budget=budget,
            expansion=self.settings.expansion,
            min_rollouts=self.settings.min_rollouts,
            max_rollouts=self.settings.max_rollouts,
            policy=Policy(self.settings.policy),
            control_share=self.settings.control_share,
            prompts=pool,
        )
        self._trainer = trainer
        try:
            # a thread of its own: the step's event loop must not meet one the caller may be running
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-step") as runner:
                result, stats = runner.submit(asyncio.run, self._run_step(request)).result()
        finally:
            self._trainer = None
        rows = [row for finished in result.trees for row in self._rows(finished)]
        packed = pack_rows(rows, slots, group_size)
        step = TraceStep(result.allocation, result, rows, slots, capacity, stats)
        self.last_step = step
        self._metrics = step.metrics()
        return self._trl_output(packed, tokenizer.pad_token_id)

    def trace_advantage(
        self,
        *,
        trace_trl_reward: list[float],
        log_metric: Callable[[str, float], None] | None = None,
        **_: Any,
    ) -> list[float]:
        """TRL's reward function: each row's reward is its tree advantage, each filler's the balance
        that makes its group's mean 0; the step's own numbers go to TRL's log under `trace/`."""
        if log_metric is not None:
            for name, value in self._metrics.items():
                log_metric(name, value)
            self._metrics = {}
        return [float(value) for value in trace_trl_reward]

    # --- the turn (override for a multi-turn task) ---------------------------------------------------

    async def next_turn(self, history: History) -> TurnResult:
        """At most `turn_tokens` generated tokens after the history."""
        trainer = self.trainer
        limit = int(
            grpo_config(trainer).max_completion_length or self.settings.turn_tokens * self.settings.max_turns
        )
        used = sum(len(turn.tokens.ids) for turn in history.turns if turn.tokens is not None)
        asked = max(1, min(self.settings.turn_tokens, limit - used))
        ids = await self.generate(self.context_ids(history), asked)
        done = (
            not ids
            or ids[-1] in self.eos_token_ids(trainer)
            or len(ids) < asked
            or used + len(ids) >= limit
            or history.depth + 1 >= self.settings.max_turns
        )
        return TurnResult(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            done=done,
            tokens=TurnTokens(tuple(ids)),
        )

    async def score(self, history: History) -> float:
        """`score(prompt, response_text)` on the whole response, decoded in one piece."""
        if self.score_completion is None:
            raise ValueError("the rollout's last turn carries no reward and no score was given")
        ids = [i for turn in history.turns if turn.tokens is not None for i in turn.tokens.ids]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return float(await asyncio.to_thread(self.score_completion, self.prompt(history), text))

    # --- the turn on an environment (with `environment_factory`) --------------------------------------

    async def act(self, episode: Episode) -> Move:
        """The policy's next action: at most `turn_tokens` tokens generated after the prompt and the
        episode's tokens so far (the first observation's too, on the first turn), decoded."""
        history = episode.history
        if history is None:
            raise ValueError("act needs the episode's history")
        context = self.context_ids(history)
        if not episode.steps:
            context += self.observation_ids(episode.start)
        ids = await self.generate(context, self.settings.turn_tokens)
        return Move(self.tokenizer.decode(ids, skip_special_tokens=True), tokens=TurnTokens(tuple(ids)))

    def observation_ids(self, observation: object) -> list[int]:
        """An observation's token ids, as the next turn's context (masked out of the loss)."""
        return list(self.tokenizer.encode(str(observation), add_special_tokens=False))

    def _environment_worker(self) -> EnvironmentWorker | None:
        if self.environment_factory is None:
            return None
        return EnvironmentWorker(
            self.environment_factory,
            self.act,
            max_steps=self.settings.max_turns,
            cache_size=max(1024, self.settings.concurrency),
            observation_ids=self.observation_ids,
        )

    # --- helpers for a turn --------------------------------------------------------------------------

    def prompt(self, history: History) -> Any:
        """The dataset prompt of the history, as TRL handed it over."""
        return self._prompts[history.prompt.prompt_id][0]

    def context_ids(self, history: History) -> list[int]:
        """The prompt's token ids followed by every turn's."""
        prompt_ids = self._prompts[history.prompt.prompt_id][1]
        return [
            *prompt_ids,
            *(i for turn in history.turns if turn.tokens is not None for i in turn.tokens.ids),
        ]

    async def generate(self, context_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Sample up to `max_new_tokens` tokens after `context_ids` with the trainer's model and sampling
        settings (cut after the first end-of-sequence token). Concurrent calls share one batch."""
        if self._batcher is None:
            raise RuntimeError("generate runs only inside a step (from next_turn)")
        return await self._batcher.generate(list(context_ids), max_new_tokens)

    @property
    def trainer(self) -> GRPOTrainer:
        """The trainer whose batch is running (only inside a step)."""
        if self._trainer is None:
            raise RuntimeError("the trainer is known only inside a step")
        return self._trainer

    @property
    def tokenizer(self) -> Any:
        """The running trainer's tokenizer (only inside a step)."""
        return self.tokenizer_of(self.trainer)

    @staticmethod
    def tokenizer_of(trainer: GRPOTrainer) -> Any:
        """The trainer's tokenizer (a processor's own tokenizer)."""
        processing_class = trainer.processing_class
        return getattr(processing_class, "tokenizer", processing_class)

    @classmethod
    def eos_token_ids(cls, trainer: GRPOTrainer) -> set[int]:
        """Every token that ends a completion: the tokenizer's end-of-sequence and the model's."""
        model: Any = trainer.model
        declared = model.generation_config.eos_token_id
        ids = set(declared if isinstance(declared, list) else [] if declared is None else [declared])
        return {int(i) for i in ids} | {int(cls.tokenizer_of(trainer).eos_token_id)}

    # --- the step ------------------------------------------------------------------------------------

    def _check(self, trainer: GRPOTrainer) -> None:
        """Refuse a trainer whose settings would turn the rows' rewards into other advantages."""
        args = grpo_config(trainer)
        if trainer.model is None or not trainer.model.training:
            raise ValueError(
                "TraceRollout runs training batches only: evaluate with a separate trainer or script "
                "(eval_strategy='no')"
            )
        problems = []
        if args.scale_rewards != "none":
            problems.append(
                f"scale_rewards must be 'none' (the rows' rewards are advantages), not {args.scale_rewards!r}"
            )
        if args.multi_objective_aggregation != "sum_then_normalize":
            problems.append("multi_objective_aggregation must be 'sum_then_normalize'")
        if list(trainer.reward_funcs) != [self.trace_advantage]:
            problems.append("reward_funcs must be [rollout.trace_advantage] alone (the reward is the tree's)")
        if args.reward_weights not in (None, [1.0]):
            problems.append("reward_weights must be unset")
        if args.mask_truncated_completions:
            problems.append("mask_truncated_completions must be False (a row may end inside a rollout)")
        if args.loss_type not in TOKEN_LEVEL_LOSSES:
            problems.append(f"loss_type must be one of {sorted(TOKEN_LEVEL_LOSSES)}, not {args.loss_type!r}")
        if args.use_vllm:
            problems.append("use_vllm is not supported: the turns are generated with the trainer's model")
        if trainer.tools:
            problems.append(
                "TRL's tools / environment_factory are not supported: pass TraceRollout's"
                " environment_factory, or call the tools in next_turn"
            )
        if problems:
            raise ValueError("GRPOTrainer settings TraceRollout cannot train with: " + "; ".join(problems))

    def _budget(self, slots: int, group_size: int) -> int:
        settings = self.settings
        if settings.budget is not None:
            return settings.budget
        fits = safe_budget(slots, group_size, settings.expansion, settings.max_turns)
        if fits < settings.min_rollouts:
            per_rollout = rows_per_bare_rollout(settings.expansion, settings.max_turns)
            raise ValueError(
                f"the generation batch holds {row_capacity(slots, group_size)} rows, too few for "
                f"{settings.min_rollouts} bare rollouts (up to {per_rollout:g} rows each): enlarge the batch "
                "(per_device_train_batch_size × steps_per_generation), or lower expansion or max_turns"
            )
        return fits

    async def _run_step(self, request: AllocateRequest) -> tuple[StepResult, JobStats | None]:
        """The step's trees, and the job's statistics after them (None when the service could not
        answer: the step keeps its trees, the log loses the gain figures)."""
        batcher = self._batcher = _GenerationBatcher(self._generate_batch)
        config = DriverConfig(
            concurrency=self.settings.concurrency,
            max_turns=self.settings.max_turns,
            step_timeout=self.settings.step_timeout,
        )
        environments = self._environment_worker()
        try:
            async with AsyncTraceClient(self.settings.url, token=self.settings.token) as client:
                if environments is None:
                    driver = RolloutDriver(client, self.next_turn, score=self.score, config=config)
                else:
                    driver = environments.driver(client, config=config)
                result = await driver.run_step(request)
                stats: JobStats | None = None
                try:
                    stats = await client.job_stats(request.job)
                except TraceError as error:
                    logger.warning("no trace/gain metrics this step: %s", error)
        finally:
            self._batcher = None
            if environments is not None:
                environments.close()
        # the driver fails only the rollouts that met it; a model that cannot generate fails the step
        if batcher.error is not None:
            raise RuntimeError("generating the step's turns failed") from batcher.error
        return result, stats

    def _rows(self, finished: FinishedTree) -> list[TrainingRow]:
        return training_rows(finished, self._prompts[finished.prompt.prompt_id][1])

    def _generate_batch(self, requests: list[Request]) -> list[list[int]]:
        """One `model.generate` over the requests, left-padded (runs in a worker thread)."""
        trainer = self.trainer
        args = grpo_config(trainer)
        tokenizer = self.tokenizer_of(trainer)
        eos = self.eos_token_ids(trainer)
        width = max(len(context) for context, _ in requests)
        pad = int(tokenizer.pad_token_id)
        device = trainer.accelerator.device
        input_ids = torch.tensor([[pad] * (width - len(c)) + c for c, _ in requests], device=device)
        attention_mask = torch.tensor(
            [[0] * (width - len(c)) + [1] * len(c) for c, _ in requests], device=device
        )
        config = GenerationConfig(
            max_new_tokens=max(limit for _, limit in requests),
            do_sample=True,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            pad_token_id=pad,
            eos_token_id=sorted(eos),
            **_mapping(args.generation_kwargs),
        )
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                gather_deepspeed3_params=args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=_mapping(args.gradient_checkpointing_kwargs) or None,
            ) as model,
            torch.no_grad(),
        ):
            output = model.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=config
            )
        generated: list[list[int]] = output[:, width:].tolist()
        results = []
        for ids, (_, limit) in zip(generated, requests, strict=True):
            ids = ids[:limit]
            end = next((k for k, token in enumerate(ids) if token in eos), None)
            results.append(ids if end is None else ids[: end + 1])
        return results

    def _trl_output(self, packed: list[PackedSlot], pad_token_id: int) -> dict[str, Any]:
        """The rollout_func answer: token lists per slot, the loss mask as TRL's `env_mask`, and the
        per-slot fields TRL forwards to the reward function (`trace_*`)."""
        filler = [int(pad_token_id)]
        return {
            "prompt_ids": [list(s.row.prompt_ids) if s.row else filler for s in packed],
            "completion_ids": [list(s.row.completion_ids) if s.row else filler for s in packed],
            "logprobs": None,
            "env_mask": [list(s.row.loss_mask) if s.row else [0] for s in packed],
            "trace_trl_reward": [s.trl_reward for s in packed],
            "trace_tree_id": [s.row.tree_id if s.row else None for s in packed],
            "trace_prompt_id": [s.row.prompt_id if s.row else None for s in packed],
            "trace_node_ids": [list(s.row.node_ids) if s.row else [] for s in packed],
            "trace_leaf_reward": [s.row.leaf_reward if s.row else None for s in packed],
        }


class _GenerationBatcher:
    """Turns the generation requests that the step's rollouts make at about the same moment into one
    batch: rollouts advance in lockstep (each batch answers all of them), so each batch holds nearly
    every rollout in flight."""

    def __init__(self, generate_batch: Callable[[list[Request]], list[list[int]]]) -> None:
        self._generate_batch = generate_batch
        self._waiting: list[tuple[Request, asyncio.Future[list[int]]]] = []
        self._worker: asyncio.Task[None] | None = None
        self.error: Exception | None = None

    def generate(self, context: list[int], max_new_tokens: int) -> Awaitable[list[int]]:
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._waiting.append(((context, max_new_tokens), future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work())
        return future

    async def _work(self) -> None:
        while self._waiting:
            # a rollout answered by the last batch reaches its next request a few hops later
            quiet = 0
            while quiet < 3:
                waiting = len(self._waiting)
                await asyncio.sleep(0)
                quiet = quiet + 1 if len(self._waiting) == waiting else 0
            batch, self._waiting = self._waiting, []
            try:
                outputs = await asyncio.to_thread(self._generate_batch, [request for request, _ in batch])
            except Exception as error:
                self.error = self.error or error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
            else:
                for (_, future), output in zip(batch, outputs, strict=True):
                    if not future.done():
                        future.set_result(output)
