"""The agent loop `trace`: one tree per prompt, one bare rollout per verl session; each session returns
the root-to-leaf paths that start at its bare rollout."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from typing import Any

import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from trace_client import AsyncTraceClient
from trace_client.adapters.trajectories import TokenTrajectory, token_trajectories
from trace_client.adapters.verl import path_fields
from trace_client.driver import FinishedTree, History, RolloutDriver, TurnResult, TurnTokens
from trace_client.envs import Environment, EnvironmentWorker, Episode, Move
from trace_client.integrations.verl.manager import TreeTicket
from trace_client.integrations.verl.names import (
    ADVANTAGES_FIELD,
    CONTINUATION_FIELD,
    LEAF_ID_FIELD,
    REWARD_FIELD,
    TREE_FIELD,
    TREE_ID_FIELD,
    TREE_MIXED_FIELD,
    TRUNCATED_FIELD,
    WEIGHTS_FIELDS,
)
from trace_client.integrations.verl.rows import plain_value
from trace_client.integrations.verl.settings import TraceSettings
from trace_proto import PromptIn, TreeNode, TreeResponse


class TraceAgentLoopOutput(AgentLoopOutput):
    """An `AgentLoopOutput` of one root-to-leaf path. `as_dict` (what verl stores) holds the path's
    reward in `rm_scores`, at the last response token as verl's own outputs do, and TRACE's per-token
    advantages (0 off the loss mask) in `trace_advantages`, which the `trace` estimator returns."""

    path_reward: float
    token_advantages: list[float]

    def as_dict(self) -> dict[str, Any]:
        output: dict[str, Any] = super().as_dict()
        advantages = torch.tensor(output.pop("token_advantages"), dtype=torch.float32)
        output[ADVANTAGES_FIELD] = advantages * output["response_mask"]
        # not from reward_score: verl copies a session's last reward_score onto its other outputs,
        # and every path of a session (a bare rollout and its continuations) has its own reward
        reward = output.pop("path_reward")
        rm_scores = torch.zeros_like(output["response_mask"], dtype=torch.float32)
        if len(rm_scores):
            rm_scores[-1] = reward
        output["rm_scores"] = rm_scores
        return output


def path_output(
    trajectory: TokenTrajectory,
    response_length: int,
    *,
    continuation: bool = False,
    tree_mixed: bool = False,
    weights_versions: tuple[int, int] | None = None,
) -> TraceAgentLoopOutput:
    """One root-to-leaf path as verl's agent-loop output, cut to `response_length` tokens.

    `continuation`: the path ends in a Stage 2 continuation; `tree_mixed`: its tree is mixed;
    `weights_versions`: the first and last weights version that generated it (verl's
    `min_global_steps` / `max_global_steps`).
    """
    keep = min(len(trajectory.response_ids), response_length)
    extra_fields: dict[str, Any] = {
        REWARD_FIELD: trajectory.reward,
        LEAF_ID_FIELD: trajectory.leaf_id,
        TREE_ID_FIELD: trajectory.group,
        TREE_MIXED_FIELD: tree_mixed,
        CONTINUATION_FIELD: continuation,
        TRUNCATED_FIELD: len(trajectory.response_ids) - keep,
        # verl copies the last output's reward info onto a session's other outputs
        "reward_extra_info": {},
    }
    if weights_versions is not None:
        extra_fields.update(zip(WEIGHTS_FIELDS, weights_versions, strict=True))
    return TraceAgentLoopOutput(
        **path_fields(trajectory, keep),
        metrics=AgentLoopMetrics(),
        path_reward=trajectory.reward,
        token_advantages=list(trajectory.advantages[:keep]),
        extra_fields=extra_fields,
    )


def continuation_leaves(tree: TreeResponse) -> set[str]:
    """The leaves whose path passes through a Stage 2 continuation (a node an instruction started)."""
    nodes = {node.node_id: node for node in tree.nodes}
    leaves: set[str] = set()
    for leaf in tree.nodes:
        if leaf.reward is None:
            continue
        node: TreeNode | None = leaf
        while node is not None:
            if node.instruction_id is not None:
                leaves.add(leaf.node_id)
                break
            node = nodes.get(node.parent_id) if node.parent_id is not None else None
    return leaves


def session_outputs(
    finished: FinishedTree,
    prompt_ids: Sequence[int],
    response_length: int,
    *,
    weights_versions: tuple[int, int] | None = None,
) -> list[list[TraceAgentLoopOutput]]:
    """The tree's paths as verl outputs, grouped by the bare rollout they start at (in node order)."""
    roots = [node.node_id for node in finished.tree.nodes if node.parent_id is None]
    sessions: list[list[TraceAgentLoopOutput]] = [
        [] for _ in range(max(finished.allocation.rollouts, len(roots)))
    ]
    index = {root: k for k, root in enumerate(roots)}
    continuations = continuation_leaves(finished.tree)
    for trajectory in token_trajectories([finished], lambda _: prompt_ids):
        output = path_output(
            trajectory,
            response_length,
            continuation=trajectory.leaf_id in continuations,
            tree_mixed=finished.tree.mixed,
            weights_versions=weights_versions,
        )
        sessions[index[trajectory.root_id]].append(output)
    return sessions


