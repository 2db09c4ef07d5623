"""Validation rules of the v1 models: each rule with inputs that pass and inputs that fail clearly."""

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from trace_proto import (
    API_VERSION,
    AllocateRequest,
    AllocateResponse,
    ErrorResponse,
    ExpandEvent,
    ExpandRequest,
    ExpandResponse,
    Health,
    HistoryIn,
    InstructionsQuery,
    JobStats,
    Policy,
    PredictorInfo,
    PredictRequest,
    PromptIn,
    StepStats,
    TreeAllocation,
    TreeNode,
    TreeResponse,
    TurnIn,
    limits,
)


def allocate_request(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"step": 3, "budget": 16, "prompts": [{"prompt_id": "p1"}, {"prompt_id": "p2"}]}
    return body | overrides


def error_messages(error: pytest.ExceptionInfo[ValidationError]) -> str:
    return " | ".join(f"{'.'.join(map(str, item['loc']))}: {item['msg']}" for item in error.value.errors())


def test_allocate_request_defaults_match_the_contract() -> None:
    request = AllocateRequest.model_validate(allocate_request())
    assert request.job == "default"
    assert request.expansion == 1.0  # chosen on the learners (bench/README.md)
    assert (request.min_rollouts, request.max_rollouts, request.max_prompts) == (2, 64, None)
    assert request.policy is Policy.TRACE
    assert request.rounds == 1
    assert request.return_unspent is False


def test_policies_are_the_documented_set() -> None:
    assert {policy.value for policy in Policy} == {
        "trace",
        "uniform",
        "dapo",
        "greso",
        "pcl",
        "knapsack",
        "treepo",
        "trace_root",
        "trace_prefix",
        "trace_paper",
        "trace_joint",
        "trace_shared",
    }
    for policy in Policy:
        assert f"`{policy.value}`" in (Policy.__doc__ or ""), f"policy {policy.value} is undocumented"


