"""The transformer as the LM learner's policy (`bench/lm/learn.py`): how it acts on transcripts and is
updated, the driver's agent that samples every rollout's turn in one batch, and the training sequences
of a finished tree."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.advantages import exported_tree_advantages
from bench.lm import vocab
from bench.lm.grpo import pad_batch, token_policy_loss
from bench.lm.model import TinyLM
from bench.lm.tasks import Prompt, Task
from trace_client.driver import FinishedTree, History, TurnResult

#: Seconds the agent waits for the other rollouts' turns before sampling a batch.
BATCH_WINDOW = 0.005
#: What ends a rollout whose transcript the model's context can no longer hold (a failure).
CONTEXT_EXHAUSTED = "context exhausted"


class LMPolicy:
    """The transformer, its optimiser and how it acts on transcripts (`bench.lm.vocab`)."""

    def __init__(self, model: TinyLM, task: Task, *, lr: float, feature_dim: int, seed: int) -> None:
        self.model = model
        self.task = task
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.feature_dim = feature_dim
        self.generator = torch.Generator().manual_seed(seed)

    def fits(self, prefix: Sequence[int]) -> bool:
        """Whether the model's context holds the prefix and the task's longest action after it: a
        transcript that does not ends its rollout as a failure (`CONTEXT_EXHAUSTED`)."""
        return len(prefix) + self.task.max_action_chars + 1 <= self.model.config.max_len

    def act(
        self, prefixes: Sequence[Sequence[int]], *, greedy: bool = False
    ) -> list[tuple[list[int], list[float]]]:
        """One action per prefix: its token ids (ending with EOT unless cut at the task's longest
        action) and the features of the prefix."""
        self.model.eval()
        samples = self.model.sample(
            prefixes,
            max_new_tokens=self.task.max_action_chars + 1,
            stop_id=vocab.EOT,
            generator=self.generator,
            greedy=greedy,
            feature_dim=self.feature_dim,
        )
        return list(zip(samples.tokens, samples.features, strict=True))

    def update(self, sequences: Sequence[TrainingSequence], *, batch: int = 128) -> float:
        """One Adam step on −Σ A·log π(token) / (generated tokens), over every sequence's action tokens;
        minibatches add up to the whole step's gradient (each weighted by its share of the tokens)."""
        self.model.train()
        self.optimizer.zero_grad()
        total = sum(end - start for seq in sequences for start, end in seq.spans)
        if not total:
            return 0.0
        loss_sum = 0.0
        for first in range(0, len(sequences), batch):
            part = sequences[first : first + batch]
            ids, real = (tensor.to(self.model.device) for tensor in pad_batch([seq.ids for seq in part]))
            advantages = torch.zeros(ids.shape, device=ids.device)
            action = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
            for row, seq in enumerate(part):
                for start, end in seq.spans:
                    advantages[row, start:end] = seq.advantage
                    action[row, start:end] = True
            logprobs = self.model.token_logprobs(ids, real)
            tokens = int(action.sum())
            loss = token_policy_loss(logprobs, advantages, action) * (tokens / total)
            loss.backward()
            loss_sum += loss.item()
        self.optimizer.step()
        return loss_sum


@dataclass(frozen=True)
class TrainingSequence:
    """A transcript, the [start, end) token spans of the actions it trains on, and their advantage."""

    ids: list[int]
    spans: tuple[tuple[int, int], ...]
    advantage: float


@dataclass(frozen=True)
class TurnState:
    """What a turn carries for the turns after it and for the update: the action and what the
    environment answered."""

    action: str
    observation: str


#: The turn that ends a rollout whose transcript the model cannot hold any longer (no action).
EXHAUSTED = TurnState("", CONTEXT_EXHAUSTED)


def history_turns(history: History) -> list[tuple[str, str]]:
    turns = []
    for turn in history.turns:
        if not isinstance(turn.state, TurnState):
            raise TypeError("a turn of this history was not made by LMAgent")
        turns.append((turn.state.action, turn.state.observation))
    return turns