class _Trees:
    """Per worker process: the trees in flight, each run once however many of its sessions ask."""

    def __init__(self) -> None:
        self.driver: RolloutDriver | None = None
        self.loops: dict[str, TraceAgentLoop] = {}
        self.runs: dict[str, asyncio.Task[list[list[TraceAgentLoopOutput]]]] = {}
        self.sessions_left: dict[str, int] = {}

    async def outputs(
        self, loop: TraceAgentLoop, ticket: TreeTicket, session: int
    ) -> list[TraceAgentLoopOutput]:
        tree_id = ticket.tree.tree_id
        run = self.runs.get(tree_id)
        if run is None:
            driver = self._driver(loop)
            self.loops[tree_id] = loop
            self.sessions_left[tree_id] = ticket.tree.rollouts
            run = self.runs[tree_id] = asyncio.create_task(loop.run_tree(driver, ticket))
        try:
            sessions = await asyncio.shield(run)
            return sessions[session] if session < len(sessions) else []
        finally:
            self.sessions_left[tree_id] -= 1
            if self.sessions_left[tree_id] <= 0:
                for books in (self.loops, self.runs, self.sessions_left):
                    books.pop(tree_id, None)

    def _driver(self, loop: TraceAgentLoop) -> RolloutDriver:
        if self.driver is None:
            settings = loop.trace_settings
            client = AsyncTraceClient(settings.url, token=settings.token or None)
            self.driver = RolloutDriver(
                client,
                self._next_turn,
                score=self._score,
                config=settings.driver_config(),
                on_turn=self._on_turn,
            )
        return self.driver

    async def _next_turn(self, history: History) -> TurnResult:
        loop = self.loops[history.tree_id]
        environments = loop.environment_worker()
        if environments is not None:
            return await environments.next_turn(history)
        return await loop.next_turn(history)

    def _on_turn(self, tree_id: str, node_id: str, turn: TurnResult) -> None:
        loop = self.loops.get(tree_id)
        environments = None if loop is None else loop.environment_worker()
        if environments is not None:
            environments.turn_recorded(tree_id, node_id, turn)

    async def _score(self, history: History) -> float:
        return await self.loops[history.tree_id].score(history)


_TREES = _Trees()


