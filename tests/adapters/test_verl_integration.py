"""`trace_client.integrations.verl` against the installed verl 0.9.1: its estimator registry and advantage
code, its agent-loop output, its reward metrics, its Hydra config, its agent-loop base class and, in the
dry run, its TransferQueue workers, replay buffer, trainer advantage step and step metrics."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from toy_environments import Countdown
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.metric_utils import compute_data_metrics
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl.utils import tensordict_utils as tu
from verl.utils.config import validate_config
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.import_utils import load_class_from_fqn, load_extern_object
from verl.workers.rollout.replica import TokenOutput
from verl_support import compose_config, idle_settings, tree_sessions

from trace_client import TraceClient
from trace_client.driver import History, TurnResult, TurnTokens
from trace_client.envs import Environment
from trace_client.integrations import verl as integration
from trace_client.integrations.verl import agent_loop as verl_agent_loop
from trace_client.integrations.verl import estimator as trace_estimator
from trace_client.integrations.verl import replay_buffer as trace_replay_buffer
from trace_lab import verl_dry_run as dry_run
from trace_lab.local import ThreadedService
from trace_lab.sim import SimConfig, SimWorkload
from trace_proto import PromptIn

pytestmark = pytest.mark.framework


@pytest.fixture(scope="module")
def verl_config() -> DictConfig:
    return compose_config("http://127.0.0.1:1")


# --- the estimator ---------------------------------------------------------------------------------------


def padded(
    sessions: list[list[integration.TraceAgentLoopOutput]],
) -> tuple[DataProto, dict[str, torch.Tensor]]:
    """The outputs as the batch verl's `_compute_advantage` builds from TransferQueue (each row's uid its
    key, as `TraceReplayBuffer` names it), and what TransferQueue holds per key in `trace_advantages`."""
    rows = [output.as_dict() for session in sessions for output in session]
    keys = [f"u_{s}_{k}" for s, session in enumerate(sessions) for k in range(len(session))]
    width = max(len(row["rm_scores"]) for row in rows)

    def pad(name: str) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(row[name], (0, width - len(row[name]))) for row in rows])

    scores = pad("rm_scores")
    data = DataProto.from_dict(
        tensors={
            "token_level_scores": scores,
            "token_level_rewards": scores,
            "response_mask": pad("response_mask"),
            "responses": pad("responses"),
            "prompts": torch.stack([row["prompts"] for row in rows]),
            "prompt_length": torch.tensor([float(len(row["prompts"])) for row in rows]),
            "response_length": torch.tensor([float(len(row["responses"])) for row in rows]),
        },
        non_tensors={"uid": np.array(keys, dtype=object)},
    )
    return data, {key: row[integration.ADVANTAGES_FIELD] for key, row in zip(keys, rows, strict=True)}


@pytest.fixture
def stored_advantages(monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    """Stands in for TransferQueue's `trace_advantages` column: key -> the path's advantages."""
    store: dict[str, torch.Tensor] = {}

    def lookup(keys: Sequence[str]) -> list[torch.Tensor]:
        return [store[key] for key in keys]

    monkeypatch.setattr(trace_estimator, "path_advantages", lookup)
    return store


def test_the_trace_estimator_returns_the_tree_advantages_through_verls_advantage_code(
    stored_advantages: dict[str, torch.Tensor],
) -> None:
    assert core_algos.get_adv_estimator_fn(integration.TRACE) is integration.trace_advantages
    integration.register_trace_estimator()  # a second registration is a no-op, not verl's ValueError
    data, stored = padded(tree_sessions())
    stored_advantages.update(stored)
    keys = list(data.non_tensor_batch["uid"])
    expected = [[0.5, 0.5, 0.0, 0.25], [0.0, 0.0, 0.0, -0.75, -0.75], [-0.5, -0.5, -0.125]]
    for computed in (
        compute_advantage(data, adv_estimator=integration.TRACE),
        compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator=integration.TRACE),
    ):
        rows = [
            row[: len(want)].tolist()
            for row, want in zip(computed.batch["advantages"], expected, strict=True)
        ]
        assert rows == expected
        assert torch.equal(computed.batch["returns"], computed.batch["advantages"])
    # GRPO, verl's default, would have thrown the tree's credit away: one number per path
    data.non_tensor_batch["uid"] = np.array(["u"] * len(keys), dtype=object)
    grpo = compute_advantage(data, adv_estimator=core_algos.AdvantageEstimator.GRPO).batch["advantages"]
    assert len({value for value in grpo[0].tolist() if value}) == 1


def test_the_estimator_looks_up_only_rows_on_the_loss(stored_advantages: dict[str, torch.Tensor]) -> None:
    rewards = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    mask = torch.tensor([[0, 0, 0], [1, 1, 0]])
    stored_advantages["u_0_0"] = torch.tensor([0.5, -0.5, 0.25])
    # verl's padding rows have no loss token, and a uid of verl's own, not a key: no look-up
    advantages, _ = integration.trace_advantages(rewards, mask, index=np.array(["pad1", "u_0_0"]))
    assert advantages.tolist() == [[0.0, 0.0, 0.0], [0.5, -0.5, 0.0]]  # the rewards play no part


def test_rows_not_named_by_the_trace_sampler_are_an_error_that_names_it() -> None:
    with pytest.raises(ValueError, match="TraceReplayBuffer"):
        integration.path_advantages([str(uuid.uuid4())])  # verl's own uid: the sampler did not run


# --- the agent-loop outputs ------------------------------------------------------------------------------


def test_each_session_returns_the_paths_of_its_bare_rollout_with_continuations_as_extra_outputs() -> None:
    first, second = tree_sessions()
    assert [output.extra_fields["trace_leaf_id"] for output in first] == ["n1", "n2"]
    assert [output.extra_fields["trace_leaf_id"] for output in second] == ["n4"]
    assert [output.extra_fields["trace_continuation"] for output in [*first, *second]] == [False, True, False]
    assert all(output.extra_fields["trace_tree_mixed"] for output in [*first, *second])
    # verl's step metrics need the weights versions on every trajectory's tags
    assert (first[1].extra_fields["min_global_steps"], first[1].extra_fields["max_global_steps"]) == (4, 5)
    as_dict = first[1].as_dict()  # verl's own conversion, plus the advantages
    assert as_dict["responses"].tolist() == [10, 11, 12, 14, 15]
    assert as_dict["response_mask"].tolist() == [0, 0, 0, 1, 1]  # the shared prefix trains on path 1
    assert as_dict["trace_advantages"].tolist() == [0.0, 0.0, 0.0, -0.75, -0.75]
    assert as_dict["extra_fields"]["trace_reward"] == 0.0
    # the reward at the last token, as verl's own agent loops write it
    assert first[0].as_dict()["rm_scores"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert as_dict["rm_scores"].tolist() == [0.0] * 5
    # what verl's TransferQueue worker stores: a jagged batch of the session's outputs
    stored = tu.list_of_dict_to_tensordict([output.as_dict() for output in first])
    assert stored["rm_scores"].offsets().diff().tolist() == [4, 5]
    assert stored["trace_advantages"].offsets().diff().tolist() == [4, 5]


def test_each_path_keeps_its_own_reward_where_verl_copies_the_sessions_last(
    stored_advantages: dict[str, torch.Tensor],
) -> None:
    first, second = tree_sessions()
    # what `_agent_loop_postprocess` does to a session's outputs before it stores them
    for output in first[:-1]:
        output.reward_score = first[-1].reward_score
    data, stored = padded([first, second])
    assert [row.sum().item() for row in data.batch["token_level_scores"]] == [1.0, 0.0, 0.0]
    stored_advantages.update(stored)
    data = compute_advantage(data, adv_estimator=integration.TRACE)
    data.non_tensor_batch["__num_turns__"] = np.ones(len(data), dtype=np.int32)
    # verl's reward panels: the leaf rewards (1, 0, 0), not the advantages' sums (1.25, -1.5, -1.125)
    panels = compute_data_metrics(batch=data, use_critic=False)
    for name in ("score", "rewards"):
        assert panels[f"critic/{name}/mean"] == pytest.approx(1 / 3)
        assert (panels[f"critic/{name}/max"], panels[f"critic/{name}/min"]) == (1.0, 0.0)
    assert panels["critic/advantages/max"] == pytest.approx(0.5)
    assert panels["critic/advantages/min"] == pytest.approx(-0.75)


def test_a_path_longer_than_the_response_length_is_cut_to_it() -> None:
    first, _ = tree_sessions(response_length=4)
    cut = first[1]
    assert cut.response_ids == [10, 11, 12, 14]
    assert len(cut.response_mask) == len(cut.token_advantages) == 4
    assert cut.extra_fields["trace_truncated"] == 1
    assert first[0].extra_fields["trace_truncated"] == 0
    assert cut.as_dict()["rm_scores"].tolist() == [0.0, 0.0, 0.0, cut.path_reward]


# --- configuration ---------------------------------------------------------------------------------------


def test_the_overrides_compose_with_verls_own_trainer_config(verl_config: DictConfig) -> None:
    assert verl_config.trainer.use_v1 is True
    assert verl_config.algorithm.adv_estimator == integration.TRACE
    manager = verl_config.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    assert manager == "trace_client.integrations.verl.TraceAgentLoopManager"
    assert Path(verl_config.actor_rollout_ref.rollout.agent.agent_loop_config_path).is_file()
    # how verl's trainer loads a custom sampler (`load_extern_type`, an alias of this)
    sampler = verl_config.trainer.v1.sampler.custom_sampler
    assert load_extern_object(sampler.path, sampler.name) is integration.TraceReplayBuffer
    settings = integration.TraceSettings.from_config(verl_config)
    assert (settings.url, settings.expansion) == ("http://127.0.0.1:1", 1.0)
    batch_size, n = verl_config.data.train_batch_size, verl_config.actor_rollout_ref.rollout.n
    assert settings.batch_budget(verl_config, batch_size) == batch_size * n
    with pytest.raises(ValueError, match="unknown trace setting"):
        integration.trace_overrides(budgett=3)
    with pytest.raises(ValueError, match="unknown trainer mode"):
        integration.trace_overrides(mode="async")
    assert integration.trace_overrides(budget=None)[-1] == "++trace.budget=null"


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_an_asynchronous_mode_samples_with_the_async_trace_buffer(mode: str) -> None:
    config = compose_config("http://127.0.0.1:1", mode=mode)
    assert config.trainer.v1.trainer_mode == mode
    sampler = config.trainer.v1.sampler.custom_sampler
    assert load_extern_object(sampler.path, sampler.name) is trace_replay_buffer.TraceReplayBufferAsync
    assert config.trainer.v1[mode].num_warmup_batches == 1  # verl's own mode settings came along


def test_a_batch_of_another_size_than_the_step_gets_its_share_of_the_budget(verl_config: DictConfig) -> None:
    batch_size = verl_config.data.train_batch_size
    for min_rollouts in (2, 4):
        settings = integration.TraceSettings(budget=96, min_rollouts=min_rollouts)
        assert settings.batch_budget(verl_config, batch_size) == 96
        assert settings.batch_budget(verl_config, 2 * batch_size) == 192  # a warm-up batch and the step's
        assert settings.batch_budget(verl_config, batch_size // 2) == 48
        # a refill of one evicted group: at least a group's worth, so that it is not skipped outright
        assert settings.batch_budget(verl_config, 1) == max(min_rollouts, round(96 / batch_size))


def test_the_job_is_named_after_the_experiment_in_the_services_alphabet(verl_config: DictConfig) -> None:
    settings = integration.TraceSettings()
    for experiment, job in [
        ("qwen3/gsm8k trace", "qwen3-gsm8k-trace"),
        ("_run", "verl-_run"),
        ("über" * 50, ("verl-" + "-ber" * 50)[:128]),
    ]:
        config = compose_config("http://127.0.0.1:1", f"trainer.experiment_name='{experiment}'")
        assert settings.job_name(config) == job
    assert integration.TraceSettings(job="mine").job_name(verl_config) == "mine"


def test_the_example_recipe_is_verls_config_with_trace_switched_on(byte_model: Path) -> None:
    recipe = Path(__file__).parents[2] / "examples" / "verl"
    given = [
        "trace.url=http://trace:8000",
        "trace.budget=96",
        f"actor_rollout_ref.model.path={byte_model}",
        "actor_rollout_ref.rollout.name=vllm",
        "data.train_files=train.parquet",
        "data.val_files=test.parquet",
    ]
    with initialize_config_dir(config_dir=str(recipe), version_base=None):
        config = compose("trace_grpo", overrides=given)
    # what verl's main_ppo checks before it starts anything, and how TaskRunnerV1 loads the manager
    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    manager = config.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    assert load_class_from_fqn(manager, "AgentLoopManager") is integration.TraceAgentLoopManager
    overridden = compose_config("http://trace:8000", "++trace.budget=96")
    for key in (
        "trainer.use_v1",
        "trainer.v1.trainer_mode",
        "trainer.v1.sampler.custom_sampler",
        "algorithm.adv_estimator",
        "algorithm.use_kl_in_reward",
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class",
        "actor_rollout_ref.rollout.n",  # and the rest of verl's defaults came along
    ):
        assert OmegaConf.select(config, key) == OmegaConf.select(overridden, key), key
    settings = integration.TraceSettings.from_config(config)
    assert (settings.url, settings.batch_budget(config, config.data.train_batch_size)) == (
        "http://trace:8000",
        96,
    )


def test_prompt_ids_stay_the_same_across_steps() -> None:
    row = {"data_source": "gsm8k", "index": np.int64(7), "raw_prompt": [{"role": "user", "content": "2+2?"}]}
    assert integration.stable_prompt_id(row) == "gsm8k:7"
    assert integration.stable_prompt_id(row, "index") == "7"
    hashed = integration.stable_prompt_id({"raw_prompt": row["raw_prompt"]})
    assert hashed == integration.stable_prompt_id({"raw_prompt": list(row["raw_prompt"])})
    assert hashed.startswith("sha1:")


def test_a_batch_gets_per_prompt_rollout_counts_from_the_allocation(verl_config: DictConfig) -> None:
    workload = SimWorkload(SimConfig(prompts=32), seed=1)
    prompts = workload.epoch_pool(0, 12)
    batch = tu.get_tensordict(
        {
            "raw_prompt": [[{"role": "user", "content": p.text}] for p in [*prompts, prompts[0]]],
            "data_source": ["sim"] * (len(prompts) + 1),
            "index": [p.prompt_id for p in [*prompts, prompts[0]]],  # the last row repeats the first
            "uid": [str(uuid.uuid4()) for _ in range(len(prompts) + 1)],
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", 3)
    with ThreadedService.from_settings(idle_settings()) as live, TraceClient(live.url) as client:
        config = compose_config(
            live.url, "++trace.budget=8", "++trace.job=verl-batch", f"data.train_batch_size={len(batch)}"
        )
        allocation = integration.annotate_batch(batch, config, client)
    counts = batch[integration.ROLLOUT_N_FIELD].tolist()
    trees = {t.prompt.prompt_id: t.tree for t in allocation.tickets if t is not None}
    assert sum(counts) == 8 and 0 < len(trees) < len(prompts)  # a real choice: some prompts skipped
    assert counts[-1] == 0  # a repeated prompt runs once
    for row, ticket in enumerate(allocation.tickets):
        assert counts[row] == (0 if ticket is None else ticket.tree.rollouts)
        assert ticket is None or (ticket.job, ticket.step) == ("verl-batch", 3)
        agent = batch[integration.AGENT_NAME_FIELD][row]
        assert agent == ("single_turn_agent" if ticket is None else integration.TRACE)
    assert allocation.prompt_ids == [f"sim:{p.prompt_id}" for p in [*prompts, prompts[0]]]
    ticket = next(t for t in allocation.tickets if t is not None)
    assert integration.TreeTicket.loads(ticket.dumps()) == ticket
    figures = trace_replay_buffer.AllocationFigures.of(allocation.response).metrics()
    assert figures["trace/prompts"] == len(prompts)  # distinct prompts: the repeated row is one
    assert figures["trace/skipped_prompts"] == len(prompts) - len(trees)
    assert figures["trace/bare_rollouts_promised"] == 8
    assert figures["trace/continuations_promised"] == sum(tree.expansion_budget for tree in trees.values())
    assert figures["trace/predictor/version"] == allocation.response.predictor_version


# --- the default turn and reward --------------------------------------------------------------------------


class ScriptedServer:
    """verl's LLM server client, answering from a script; records each request."""

    def __init__(self, answers: list[list[int]]) -> None:
        self.answers = answers
        self.requests: list[dict[str, Any]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> TokenOutput:
        self.requests.append({"prompt_ids": prompt_ids, **sampling_params})
        return TokenOutput(token_ids=self.answers.pop(0), log_probs=None)


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dry_run.write_byte_model(tmp_path_factory.mktemp("byte-model"))


def agent_loop(byte_model: Path, server: ScriptedServer, *overrides: str) -> integration.TraceAgentLoop:
    config = compose_config("http://127.0.0.1:1", *overrides, model_dir=byte_model)
    return integration.TraceAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=AutoTokenizer.from_pretrained(byte_model),
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
    )


