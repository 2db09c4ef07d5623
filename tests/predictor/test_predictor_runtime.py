"""The predictor inside the service: concurrent predictions merged into one forward pass."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import fakeredis
import numpy as np
import pytest
from predictor_synthetic import SyntheticTask, tiny_config
from prometheus_client import CollectorRegistry

from trace_proto import ExpandEvent
from trace_service.metrics import Metrics
from trace_service.predictor import FeaturizerConfig, HistoryFeaturizer, Predictive, Query, SuccessPredictor
from trace_service.predictor.runtime import PredictorRuntime, encode_tree
from trace_service.store import NewTree, TreeStore


def trained_runtime(task: SyntheticTask) -> tuple[PredictorRuntime, list[list[Query]]]:
    predictor = SuccessPredictor(tiny_config())
    rng = np.random.default_rng(0)
    trees = [task.tree(predictor.featurizer, rng, f"p{i}") for i in range(12)]
    for nodes in trees:
        predictor.add_examples(task.examples(nodes))
    predictor.train_round(20)
    runtime = PredictorRuntime(
        "job",
        predictor,
        TreeStore(fakeredis.FakeAsyncRedis()),
        Metrics(CollectorRegistry()),
        owned=True,
        new_predictor=lambda: SuccessPredictor(tiny_config()),
        success_threshold=0.5,
        train_steps=1,
    )
    return runtime, [[node.query for node in nodes] for nodes in trees]


def count_forward_passes(runtime: PredictorRuntime) -> list[int]:
    """Record the size of every batch the runtime sends to the model."""
    sizes: list[int] = []
    original = runtime.predictor.predict_versioned

    def counted(queries: Sequence[Query]) -> tuple[int, Predictive]:
        sizes.append(len(queries))
        return original(queries)

    runtime.predictor.predict_versioned = counted  # type: ignore[method-assign]
    return sizes


async def test_concurrent_calls_share_one_forward_pass_and_each_gets_its_own_values(
    synthetic_task: SyntheticTask,
) -> None:
    runtime, calls = trained_runtime(synthetic_task)
    expected = [runtime.predictor.predict(queries) for queries in calls]
    sizes = count_forward_passes(runtime)
    answers = await asyncio.gather(*(runtime.predict(queries) for queries in calls))
    assert sizes == [sum(len(queries) for queries in calls)]
    for (version, values), want in zip(answers, expected, strict=True):
        assert version == runtime.version > 0
        np.testing.assert_allclose(values, want, rtol=1e-6)


async def test_calls_made_while_a_batch_runs_form_the_next_batch(synthetic_task: SyntheticTask) -> None:
    runtime, calls = trained_runtime(synthetic_task)
    sizes = count_forward_passes(runtime)
    first = asyncio.ensure_future(runtime.predict(calls[0]))
    await asyncio.sleep(0)  # the first batch is on its way to the worker thread
    rest = await asyncio.gather(*(runtime.predict(queries) for queries in calls[1:]))
    await first
    assert sizes == [len(calls[0]), sum(len(queries) for queries in calls[1:])]
    assert [len(values) for _, values in rest] == [len(queries) for queries in calls[1:]]


async def test_a_bad_query_fails_its_own_call_only(synthetic_task: SyntheticTask) -> None:
    runtime, calls = trained_runtime(synthetic_task)
    foreign = HistoryFeaturizer(FeaturizerConfig(num_buckets=7)).encode_prompt("x", "other buckets")
    answers = await asyncio.gather(
        runtime.predict(calls[0]),
        runtime.predict([Query(foreign)]),
        runtime.predict(calls[1]),
        return_exceptions=True,
    )
    assert isinstance(answers[1], ValueError)
    assert "num_buckets=7" in str(answers[1])
    for answer, queries in ((answers[0], calls[0]), (answers[2], calls[1])):
        assert not isinstance(answer, BaseException)
        np.testing.assert_allclose(answer[1], runtime.predictor.predict(queries), rtol=1e-6)


async def test_no_queries_need_no_forward_pass(synthetic_task: SyntheticTask) -> None:
    runtime, _ = trained_runtime(synthetic_task)
    sizes = count_forward_passes(runtime)
    version, values = await runtime.predict([])
    assert (version, values.size, sizes) == (runtime.version, 0, [])


@pytest.mark.parametrize("cancelled", [0, 1])
async def test_a_caller_that_goes_away_does_not_disturb_the_others(
    synthetic_task: SyntheticTask, cancelled: int
) -> None:
    runtime, calls = trained_runtime(synthetic_task)
    tasks = [asyncio.ensure_future(runtime.predict(queries)) for queries in calls[:2]]
    await asyncio.sleep(0)
    tasks[cancelled].cancel()
    kept = tasks[1 - cancelled]
    _, values = await kept
    np.testing.assert_allclose(values, runtime.predictor.predict(calls[1 - cancelled]), rtol=1e-6)
    with pytest.raises(asyncio.CancelledError):
        await tasks[cancelled]


async def test_encoding_part_of_a_tree_gives_those_nodes_and_their_ancestors_the_full_encoding(
    synthetic_task: SyntheticTask,
) -> None:
    runtime, _ = trained_runtime(synthetic_task)
    store = runtime.store
    spec = NewTree(
        tree_id="t", allocation_id="a", job="j", step=0, prompt_id="p", prompt_text="find the key",
        prompt_features=None, rollouts=2, expansion_budget=0, rounds=1, policy="trace",
        predicted_success=0.5, return_unspent=False, prior_outcomes=(0, 0),
    )  # fmt: skip
    await store.create_trees([spec], now=0.0)
    events = [
        ExpandEvent(event_id="e1", tree_id="t", node_id="a1", text="open the door"),
        ExpandEvent(event_id="e2", tree_id="t", node_id="a2", parent_id="a1", text="walk in"),
        ExpandEvent(
            event_id="e3", tree_id="t", node_id="a3", parent_id="a2", text="found", done=True, reward=1
        ),
        ExpandEvent(event_id="e4", tree_id="t", node_id="b1", text="look around", done=True, reward=0),
    ]
    await store.apply_events([("t", events)], now=1.0, success_threshold=0.5, decision_lease=30.0)
    tree = await store.load_tree("t")
    assert tree is not None
    full_root, full = encode_tree(runtime.featurizer, tree)
    index = {node.node_id: i for i, node in enumerate(tree.nodes)}
    root, part = encode_tree(runtime.featurizer, tree, [index["a2"]])
    assert set(part) == {"a1", "a2"}
    assert root.prompt_tokens.tolist() == full_root.prompt_tokens.tolist()
    for node_id, history in part.items():
        assert [ids.tolist() for ids in history.turn_tokens] == [
            ids.tolist() for ids in full[node_id].turn_tokens
        ]
        assert history.turn_token_counts == full[node_id].turn_token_counts