def test_allocate_request_accepts_a_full_request() -> None:
    request = AllocateRequest.model_validate(
        allocate_request(
            job="run-7.b_2",
            budget=0,
            expansion=0,
            min_rollouts=4,
            max_rollouts=4,
            max_prompts=1,
            policy="trace_prefix",
            rounds=limits.MAX_ROUNDS,
            return_unspent=True,
            prompts=[
                {"prompt_id": "a", "text": "", "features": [0.5, -1], "metadata": {"source": ["x", 1]}},
                {"prompt_id": "b", "features": [1.0, 2.0]},
            ],
        )
    )
    assert request.policy is Policy.TRACE_PREFIX
    assert request.prompts[0].features == [0.5, -1.0]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"step": -1}, "step: Input should be greater than or equal to 0"),
        ({"step": "5"}, "step: Input should be a valid integer"),
        ({"step": True}, "step: Input should be a valid integer"),
        ({"step": 1.5}, "step: Input should be a valid integer"),
        ({"budget": -1}, "budget: Input should be greater than or equal to 0"),
        (
            {"budget": limits.MAX_BUDGET + 1},
            f"budget: Input should be less than or equal to {limits.MAX_BUDGET}",
        ),
        ({"expansion": -0.5}, "expansion: Input should be greater than or equal to 0"),
        ({"expansion": math.nan}, "expansion: Input should be a finite number"),
        ({"expansion": limits.MAX_EXPANSION + 1}, "expansion: Input should be less than or equal to"),
        ({"min_rollouts": 1}, "min_rollouts: Input should be greater than or equal to 2"),
        ({"max_rollouts": limits.MAX_ROLLOUTS_PER_PROMPT + 1}, "max_rollouts: Input should be less than"),
        ({"min_rollouts": 9, "max_rollouts": 8}, "min_rollouts (9) exceeds max_rollouts (8)"),
        ({"max_prompts": 0}, "max_prompts: Input should be greater than or equal to 1"),
        ({"rounds": 0}, "rounds: Input should be greater than or equal to 1"),
        ({"control_share": -0.1}, "control_share: Input should be greater than or equal to 0"),
        ({"control_share": 1.5}, "control_share: Input should be less than or equal to 1"),
        ({"control_share": math.nan}, "control_share: Input should be a finite number"),
        ({"rounds": limits.MAX_ROUNDS + 1}, "rounds: Input should be less than or equal to"),
        ({"return_unspent": "yes"}, "return_unspent: Input should be a valid boolean"),
        ({"policy": "greedy"}, "policy: Input should be 'trace', 'uniform'"),
        ({"job": "a/b"}, "job: String should match pattern"),
        ({"job": ""}, "job: String should match pattern"),
        ({"job": "x" * 129}, "job: String should match pattern"),
        ({"prompts": []}, "prompts: List should have at least 1 item"),
        ({"budgit": 3}, "budgit: Extra inputs are not permitted"),
        ({"prompts": [{"prompt_id": ""}]}, "prompts.0.prompt_id: String should have at least 1 character"),
        (
            {"prompts": [{"prompt_id": "x" * (limits.MAX_ID_LENGTH + 1)}]},
            f"prompts.0.prompt_id: String should have at most {limits.MAX_ID_LENGTH} characters",
        ),
        (
            {"prompts": [{"prompt_id": "a", "text": "w" * (limits.MAX_TEXT_LENGTH + 1)}]},
            f"prompts.0.text: String should have at most {limits.MAX_TEXT_LENGTH} characters",
        ),
        (
            {"prompts": [{"prompt_id": "a", "features": []}]},
            "prompts.0.features: List should have at least 1",
        ),
        (
            {"prompts": [{"prompt_id": "a", "features": [1.0, math.inf]}]},
            "prompts.0.features.1: Input should be",
        ),
        (
            {"prompts": [{"prompt_id": "a", "features": ["1"]}]},
            "prompts.0.features.0: Input should be a valid",
        ),
        ({"prompts": [{"prompt_id": "a", "colour": 1}]}, "prompts.0.colour: Extra inputs are not permitted"),
        (
            {"prompts": [{"prompt_id": "a"}, {"prompt_id": "b"}, {"prompt_id": "a"}, {"prompt_id": "b"}]},
            "prompt_id values must be unique within a request; repeated: ['a', 'b']",
        ),
        (
            {"prompts": [{"prompt_id": "a", "features": [1.0]}, {"prompt_id": "b", "features": [1.0, 2.0]}]},
            "every prompt's features must have the same length; got lengths [1, 2]",
        ),
    ],
)
def test_allocate_request_rejects_bad_input_with_a_clear_message(
    overrides: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ValidationError) as error:
        AllocateRequest.model_validate(allocate_request(**overrides))
    assert expected in error_messages(error)


def test_allocate_request_limits_the_pool_size() -> None:
    pool = [{"prompt_id": f"p{index}"} for index in range(limits.MAX_PROMPTS_PER_REQUEST)]
    assert len(AllocateRequest.model_validate(allocate_request(prompts=pool)).prompts) == len(pool)
    with pytest.raises(ValidationError, match="List should have at most"):
        AllocateRequest.model_validate(allocate_request(prompts=[*pool, {"prompt_id": "one-more"}]))


def test_json_non_finite_numbers_are_rejected() -> None:
    with pytest.raises(ValidationError, match="finite number"):
        AllocateRequest.model_validate_json(
            '{"step": 0, "budget": 4, "prompts": [{"prompt_id": "a", "features": [NaN]}]}'
        )


def test_requests_are_immutable() -> None:
    request = AllocateRequest.model_validate(allocate_request())
    with pytest.raises(ValidationError, match="frozen"):
        request.budget = 99  # type: ignore[misc]


def test_allocate_request_takes_integral_floats_as_integers() -> None:
    """JSON Schema's "integer" includes 4.0, so the request's integers do too (a JSON encoder may write
    any number with a fraction); 4.5 stays an error (above)."""
    request = AllocateRequest.model_validate_json(json.dumps(allocate_request(step=3.0, budget=3959.0)))
    assert (request.step, request.budget) == (3, 3959)
    assert isinstance(request.budget, int)


def event(**overrides: Any) -> dict[str, Any]:
    return {"event_id": "e1", "tree_id": "t1", "node_id": "n1"} | overrides


def test_expand_event_defaults_to_a_first_unfinished_turn() -> None:
    turn = ExpandEvent.model_validate(event())
    assert (turn.parent_id, turn.done, turn.reward, turn.text, turn.instruction_id) == (
        None,
        False,
        None,
        None,
        None,
    )