async def test_the_default_turn_is_a_chunk_of_tokens_until_the_end_of_sequence(
    byte_model: Path,
) -> None:
    eos = AutoTokenizer.from_pretrained(byte_model).eos_token_id
    server = ScriptedServer([[40, 41, 42], [43, eos]])
    loop = agent_loop(byte_model, server, "++trace.turn_tokens=3")
    loop.row = {"raw_prompt": [{"role": "user", "content": "Say it."}]}
    loop.sampling_params = {"temperature": 1.0}
    loop.prompt_ids = await loop.build_prompt_ids()
    history = History(PromptIn(prompt_id="p"), tree_id="t")
    first = await loop.next_turn(history)
    second = await loop.next_turn(history.then(first))
    assert (first.done, second.done) == (False, True)
    assert first.tokens is not None and first.tokens.ids == (40, 41, 42)
    assert server.requests[0]["max_tokens"] == 3 and server.requests[0]["temperature"] == 1.0
    assert server.requests[1]["prompt_ids"] == [*loop.prompt_ids, 40, 41, 42]  # continues after turn 1


class CountdownLoop(integration.TraceAgentLoop):
    def make_environment(self, prompt: PromptIn) -> Environment:
        return Countdown()


async def test_a_loop_with_an_environment_acts_on_it_and_its_tokens_go_on_with_the_observation(
    byte_model: Path,
) -> None:
    server = ScriptedServer([[40, 41], [42]])
    config = compose_config("http://127.0.0.1:1", "++trace.turn_tokens=2", model_dir=byte_model)
    tokenizer = AutoTokenizer.from_pretrained(byte_model)
    loop = CountdownLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
    )
    loop.row = {"raw_prompt": [{"role": "user", "content": "Count."}]}
    loop.prompt_ids = await loop.build_prompt_ids()
    trees = verl_agent_loop._Trees()
    trees.loops["t"] = loop  # what a tree's first session does; the driver calls the books' next_turn
    history = History(PromptIn(prompt_id="p"), tree_id="t")
    while history.last_turn is None or not history.last_turn.done:
        history = history.then(await trees._next_turn(history))
    assert history.depth == 2 and history.turns[-1].reward == 1.0

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False))

    first, second = (turn.tokens for turn in history.turns)
    assert first is not None and second is not None
    assert first.ids == (*ids("2"), 40, 41, *ids("1"))  # the first observation, the action, the answer
    assert first.mask == (0,) * len(ids("2")) + (1, 1) + (0,) * len(ids("1"))
    assert second.ids == (42, *ids("0"))
    assert server.requests[0]["prompt_ids"] == [*loop.prompt_ids, *ids("2")]
    assert server.requests[1]["prompt_ids"] == [*loop.prompt_ids, *first.ids]