class TraceAgentLoop(AgentLoopBase):
    """verl agent loop `trace`: runs the row's tree (once per prompt) and returns this session's paths.

    The default turn generates at most `trace.turn_tokens` tokens from the server; the rollout ends at
    the end-of-sequence token or when `rollout.response_length` tokens are used. The reward is verl's
    reward function on the decoded response. Subclass and override `next_turn` / `score` (and register
    the subclass in an agent-loop file) for an agent with tools or another reward.

    For an agent acting on a stateful environment (`trace_client.envs`), override `make_environment`
    instead: each turn is then `act(episode)` (by default `trace.turn_tokens` generated tokens, decoded,
    as the action) followed by the observation's tokens, masked out; the reward is the episode's summed
    environment reward; and a continuation restores its node's environment state (by snapshot, or by
    a checked replay) before its first turn.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace_settings = TraceSettings.from_config(self.config)
        self.response_length = int(self.rollout_config.response_length)
        self.sampling_params: dict[str, Any] = {}
        self.row: dict[str, Any] = {}
        self.prompt_ids: list[int] = []
        # the weights versions the inference server reported for this tree's turns
        self.weights_versions: set[int] = set()
        self._reward_fn: Any = None
        self._environments: EnvironmentWorker | None = None

    # verl's TransferQueue worker takes a list (one output per trajectory), though the base annotates one
    async def run(  # type: ignore[override]
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> list[TraceAgentLoopOutput]:
        ticket = TreeTicket.loads(str(plain_value(kwargs[TREE_FIELD])))
        self.sampling_params = dict(sampling_params)
        self.row = {key: plain_value(value) for key, value in kwargs.items()}
        return await _TREES.outputs(self, ticket, int(kwargs["session_id"]))

    async def run_tree(self, driver: RolloutDriver, ticket: TreeTicket) -> list[list[TraceAgentLoopOutput]]:
        self.prompt_ids = await self.build_prompt_ids()
        try:
            finished = await driver.run_tree(ticket.tree, ticket.prompt, job=ticket.job, step=ticket.step)
        finally:
            if self._environments is not None:
                self._environments.close()
        return session_outputs(
            finished, self.prompt_ids, self.response_length, weights_versions=self.tree_weights(ticket)
        )

    def tree_weights(self, ticket: TreeTicket) -> tuple[int, int]:
        """The first and last weights version of the tree's turns; verl's step metrics need them on
        every trajectory. A turn that bypasses verl's server reports none: then the version a sync
        step generates with, the previous step's weights."""
        if self.weights_versions:
            return min(self.weights_versions), max(self.weights_versions)
        return max(ticket.step - 1, 0), max(ticket.step - 1, 0)

    async def build_prompt_ids(self) -> list[int]:
        """The prompt's token ids, through verl's tokenization path (chat template; a prompt longer than
        `rollout.prompt_length` keeps its last tokens, as verl's own loops do)."""
        return list(await self.ct_build_initial_tokens(list(self.row["raw_prompt"])))

    async def next_turn(self, history: History) -> TurnResult:
        """One chunk of generated tokens after the history's turns."""
        used = sum(len(turn.tokens.ids) for turn in history.turns if turn.tokens is not None)
        room = self.response_length - used
        asked = max(1, min(self.trace_settings.turn_tokens, room))
        context = [*self.prompt_ids, *(i for turn in history.turns if turn.tokens for i in turn.tokens.ids)]
        tokens = await self.generate(history.tree_id, context, asked)
        ids = tokens.ids
        tokenizer: Any = self.tokenizer
        eos = tokenizer.eos_token_id
        done = not ids or ids[-1] == eos or len(ids) < asked or used + len(ids) >= self.response_length
        return TurnResult(text=tokenizer.decode(ids, skip_special_tokens=True), done=done, tokens=tokens)

    # --- a stateful environment (override make_environment) -------------------------------------------

    def make_environment(self, prompt: PromptIn) -> Environment:
        """The prompt's environment (`trace_client.envs`), for an agent acting on one; the default loop
        has none."""
        raise NotImplementedError

    def environment_worker(self) -> EnvironmentWorker | None:
        """The tree's environment rollouts when the loop overrides `make_environment`, else None."""
        if type(self).make_environment is TraceAgentLoop.make_environment:
            return None
        if self._environments is None:
            self._environments = EnvironmentWorker(
                self.make_environment,
                self.act,
                max_steps=self.trace_settings.max_turns,
                observation_ids=self.observation_ids,
            )
        return self._environments

    async def act(self, episode: Episode) -> Move:
        """The policy's next action on the environment: at most `trace.turn_tokens` tokens generated
        after the prompt and the episode's tokens so far (the first observation's too, on the first
        turn), decoded."""
        history = episode.history
        if history is None:
            raise ValueError("act needs the episode's history")
        context = [*self.prompt_ids, *(i for turn in history.turns if turn.tokens for i in turn.tokens.ids)]
        if not episode.steps:
            context += self.observation_ids(episode.start)
        tokens = await self.generate(history.tree_id, context, self.trace_settings.turn_tokens)
        tokenizer: Any = self.tokenizer
        return Move(tokenizer.decode(tokens.ids, skip_special_tokens=True), tokens=tokens)

    def observation_ids(self, observation: object) -> list[int]:
        """An observation's token ids, as the next turn's context (masked out of the loss)."""
        tokenizer: Any = self.tokenizer
        return list(tokenizer.encode(str(observation), add_special_tokens=False))

    async def generate(self, tree_id: str, context: Sequence[int], asked: int) -> TurnTokens:
        """At most `asked` tokens after `context` from verl's server, with their log-probabilities."""
        params = {**self.sampling_params, "max_tokens": asked}
        # verl routes by request id (sticky sessions): one tree, one replica, whose prefix cache then
        # serves every continuation branched from the tree's turns
        output = await self.server_manager.generate(
            request_id=tree_id,
            prompt_ids=list(context),
            sampling_params=params,
        )
        self.weights_versions.update(
            int(output.extra_fields[name])
            for name in (*WEIGHTS_FIELDS, "global_steps")
            if output.extra_fields.get(name) is not None
        )
        ids = tuple(int(i) for i in output.token_ids)
        logprobs = tuple(float(x) for x in output.log_probs) if output.log_probs else None
        return TurnTokens(ids, logprobs=logprobs)

    async def score(self, history: History) -> float:
        """verl's reward function on the whole response (`reward.custom_reward_function`, else verl's
        rule-based `default_compute_score` for the row's `data_source`)."""
        ground_truth = (self.row.get("reward_model") or {}).get("ground_truth")
        arguments = (self.row.get("data_source"), self.response_text(history), ground_truth)
        reward = self._reward()
        if inspect.iscoroutinefunction(reward):
            result = await reward(*arguments, extra_info=self.row.get("extra_info"))
        else:  # rule-based scorers (math verification, sandboxes) take a while: off the event loop
            result = await asyncio.to_thread(reward, *arguments, extra_info=self.row.get("extra_info"))
        value = result["score"] if isinstance(result, dict) else result
        return float(value)

    def response_text(self, history: History) -> str:
        """The response decoded in one piece (chunks decoded apart could split a character)."""
        if all(turn.tokens is not None for turn in history.turns):
            tokenizer: Any = self.tokenizer
            ids = [i for turn in history.turns if turn.tokens for i in turn.tokens.ids]
            return str(tokenizer.decode(ids, skip_special_tokens=True))
        return "".join(turn.text or "" for turn in history.turns)

    def _reward(self) -> Any:
        if self._reward_fn is None:
            from verl.trainer.ppo.reward import get_custom_reward_fn
            from verl.utils.reward_score import default_compute_score

            self._reward_fn = get_custom_reward_fn(self.config) or default_compute_score
        return self._reward_fn