class LMAgent:
    """`next_turn` for the driver: the turns of every rollout in flight sampled in one batch."""

    def __init__(self, policy: LMPolicy, prompts: dict[str, Prompt]) -> None:
        self.policy = policy
        self.prompts = prompts
        self.tokens = 0
        self._waiting: list[tuple[History, asyncio.Future[TurnResult]]] = []
        self._batcher: asyncio.Task[None] | None = None

    async def next_turn(self, history: History) -> TurnResult:
        answer: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        self._waiting.append((history, answer))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run())
        return await answer

    async def _run(self) -> None:
        while self._waiting:
            await asyncio.sleep(BATCH_WINDOW)
            batch, self._waiting = self._waiting, []
            try:
                results = await asyncio.to_thread(self._turns, [history for history, _ in batch])
            except Exception as error:  # every rollout of the batch fails alone, none waits forever
                for _, answer in batch:
                    answer.set_exception(error)
                continue
            for (_, answer), result in zip(batch, results, strict=True):
                answer.set_result(result)

    def _turns(self, histories: Sequence[History]) -> list[TurnResult]:
        task = self.policy.task
        contexts = [(self.prompts[h.prompt.prompt_id], history_turns(h)) for h in histories]
        prefixes = [vocab.prefix(prompt.text, turns) for prompt, turns in contexts]
        room = [self.policy.fits(prefix) for prefix in prefixes]
        acted = iter(self.policy.act([prefix for prefix, fits in zip(prefixes, room, strict=True) if fits]))
        results = []
        for (prompt, turns), fits in zip(contexts, room, strict=True):
            if not fits:  # the model cannot read any more of this transcript: it ends, failed
                results.append(TurnResult(text=CONTEXT_EXHAUSTED, done=True, reward=0.0, state=EXHAUSTED))
                continue
            tokens, features = next(acted)
            self.tokens += len(tokens)
            action = vocab.decode(tokens)
            observation = task.step(prompt, [*(a for a, _ in turns), action])
            results.append(
                TurnResult(
                    text=f"{action} -> {observation.text}",
                    done=observation.done,
                    reward=observation.reward,
                    features=features or None,
                    state=TurnState(action, observation.text),
                )
            )
        return results


def training_sequences(
    finished: FinishedTree, prompt: Prompt, *, flat: bool, advantage: str = "service"
) -> list[TrainingSequence]:
    """Every sampled action of a tree with its advantage: the service's tree advantage (or the
    `bench.advantages` variant named), or on a flat group r − mean(group) (= V̂(node) − V̂(root): each
    node lies on one rollout). Failure leaves (no policy turn) and nodes without a scored leaf below are
    left out."""
    tree = finished.tree
    if tree.value is None:
        return []
    variant = None if advantage == "service" else exported_tree_advantages(tree, advantage)
    parent = {node.node_id: node.parent_id for node in tree.nodes}
    sequences = []
    for i, node in enumerate(tree.nodes):
        if node.node_id not in finished.turns or node.value is None:
            continue
        if flat:
            node_advantage: float | None = node.value - tree.value
        else:
            node_advantage = node.advantage if variant is None else float(variant[i])
        if node_advantage is None:
            continue
        path: list[str] = []
        current: str | None = node.node_id
        while current is not None:
            path.append(current)
            current = parent[current]
        turns = [finished.turns[node_id].state for node_id in reversed(path)]
        if not all(isinstance(turn, TurnState) for turn in turns):
            continue
        if turns[-1] == EXHAUSTED:
            continue  # a rollout ended for want of context: no action to train
        transcript = vocab.transcript(prompt.text, [(t.action, t.observation) for t in turns])  # type: ignore[union-attr]
        start, end = transcript.action_spans[-1]
        # Cut after the action: what follows cannot change its log-probabilities, and need not fit.
        sequences.append(TrainingSequence(transcript.ids[:end], ((start, end),), float(node_advantage)))
    return sequences