async def test_a_prompt_longer_than_the_prompt_length_keeps_its_last_tokens(byte_model: Path) -> None:
    messages = [{"role": "user", "content": "filler " * 8 + "What is 6 times 7?"}]
    whole = agent_loop(byte_model, ScriptedServer([]))
    whole.row = {"raw_prompt": messages}
    full = await whole.build_prompt_ids()
    capped = agent_loop(byte_model, ScriptedServer([]), "actor_rollout_ref.rollout.prompt_length=16")
    capped.row = {"raw_prompt": messages}
    # verl's tokenization path left-truncates, as for its own agent loops
    assert len(full) > 16 and await capped.build_prompt_ids() == full[-16:]


async def test_a_rollout_ends_when_the_response_length_is_used(byte_model: Path) -> None:
    server = ScriptedServer([[50, 51, 52], [53, 54]])
    loop = agent_loop(
        byte_model, server, "++trace.turn_tokens=3", "actor_rollout_ref.rollout.response_length=5"
    )
    loop.row = {"raw_prompt": [{"role": "user", "content": "Go on."}]}
    first = await loop.next_turn(History(PromptIn(prompt_id="p"), tree_id="t"))
    second = await loop.next_turn(History(PromptIn(prompt_id="p"), tree_id="t", turns=(first,)))
    assert server.requests[1]["max_tokens"] == 2  # only what the response length has left
    assert second.done


async def test_the_default_reward_is_verls_rule_based_score(byte_model: Path) -> None:
    loop = agent_loop(byte_model, ScriptedServer([]))
    loop.row = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "42"}}
    prompt = History(PromptIn(prompt_id="p"), tree_id="t")
    tokenizer = AutoTokenizer.from_pretrained(byte_model)

    def turn(text: str, done: bool = False) -> TurnResult:
        return TurnResult(text=text, done=done, tokens=TurnTokens(tuple(tokenizer.encode(text))))

    # "é" is two bytes, cut across two turns: only the whole response decodes to the answer
    cut = tokenizer.encode("é")
    right = (
        prompt.then(turn("6 times 7 is "))
        .then(TurnResult(text="?", tokens=TurnTokens((cut[0],))))
        .then(TurnResult(text="?", done=True, tokens=TurnTokens((cut[1], *tokenizer.encode(" #### 42")))))
    )
    assert loop.response_text(right) == "6 times 7 is é #### 42"
    assert await loop.score(right) == 1.0
    assert await loop.score(prompt.then(turn("#### 41", done=True))) == 0.0
    assert await loop.score(prompt.then(TurnResult(text="#### 42", done=True))) == 1.0  # text only
