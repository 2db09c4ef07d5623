"""TRL's GRPOTrainer with TRACE on a two-turn task, on a CPU in about a minute.

    .venv/bin/python examples/trl/train.py --steps 5                      # a service in-process
    .venv/bin/python examples/trl/train.py --url http://127.0.0.1:8000    # a running service

The task: the prompt `q:7` hides a digit. The policy makes a first try of up to three characters; the
environment answers `<`, `>` or `=` (the hidden digit against the try's first digit: tool tokens,
never trained); the policy tries again. A rollout succeeds when the hidden digit is among its tries.
The policy is a tiny randomly initialised Llama over a character vocabulary built here (nothing is
downloaded), so rewards move little in a few steps; the point is the wiring: `TraceRollout` is the
trainer's `rollout_func`, its `trace_advantage` the only reward function, and each step's line shows
the allocation (trees, skipped prompts), the continuations and the rows that reached the loss.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from trace_client.driver import History, TurnResult, TurnTokens
from trace_client.integrations.trl import TraceRollout, TraceSettings

PAD, EOS = "<pad>", "<eos>"
CHARACTERS = "0123456789q:<>="


class GuessTheDigit(TraceRollout):
    """The task's turns: a try, the environment's comparison, a second try scored against the digit."""

    async def next_turn(self, history: History) -> TurnResult:
        ids = await self.generate(self.context_ids(history), 3)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        hidden = int(str(self.prompt(history))[-1])
        if history.depth == 0:
            first = next((int(c) for c in text if c.isdigit()), None)
            answer = "=" if first == hidden else "<" if first is None or hidden < first else ">"
            observation = self.tokenizer(answer)["input_ids"]
            return TurnResult(
                text=text + answer,
                tokens=TurnTokens((*ids, *observation), mask=(1,) * len(ids) + (0,) * len(observation)),
            )
        tries = "".join(turn.text or "" for turn in history.turns) + text
        return TurnResult(
            text=text, done=True, reward=float(str(hidden) in tries), tokens=TurnTokens(tuple(ids))
        )


class StepLines(TrainerCallback):
    """One line per logged step: what the allocation did and what the loss trained on."""

    def on_log(
        self, _args: Any, state: Any, _control: Any, logs: dict[str, float] | None = None, **_: Any
    ) -> None:
        if not logs or "trace/rows" not in logs:
            return
        print(
            f"step {state.global_step} | prompts {logs['trace/prompts']:.0f}"
            f" | trees {logs['trace/trees']:.0f} | skipped {logs['trace/skipped_prompts']:.0f}"
            f" | bare {logs['trace/bare_rollouts']:.0f} | continuations {logs['trace/continuations']:.0f}"
            f" | rows {logs['trace/rows']:.0f} (fill {logs['trace/row_fill']:.2f})"
            f" | reward {logs['trace/reward']:.2f} | loss {logs['loss']:.4f}"
        )


def char_tokenizer(characters: str = CHARACTERS) -> PreTrainedTokenizerFast:
    """One token per character of the task's alphabet."""
    vocabulary = {PAD: 0, EOS: 1, **{c: i + 2 for i, c in enumerate(characters)}}
    model = Tokenizer(models.WordLevel(vocabulary, unk_token=PAD))
    model.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    model.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, pad_token=PAD, eos_token=EOS)
    tokenizer.padding_side = "left"
    return tokenizer


def tiny_llama(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


@contextlib.contextmanager
def service(url: str | None) -> Iterator[str]:
    """The given service, or one in this process on the embedded store (the `service` extra)."""
    if url:
        yield url
        return
    from trace_lab.local import ThreadedService
    from trace_service.app import create_app
    from trace_service.settings import Settings

    settings = Settings(
        store_url="", data_dir="", train_interval_seconds=0.5, torch_threads=1, log_level="ERROR"
    )
    with ThreadedService(create_app(settings)) as live:
        yield live.url


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running trace-rollout service (default: one in this process)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts per step")
    parser.add_argument(
        "--group", type=int, default=8, help="num_generations: rows per prompt in TRL's batch"
    )
    parser.add_argument("--expansion", type=float, default=1.0)
    parser.add_argument("--policy", default="trace", help="trace, or uniform for the baseline")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args(argv)

    torch.manual_seed(options.seed)
    tokenizer = char_tokenizer()
    dataset = Dataset.from_dict({"prompt": [f"q:{digit}" for digit in range(10)]})
    with service(options.url) as url, tempfile.TemporaryDirectory() as output:
        rollout = GuessTheDigit(
            TraceSettings(
                url=url,
                job=f"trl-example-{os.getpid()}",
                expansion=options.expansion,
                max_turns=2,
                policy=options.policy,
            )
        )
        trainer = GRPOTrainer(
            model=tiny_llama(tokenizer),
            reward_funcs=[rollout.trace_advantage],
            args=GRPOConfig(
                output_dir=output,
                per_device_train_batch_size=options.prompts * options.group,
                num_generations=options.group,
                max_steps=options.steps,
                learning_rate=1e-3,
                max_completion_length=16,
                scale_rewards="none",  # the rows' rewards are TRACE's advantages: no rescaling
                logging_steps=1,
                report_to="none",
                save_strategy="no",
                use_cpu=True,
                seed=options.seed,
                disable_tqdm=True,
            ),
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=rollout,
            callbacks=[StepLines()],
        )
        trainer.remove_callback(PrinterCallback)  # StepLines says what matters here
        trainer.train()
    return [entry for entry in trainer.state.log_history if "trace/rows" in entry]


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL; known
    main()
