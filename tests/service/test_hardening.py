"""What a hostile or careless client could do to the service, each case a regression test.

No stuck trees, no 5xx on bad input, bounded work per request, semantics that say what they do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support import make_settings, rollout, running_engine, turn

from trace_lab.local import ThreadedService, free_port
from trace_proto import AllocateRequest, Policy, PromptIn, TreeResponse
from trace_proto.v1 import limits
from trace_service.engine import IdempotencyConflictError

# --- 1. one event must not freeze a tree -----------------------------------------------------------


async def test_an_event_with_unusable_features_is_refused_and_its_tree_goes_on(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        allocation = await engine.allocation.allocate(
            AllocateRequest(
                step=0, budget=4, expansion=1.0, prompts=[PromptIn(prompt_id="a"), PromptIn(prompt_id="b")]
            ),
            None,
        )
        tree_id = allocation.trees[0].tree_id
        first = turn(tree_id, None).model_copy(update={"features": [0.5, 0.25]})
        answer = await engine.intake.expand([first])
        assert answer.accepted == 0
        assert [(r.event_id, r.status) for r in answer.rejected] == [(first.event_id, 422)]
        assert "feature_dim=0" in answer.rejected[0].error
        # The same rollout without features, and the tree's other rollout: Stage 2 runs as usual.
        ends = rollout(tree_id, None, 2, 1.0) + rollout(tree_id, None, 2, 0.0)
        answer = await engine.intake.expand(ends)
        assert answer.accepted == len(ends) and not answer.rejected
        (meta,) = await engine.store.load_metas([tree_id])
        assert sum(i.count for i in answer.instructions) == meta.expansion_budget > 0


async def test_a_stage2_decision_that_fails_falls_back_and_is_counted(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        allocation = await engine.allocation.allocate(
            AllocateRequest(
                step=0, budget=2, expansion=2.0, control_share=0.0, prompts=[PromptIn(prompt_id="p")]
            ),
            None,
        )
        tree = allocation.trees[0]
        # Stored before validation existed: features the predictor cannot use, on the store directly.
        bad = [
            e.model_copy(update={"features": [0.5, 0.25]})
            for j in range(tree.rollouts)
            for e in rollout(tree.tree_id, None, 2, float(j))
        ]
        (batch,) = await engine.store.apply_events(
            [(tree.tree_id, bad)], now=time.time(), success_threshold=0.5, decision_lease=0.0
        )
        assert batch.decision_round == 1
        assert await engine.sweeper.sweep() == 1  # the lapsed claim is decided, by the fallback
        exported = TreeResponse.model_validate_json(await engine.trees.tree(tree.tree_id))
        assert exported.status == "expanding"
        meta = (await engine.store.load_metas([tree.tree_id]))[0]
        assert meta is not None
        assert meta.promised == tree.expansion_budget == meta.fallback
        offered = (await engine.instructions.claim("default", 10)).instructions
        assert sum(i.count for i in offered) == tree.expansion_budget


# --- 2. allocations of any allowed size ------------------------------------------------------------


async def test_an_allocation_of_more_than_eight_thousand_trees_is_listed_and_counted(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        prompts = [PromptIn(prompt_id=f"p{i}") for i in range(8_500)]
        request = AllocateRequest(step=3, budget=17_000, min_rollouts=2, max_rollouts=2, prompts=prompts)
        allocation = await engine.allocation.allocate(request, "key-1")
        assert len(allocation.trees) == 8_500
        stats = await engine.stats.job_stats("default")
        assert [(s.step, s.active, s.prompts) for s in stats.steps] == [(3, 8_500, 8_500)]
        assert await engine.allocation.allocate(request, "key-1") == allocation


# --- 3 and 4. bad input is a clear 4xx, judged event by event -------------------------------------


@pytest.fixture
def http(service: ThreadedService) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, timeout=60) as client:
        yield client


def allocate_one(http: httpx.Client, budget: int = 2) -> str:
    answer = http.post("/v1/allocate", json={"step": 0, "budget": budget, "prompts": [{"prompt_id": "p"}]})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["trees"][0]["tree_id"])


@pytest.mark.parametrize("field", ["step", "max_prompts"])
@pytest.mark.parametrize("value", ["18446744073709551616", "1" + "0" * 400, "-1"])
def test_every_integer_has_a_bound_the_store_can_hold(http: httpx.Client, field: str, value: str) -> None:
    body = f'{{"step": 0, "budget": 2, "prompts": [{{"prompt_id": "p"}}], "{field}": {value}}}'
    answer = http.post("/v1/allocate", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert field in answer.json()["detail"]


def test_the_largest_allowed_step_is_stored(http: httpx.Client) -> None:
    answer = http.post("/v1/allocate", json={"step": 2**53 - 1, "budget": 2, "prompts": [{"prompt_id": "p"}]})
    assert answer.status_code == 200, answer.text
    assert http.get("/v1/jobs/default/stats").json()["steps"][0]["step"] == 2**53 - 1


def post_events(http: httpx.Client, *raw_events: str) -> httpx.Response:
    body = '{"events": [' + ", ".join(raw_events) + "]}"
    return http.post("/v1/expand", content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    ("bad", "label", "reason"),
    [
        # An element that is not readable JSON has no event_id to echo: it is named by its position.
        (
            '{"event_id": "deep", "tree_id": "t", "node_id": "x", "text": ' + "[" * 3000 + "]" * 3000 + "}",
            "events[1]",
            "event: Invalid JSON: recursion limit exceeded",
        ),
        (
            '{"event_id": "\\ud800", "tree_id": "t", "node_id": "x", "done": 5}',
            "events[1]",
            "event: Invalid JSON: unexpected end of hex escape",
        ),
        (
            '{"\\ud800": 1, "event_id": "odd", "tree_id": "t", "node_id": "x"}',
            "events[1]",
            "event: Invalid JSON: unexpected end of hex escape",
        ),
        # Readable JSON with a readable event_id: named by it, the reason names the field.
        (
            '{"event_id": "big", "tree_id": "t", "node_id": "x", "done": true, "reward": 1e999}',
            "big",
            "reward: Input should be a finite number",
        ),
        ("[" * 3000 + "]" * 3000, "events[1]", "event: Invalid JSON: recursion limit exceeded"),
        (
            "12345678901234567890123456789012345678901234567890",
            "events[1]",
            "event: Input should be an object",
        ),
        ("", "events[1]", "event: Invalid JSON: EOF while parsing a value"),
    ],
)
def test_one_bad_event_is_rejected_alone(http: httpx.Client, bad: str, label: str, reason: str) -> None:
    tree_id = allocate_one(http)
    good = json.dumps({"event_id": "ok", "tree_id": tree_id, "node_id": "a"})
    answer = post_events(http, good, bad)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["accepted"] == 1
    [rejected] = body["rejected"]
    assert (rejected["event_id"], rejected["status"]) == (label, 422)
    assert rejected["error"].startswith(reason), rejected["error"]
    tree = http.get(f"/v1/trees/{tree_id}").json()
    assert [n["node_id"] for n in tree["nodes"]] == ["a"]


@pytest.mark.parametrize(
    "body",
    [
        '{"events": [{}], "more": 1}',
        '[{"events": []}]',
        '{"events": []}',
        '{"events": [' + "[" * 3000,
        b"\xff\xfe",
    ],
)
def test_a_body_of_the_wrong_shape_is_a_clear_422(http: httpx.Client, body: str | bytes) -> None:
    answer = http.post("/v1/expand", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"]


# --- 5. bounded work per request, none of it on the event loop -------------------------------------


def test_a_predict_request_over_the_turn_budget_is_refused(http: httpx.Client) -> None:
    histories = [{"prompt_id": f"p{i}", "turns": [{}] * 1024} for i in range(1024)]
    answer = http.post("/v1/predict", json={"histories": histories})
    assert answer.status_code == 422, answer.text[:300]
    assert f"at most {limits.MAX_TURNS_PER_PREDICT} per request" in answer.json()["detail"]


async def test_a_rollout_must_end_by_the_turn_limit_and_still_can(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        request = AllocateRequest(step=0, budget=2, expansion=0.0, prompts=[PromptIn(prompt_id="p")])
        tree = (await engine.allocation.allocate(request, None)).trees[0]
        most = limits.MAX_TURNS_PER_HISTORY
        chain = rollout(tree.tree_id, None, most + 1, 1.0)
        answer = await engine.intake.expand(chain)
        assert answer.accepted == most - 1
        refused = {r.event_id: r for r in answer.rejected}
        assert refused[chain[most - 1].event_id].status == 422
        assert f"turn {most} must end it" in refused[chain[most - 1].event_id].error
        # The worker ends the rollout at the limit instead: the tree goes on to finish.
        ending = chain[most - 1].model_copy(update={"event_id": "end", "done": True, "reward": 1.0})
        other = rollout(tree.tree_id, None, 2, 0.0)
        answer = await engine.intake.expand([ending, *other])
        assert answer.accepted == 3 and answer.completed == [tree.tree_id]


def test_healthz_answers_while_the_heaviest_predict_runs(http: httpx.Client) -> None:
    histories = [
        {"prompt_id": f"p{i}", "prompt_text": "word " * 1500, "turns": [{"text": "a b c d e f"}] * 16}
        for i in range(limits.MAX_TURNS_PER_PREDICT // 16)
    ]
    with ThreadPoolExecutor(1) as pool:
        heavy = pool.submit(http.post, "/v1/predict", json={"histories": histories})
        waits = []
        while not heavy.done():
            start = time.perf_counter()
            assert http.get("/healthz").status_code == 200
            waits.append(time.perf_counter() - start)
            time.sleep(0.01)
        assert heavy.result().status_code == 200
    # 100 ms on an idle machine; the bound leaves room for a loaded CI runner.
    assert len(waits) > 5 and max(waits) < 0.5, sorted(waits)[-5:]


# --- 6. semantics that say what they do ------------------------------------------------------------


async def test_pcl_keeps_to_max_prompts() -> None:
    async with running_engine() as engine:
        prompts = [PromptIn(prompt_id=f"p{i}") for i in range(100)]
        request = AllocateRequest(
            step=0, budget=64, max_rollouts=4, max_prompts=3, policy=Policy.PCL, prompts=prompts
        )
        allocation = await engine.allocation.allocate(request, None)
        assert len(allocation.trees) == 3
        assert all(tree.rollouts == 4 for tree in allocation.trees)


async def test_an_idempotency_key_reused_for_another_request_is_refused() -> None:
    async with running_engine() as engine:
        first = AllocateRequest(step=0, budget=2, prompts=[PromptIn(prompt_id="p")])
        answer = await engine.allocation.allocate(first, "key")
        assert await engine.allocation.allocate(first, "key") == answer
        with pytest.raises(IdempotencyConflictError, match="different request"):
            await engine.allocation.allocate(first.model_copy(update={"budget": 4}), "key")


def test_an_idempotency_conflict_is_a_422(http: httpx.Client) -> None:
    body = {"step": 0, "budget": 2, "prompts": [{"prompt_id": "p"}]}
    assert http.post("/v1/allocate", json=body, headers={"Idempotency-Key": "k"}).status_code == 200
    answer = http.post("/v1/allocate", json={**body, "step": 1}, headers={"Idempotency-Key": "k"})
    assert answer.status_code == 422
    assert "Idempotency-Key" in answer.json()["detail"]


async def test_a_node_reported_again_with_other_content_is_a_conflict(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        request = AllocateRequest(step=0, budget=2, prompts=[PromptIn(prompt_id="p")])
        allocation = await engine.allocation.allocate(request, None)
        first = turn(allocation.trees[0].tree_id, None)
        assert (await engine.intake.expand([first])).accepted == 1
        same = first.model_copy(update={"event_id": "again"})
        assert (await engine.intake.expand([same])).duplicates == 1
        for n, change in enumerate([{"text": "another text"}, {"text": None}]):
            changed = first.model_copy(update={"event_id": f"changed{n}", **change})
            answer = await engine.intake.expand([changed])
            assert [r.status for r in answer.rejected] == [409], answer
        exported = TreeResponse.model_validate_json(await engine.trees.tree(allocation.trees[0].tree_id))
        assert len(exported.nodes) == 1


async def test_job_stats_keep_a_step_after_its_trees_expire(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        allocation = await engine.allocation.allocate(
            AllocateRequest(
                step=0, budget=4, expansion=0.0, prompts=[PromptIn(prompt_id="a"), PromptIn(prompt_id="b")]
            ),
            None,
        )
        first, second = allocation.trees
        events = [e for j in range(first.rollouts) for e in rollout(first.tree_id, None, 2, float(j % 2))]
        events += rollout(second.tree_id, None, 2, 1.0)  # the second tree is still open
        await engine.intake.expand(events)
        before = await engine.stats.job_stats("default")
        assert before.steps[0].trees_complete == 1
        for tree in allocation.trees:  # what their expiry does
            await engine.store.redis.delete(*engine.store.keys.tree(tree.tree_id).all)
        after = await engine.stats.job_stats("default")
        gone = {"rollouts_spent": before.steps[0].rollouts_spent - 1, "turns": before.steps[0].turns - 2}
        assert after.steps == [before.steps[0].model_copy(update=gone)]  # only the open tree's rollout


def test_unknown_query_parameters_are_refused(http: httpx.Client) -> None:
    for path in ("/v1/instructions?maxx=5", "/v1/jobs/default/stats?step=3", "/v1/predictor?verbose=1"):
        answer = http.get(path)
        assert answer.status_code == 422, (path, answer.text)
        assert "unknown query parameter" in answer.json()["detail"]
    assert http.get("/v1/instructions?job=default&max=5").status_code == 200


@pytest.mark.parametrize("value", ["NaN", "Infinity", '[1, {"x": -Infinity}]', "1e999"])
def test_metadata_numbers_must_be_finite(http: httpx.Client, value: str) -> None:
    request = {"step": 0, "budget": 2, "prompts": [{"prompt_id": "p", "metadata": {"m": "VALUE"}}]}
    body = json.dumps(request).replace('"VALUE"', value)
    answer = http.post("/v1/allocate", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text


def test_the_store_unavailable_answer_promises_nothing() -> None:
    with ThreadedService.from_settings(make_settings(f"redis://127.0.0.1:{free_port()}/0")) as live:
        body = {"step": 0, "budget": 2, "prompts": [{"prompt_id": "p"}]}
        answer = httpx.post(f"{live.url}/v1/allocate", json=body, timeout=30)
    assert answer.status_code == 503
    assert "lost" not in answer.json()["detail"]
    assert answer.headers["retry-after"]


async def test_dapo_filters_a_group_whose_rewards_all_agree() -> None:
    async with running_engine() as engine:
        request = AllocateRequest(
            step=0,
            budget=4,
            expansion=2.0,
            policy=Policy.DAPO,
            control_share=0.0,
            prompts=[PromptIn(prompt_id="agree"), PromptIn(prompt_id="mixed")],
        )
        agree, mixed = (await engine.allocation.allocate(request, None)).trees
        answer = await engine.intake.expand(
            [e for j in range(agree.rollouts) for e in rollout(agree.tree_id, None, 2, 1.0)]
        )
        assert answer.instructions == [] and answer.completed == [agree.tree_id]
        answer = await engine.intake.expand(
            [e for j in range(mixed.rollouts) for e in rollout(mixed.tree_id, None, 2, float(j % 2))]
        )
        assert sum(i.count for i in answer.instructions) == mixed.expansion_budget
        meta = (await engine.store.load_metas([agree.tree_id]))[0]
        assert meta is not None and meta.returned == agree.expansion_budget