def test_expand_event_leaf_carries_its_reward() -> None:
    leaf = ExpandEvent.model_validate(event(parent_id="n0", done=True, reward=0, instruction_id="i1"))
    assert leaf.reward == 0.0


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"done": True}, "event 'e1': a turn with done=true needs a reward"),
        ({"reward": 1.0}, "event 'e1': reward is only allowed on a turn that ends the rollout (done=true)"),
        ({"done": False, "reward": 0.0}, "reward is only allowed on a turn that ends the rollout"),
        ({"done": True, "reward": math.nan}, "reward: Input should be a finite number"),
        ({"done": "true", "reward": 1.0}, "done: Input should be a valid boolean"),
        ({"parent_id": "n1"}, "event 'e1': node 'n1' cannot be its own parent"),
        ({"event_id": ""}, "event_id: String should have at least 1 character"),
        ({"features": [math.inf]}, "features.0: Input should be a finite number"),
        ({"seq": 3}, "seq: Extra inputs are not permitted"),
    ],
)
def test_expand_event_rejects_bad_input_with_a_clear_message(
    overrides: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ValidationError) as error:
        ExpandEvent.model_validate(event(**overrides))
    assert expected in error_messages(error)


def test_expand_request_bounds_the_batch() -> None:
    with pytest.raises(ValidationError, match="at least 1 item"):
        ExpandRequest(events=[])
    one = ExpandEvent.model_validate(event())
    assert (
        len(ExpandRequest(events=[one] * limits.MAX_EVENTS_PER_REQUEST).events)
        == limits.MAX_EVENTS_PER_REQUEST
    )
    with pytest.raises(ValidationError, match="at most"):
        ExpandRequest(events=[one] * (limits.MAX_EVENTS_PER_REQUEST + 1))


def test_instructions_query_parses_query_strings_and_bounds_max() -> None:
    assert InstructionsQuery.model_validate({"job": "j", "max": "5"}).max == 5
    assert InstructionsQuery().max == limits.DEFAULT_CLAIM
    for bad in (0, limits.MAX_CLAIM + 1):
        with pytest.raises(ValidationError, match="max"):
            InstructionsQuery(max=bad)


def allocate_response(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "allocation_id": "a1",
        "job": "default",
        "step": 0,
        "policy": "trace",
        "predictor_version": 2,
        "trees": [
            {
                "prompt_id": "p1",
                "tree_id": "t1",
                "rollouts": 4,
                "expansion_budget": 8,
                "predicted_success": 0.4,
            },
            {
                "prompt_id": "p2",
                "tree_id": "t2",
                "rollouts": 3,
                "expansion_budget": 6,
                "predicted_success": 0.6,
            },
        ],
        "skipped": [{"prompt_id": "p3", "predicted_success": 0.99}],
        "expected_mixed": 1.2,
        "budget": 10,
    }
    return body | overrides


def test_allocate_response_derives_unspent_and_ignores_a_sent_one() -> None:
    response = AllocateResponse.model_validate(allocate_response(unspent=999, added_in_v1_1="ignored"))
    assert response.unspent == 10 - (4 + 3)
    assert response.model_dump()["unspent"] == 3


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"budget": 6}, "trees hold 7 rollouts, more than the budget 6"),
        (
            {"skipped": [{"prompt_id": "p1", "predicted_success": 0.5}]},
            "a prompt appears more than once in trees and skipped: ['p1']",
        ),
        (
            {
                "trees": [
                    {
                        "prompt_id": "a",
                        "tree_id": "t",
                        "rollouts": 2,
                        "expansion_budget": 0,
                        "predicted_success": 0,
                    },
                    {
                        "prompt_id": "b",
                        "tree_id": "t",
                        "rollouts": 2,
                        "expansion_budget": 0,
                        "predicted_success": 0,
                    },
                ]
            },
            "tree_id values must be unique; repeated: ['t']",
        ),
        (
            {
                "trees": [
                    {
                        "prompt_id": "a",
                        "tree_id": "t",
                        "rollouts": 0,
                        "expansion_budget": 0,
                        "predicted_success": 0,
                    }
                ]
            },
            "trees.0.rollouts: Input should be greater than or equal to 1",
        ),
        (
            {"skipped": [{"prompt_id": "x", "predicted_success": 1.5}]},
            "predicted_success: Input should be less than",
        ),
        ({"expected_mixed": -0.1}, "expected_mixed: Input should be greater than or equal to 0"),
    ],
)
def test_allocate_response_rejects_inconsistent_answers(overrides: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError) as error:
        AllocateResponse.model_validate(allocate_response(**overrides))
    assert expected in error_messages(error)


def test_responses_accept_numpy_scalars() -> None:
    tree = TreeAllocation(
        prompt_id="p",
        tree_id="t",
        rollouts=np.int64(3),  # type: ignore[arg-type]
        expansion_budget=np.int64(6),  # type: ignore[arg-type]
        predicted_success=np.float64(0.25),
    )
    assert tree.model_dump_json() == (
        '{"prompt_id":"p","tree_id":"t","rollouts":3,"expansion_budget":6,"predicted_success":0.25,'
        '"control":false}'
    )


def test_expand_response_tolerates_new_fields() -> None:
    body = {"accepted": 1, "duplicates": 0, "rejected": [], "instructions": [], "completed": [], "later": 1}
    assert ExpandResponse.model_validate(body).accepted == 1


def tree_node(node_id: str, parent_id: str | None, **overrides: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "node_id": node_id,
        "parent_id": parent_id,
        "depth": 1 if parent_id is None else 2,
        "visits": 2,
        "successes": 1,
        "value": 0.5,
        "predicted": None,
        "advantage": None,
        "reward": None,
        "instruction_id": None,
    }
    return node | overrides


def tree(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "tree_id": "t1",
        "prompt_id": "p1",
        "job": "default",
        "step": 0,
        "status": "complete",
        "mixed": True,
        "rollouts": 2,
        "expansion_budget": 4,
        "value": 0.5,
        "nodes": nodes,
    }


def test_tree_response_accepts_a_consistent_tree() -> None:
    parsed = TreeResponse.model_validate(tree([tree_node("a", None), tree_node("b", "a", reward=1.0)]))
    assert [node.node_id for node in parsed.nodes] == ["a", "b"]


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([tree_node("a", None), tree_node("a", None)], "node_id values must be unique; repeated: ['a']"),
        ([tree_node("b", "missing")], "nodes whose parent is not in the tree: ['b']"),
        ([tree_node("a", None, successes=3)], "node 'a': successes (3) exceed visits (2)"),
        ([tree_node("a", None, depth=0)], "depth: Input should be greater than or equal to 1"),
        ([tree_node("a", None, value=1.2)], "value: Input should be less than or equal to 1"),
    ],
)
def test_tree_response_rejects_inconsistent_trees(nodes: list[dict[str, Any]], expected: str) -> None:
    with pytest.raises(ValidationError) as error:
        TreeResponse.model_validate(tree(nodes))
    assert expected in error_messages(error)


def test_tree_node_status_is_an_enum() -> None:
    with pytest.raises(ValidationError, match="status"):
        TreeResponse.model_validate(tree([]) | {"status": "done"})
    assert TreeNode.model_validate(tree_node("a", None)).depth == 1


def step_stats(**overrides: Any) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "step": 0,
        "prompts": 10,
        "active": 8,
        "skipped": 2,
        "trees_complete": 6,
        "mixed": 5,
        "budget_promised": 64,
        "rollouts_spent": 60,
        "continuations_promised": 128,
        "continuations_spent": 100,
        "fallback_units": 3,
    }
    return stats | overrides


def test_step_stats_effective_ratio_is_mixed_over_active() -> None:
    assert StepStats.model_validate(step_stats()).effective_ratio == 5 / 8
    idle = StepStats.model_validate(step_stats(prompts=2, active=0, trees_complete=0, mixed=0))
    assert idle.effective_ratio is None
    assert "effective_ratio" in idle.model_dump()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"skipped": 3}, "active (8) + skipped (3) != prompts (10)"),
        ({"mixed": 9}, "cannot exceed active (8)"),
        ({"trees_complete": 9}, "cannot exceed active (8)"),
        ({"fallback_units": -1}, "fallback_units: Input should be greater than or equal to 0"),
    ],
)
def test_step_stats_rejects_inconsistent_counts(overrides: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError) as error:
        StepStats.model_validate(step_stats(**overrides))
    assert expected in error_messages(error)


def test_job_stats_steps_are_strictly_increasing() -> None:
    assert len(JobStats(job="j", steps=[step_stats(step=1), step_stats(step=4)]).steps) == 2  # type: ignore[list-item]
    with pytest.raises(ValidationError, match=r"steps must be strictly increasing; got \[2, 2\]"):
        JobStats.model_validate({"job": "j", "steps": [step_stats(step=2), step_stats(step=2)]})


def test_predictor_info_parses_depth_keys_and_nullable_metrics() -> None:
    info = PredictorInfo.model_validate_json(
        '{"version": 0, "examples_seen": 0, "brier": null, "ece": null, "spearman": null,'
        ' "spearman_by_depth": {"0": 0.1, "3": -0.2}, "device": "cpu"}'
    )
    assert info.spearman_by_depth == {0: 0.1, 3: -0.2}
    with pytest.raises(ValidationError, match="spearman"):
        PredictorInfo.model_validate(info.model_dump() | {"spearman": 1.5})
    with pytest.raises(ValidationError, match="spearman_by_depth"):
        PredictorInfo.model_validate(info.model_dump() | {"spearman_by_depth": {-1: 0.0}})


def test_predict_request_bounds() -> None:
    history = HistoryIn(
        prompt_id="p", prompt_text="solve", turns=[TurnIn(text="look"), TurnIn(features=[0.1])]
    )
    assert PredictRequest(histories=[history]).job == "default"
    assert HistoryIn(prompt_id="p").turns == []
    with pytest.raises(ValidationError, match="at least 1 item"):
        PredictRequest(histories=[])
    with pytest.raises(ValidationError, match="at most"):
        HistoryIn(prompt_id="p", turns=[TurnIn()] * (limits.MAX_TURNS_PER_HISTORY + 1))


def test_error_response_is_problem_details() -> None:
    problem = ErrorResponse.model_validate(
        {
            "title": "Unprocessable Content",
            "status": 422,
            "detail": "1 invalid field",
            "request_id": "r1",
            "errors": [{"loc": ["body", "prompts", 0], "msg": "bad"}],
        }
    )
    assert problem.type == "about:blank"
    assert problem.errors is not None
    assert problem.errors[0].loc == ["body", "prompts", 0]
    with pytest.raises(ValidationError, match="status"):
        ErrorResponse(title="OK", status=200, detail="not an error", request_id="r")


def test_health_names_the_api_version() -> None:
    assert Health().model_dump() == {"status": "ok", "api_version": API_VERSION}


identifiers = st.text(min_size=1, max_size=20)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def expand_events(draw: st.DrawFn) -> ExpandEvent:
    done = draw(st.booleans())
    return ExpandEvent(
        event_id=draw(identifiers),
        tree_id=draw(identifiers),
        node_id=draw(identifiers.filter(lambda node: node != "parent")),
        parent_id=draw(st.none() | st.just("parent")),
        text=draw(st.none() | st.text(max_size=50)),
        features=draw(st.none() | st.lists(finite, min_size=1, max_size=4)),
        done=done,
        reward=draw(finite) if done else None,
        instruction_id=draw(st.none() | identifiers),
    )


@given(expand_events())
def test_expand_event_survives_the_wire(original: ExpandEvent) -> None:
    assert ExpandEvent.model_validate_json(original.model_dump_json()) == original


@given(
    st.lists(identifiers, min_size=1, max_size=5, unique=True),
    st.integers(0, 1000),
    st.sampled_from(list(Policy)),
    st.floats(0, limits.MAX_EXPANSION),
)
def test_allocate_request_survives_the_wire(
    ids: list[str], budget: int, policy: Policy, expansion: float
) -> None:
    original = AllocateRequest(
        step=1,
        budget=budget,
        policy=policy,
        expansion=expansion,
        prompts=[PromptIn(prompt_id=prompt_id, text=prompt_id * 2) for prompt_id in ids],
    )
    assert AllocateRequest.model_validate_json(original.model_dump_json()) == original
