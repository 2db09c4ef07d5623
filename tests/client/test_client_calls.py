"""Both clients against a mock service: requests sent, answers parsed, errors mapped, options applied."""

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from client_replies import ALLOCATE_REQUEST, ALLOCATION, Connect, answer, problem
from pydantic import BaseModel

from trace_client import (
    AsyncTraceClient,
    TraceAPIError,
    TraceAuthError,
    TraceBadRequest,
    TraceClient,
    TraceConflict,
    TraceNotFound,
    TraceRejectedEventsError,
    TraceResponseError,
    TraceServerError,
    TraceUnavailable,
    TraceValidationError,
)
from trace_proto import (
    ExpandEvent,
    ExpandRequest,
    ExpandResponse,
    Health,
    HistoryIn,
    Instruction,
    InstructionsResponse,
    JobDeleted,
    JobStats,
    PredictorInfo,
    PredictRequest,
    PredictResponse,
    Ready,
    RejectedEvent,
    TreeNode,
    TreeResponse,
    TreeStatus,
)

EVENTS = [ExpandEvent(event_id="e1", tree_id="t1", node_id="n1", done=True, reward=1.0)]
INSTRUCTION = Instruction(instruction_id="i1", tree_id="t1", node_id="n1", count=2)
EXPANSION = ExpandResponse(
    accepted=1,
    duplicates=0,
    rejected=[RejectedEvent(event_id="e0", status=409, error="unknown parent 'n0'")],
    instructions=[INSTRUCTION],
    completed=["t1"],
)
TREE = TreeResponse(
    tree_id="t/1",
    prompt_id="p1",
    job="default",
    step=1,
    status=TreeStatus.CLOSED,
    mixed=False,
    rollouts=1,
    expansion_budget=0,
    value=1.0,
    nodes=[
        TreeNode(
            node_id="n1",
            parent_id=None,
            depth=1,
            visits=1,
            successes=1,
            value=1.0,
            predicted=0.7,
            advantage=0.0,
            reward=1.0,
            instruction_id=None,
        )
    ],
)
HISTORIES = [HistoryIn(prompt_id="p1", prompt_text="find the key")]
PREDICTOR = PredictorInfo(
    version=2, examples_seen=10, brier=0.2, ece=None, spearman=0.4, spearman_by_depth={1: 0.3}, device="cpu"
)
STATS = JobStats(job="run-1", steps=[])


@pytest.mark.parametrize(
    ("call", "args", "kwargs", "method", "raw_path", "sent_body", "reply"),
    [
        ("allocate", (ALLOCATE_REQUEST,), {}, "POST", "/api/v1/allocate", ALLOCATE_REQUEST, ALLOCATION),
        ("expand", (EVENTS,), {}, "POST", "/api/v1/expand", ExpandRequest(events=EVENTS), EXPANSION),
        (
            "claim_instructions",
            ("run-1", 5),
            {},
            "GET",
            "/api/v1/instructions?job=run-1&max=5",
            None,
            InstructionsResponse(instructions=[INSTRUCTION], lease_seconds=30.0),
        ),
        ("get_tree", ("t/1",), {}, "GET", "/api/v1/trees/t%2F1", None, TREE),
        ("close_tree", ("t/1",), {}, "POST", "/api/v1/trees/t%2F1/close", None, TREE),
        ("predictor_info", (), {}, "GET", "/api/v1/predictor?job=default", None, PREDICTOR),
        ("predictor_info", ("run-1",), {}, "GET", "/api/v1/predictor?job=run-1", None, PREDICTOR),
        (
            "predict",
            (HISTORIES,),
            {"job": "run-1"},
            "POST",
            "/api/v1/predict",
            PredictRequest(job="run-1", histories=HISTORIES),
            PredictResponse(predictor_version=2, predictions=[0.25]),
        ),
        ("job_stats", ("run-1",), {}, "GET", "/api/v1/jobs/run-1/stats", None, STATS),
        (
            "delete_job",
            ("run-1",),
            {},
            "DELETE",
            "/api/v1/jobs/run-1",
            None,
            JobDeleted(job="run-1", keys_deleted=9),
        ),
        ("health", (), {}, "GET", "/api/healthz", None, Health()),
        ("ready", (), {}, "GET", "/api/readyz", None, Ready(ready=True, store=True, predictor=True)),
    ],
)
def test_each_call_sends_its_request_and_parses_its_answer(
    connect: Connect,
    call: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    method: str,
    raw_path: str,
    sent_body: BaseModel | None,
    reply: BaseModel,
) -> None:
    client, service = connect(lambda _: answer(reply), token="s3cret")
    assert getattr(client, call)(*args, **kwargs) == reply
    (sent,) = service.requests
    assert sent.method == method
    assert sent.url.raw_path.decode() == raw_path
    assert sent.headers["Authorization"] == "Bearer s3cret"
    if sent_body is None:
        assert sent.content == b""
    else:
        assert sent.headers["Content-Type"] == "application/json"
        assert type(sent_body).model_validate_json(sent.content) == sent_body


def test_no_authorization_header_without_a_token(connect: Connect) -> None:
    client, service = connect(lambda _: answer(Health()))
    client.health()
    assert "Authorization" not in service.requests[0].headers


@pytest.mark.parametrize(
    ("status", "title", "error_class"),
    [
        (400, "Bad Request", TraceBadRequest),
        (401, "Unauthorized", TraceAuthError),
        (403, "Forbidden", TraceAuthError),
        (404, "Not Found", TraceNotFound),
        (409, "Conflict", TraceConflict),
        (413, "Content Too Large", TraceBadRequest),
        (422, "Unprocessable Content", TraceValidationError),
        (501, "Not Implemented", TraceServerError),
    ],
)
def test_error_answers_map_to_exceptions_without_retrying(
    connect: Connect, status: int, title: str, error_class: type[TraceAPIError]
) -> None:
    errors = [{"loc": ["body", "budget"], "msg": "Input should be greater than or equal to 0"}]
    client, service = connect(lambda _: problem(status, title, "what went wrong", errors=errors))
    with pytest.raises(error_class) as raised:
        client.get_tree("t1")
    error = raised.value
    assert (error.status, error.title, error.detail, error.request_id) == (
        status,
        title,
        "what went wrong",
        "req-42",
    )
    assert [(item.loc, item.msg) for item in error.errors] == [(["body", "budget"], errors[0]["msg"])]
    assert "req-42" in str(error)
    assert "what went wrong" in str(error)
    assert len(service.requests) == 1
    assert service.sleeps == []


def test_error_without_problem_details_keeps_status_body_and_request_id(connect: Connect) -> None:
    client, _ = connect(
        lambda _: httpx.Response(502, text="<html>upstream down</html>", headers={"X-Request-ID": "edge-7"}),
        max_retries=0,
    )
    with pytest.raises(TraceServerError) as raised:
        client.health()
    assert (raised.value.status, raised.value.title, raised.value.request_id) == (
        502,
        "Bad Gateway",
        "edge-7",
    )
    assert "upstream down" in raised.value.detail


def test_not_ready_is_an_answer_not_an_error(connect: Connect) -> None:
    not_ready = Ready(ready=False, store=False, predictor=True)
    client, service = connect(lambda _: answer(not_ready, status=503))
    assert client.ready() == not_ready
    assert len(service.requests) == 1


def test_an_answer_of_the_wrong_shape_is_a_response_error(connect: Connect) -> None:
    client, _ = connect(lambda _: httpx.Response(200, json={"status": "ok"}, headers={"X-Request-ID": "r9"}))
    with pytest.raises(TraceResponseError, match="not a valid PredictorInfo") as raised:
        client.predictor_info()
    assert raised.value.request_id == "r9"


@pytest.mark.parametrize(
    ("use", "expected"),
    [
        (lambda client: client.job_stats("a/b"), "String should match pattern"),
        (lambda client: client.delete_job("a/b"), "String should match pattern"),
        (lambda client: client.predictor_info("a b"), "String should match pattern"),
        (lambda client: client.claim_instructions("run-1", 0), "greater than or equal to 1"),
        (lambda client: client.get_tree(""), "at least 1 character"),
        (lambda client: client.expand([]), "at least 1 item"),
        (lambda client: client.predict([]), "at least 1 item"),
        (lambda client: client.allocate(ALLOCATE_REQUEST, idempotency_key=""), "at least 1 character"),
    ],
)
def test_bad_arguments_raise_before_anything_is_sent(
    connect: Connect, use: Callable[[Any], Any], expected: str
) -> None:
    client, service = connect(lambda _: answer(Health()))
    with pytest.raises(ValueError, match=expected):
        use(client)
    assert service.requests == []


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"token": " "}, "token must not be empty"),
        ({"max_retries": -1}, "max_retries must be >= 0"),
        ({"http_client": object(), "transport": object()}, "either http_client or transport"),
    ],
)
@pytest.mark.parametrize("client_class", [TraceClient, AsyncTraceClient])
def test_bad_client_options_raise(client_class: type[Any], options: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        client_class("http://trace.test", **options)


@pytest.mark.parametrize("base_url", ["trace.test:8000", "ftp://trace.test", "/v1"])
def test_base_url_must_be_absolute_http(base_url: str) -> None:
    with pytest.raises(ValueError, match="absolute http"):
        TraceClient(base_url)


def test_sync_client_closes_only_what_it_owns() -> None:
    transport = httpx.MockTransport(lambda _: answer(Health()))
    shared = httpx.Client(transport=transport)
    with TraceClient("http://trace.test", http_client=shared) as client:
        client.health()
    assert shared.get("http://trace.test/healthz").status_code == 200
    shared.close()
    with TraceClient("http://trace.test", transport=transport) as owned:
        owned.health()
    with pytest.raises(RuntimeError, match="closed"):
        owned.health()


async def test_async_client_as_a_context_manager() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(EXPANSION)

    async with AsyncTraceClient("http://trace.test", transport=httpx.MockTransport(handler)) as client:
        assert await client.expand(EVENTS) == EXPANSION
    assert json.loads(seen[0].content)["events"][0]["event_id"] == "e1"
    with pytest.raises(RuntimeError, match="closed"):
        await client.health()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, {"connect": 2.0, "read": 30.0, "write": 10.0, "pool": 5.0}),
        ({"timeout": 5}, {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}),
    ],
)
def test_every_attempt_carries_the_client_timeout(
    connect: Connect, options: dict[str, Any], expected: dict[str, float]
) -> None:
    client, service = connect(lambda _: answer(Health()), **options)
    client.health()
    assert service.requests[0].extensions["timeout"] == expected


def test_a_call_can_set_its_own_timeout(connect: Connect) -> None:
    replies = [problem(503, "Service Unavailable", "busy"), answer(STATS), answer(STATS)]
    client, service = connect(lambda _: replies.pop(0))
    client.job_stats("run-1", timeout=httpx.Timeout(1.0, read=90.0))
    client.job_stats("run-1")
    timeouts = [sent.extensions["timeout"] for sent in service.requests]
    own = {"connect": 1.0, "read": 90.0, "write": 1.0, "pool": 1.0}
    assert timeouts == [own, own, {"connect": 2.0, "read": 30.0, "write": 10.0, "pool": 5.0}]


def test_with_options_changes_the_copy_only(connect: Connect) -> None:
    client, service = connect(lambda _: problem(503, "Service Unavailable", "busy"), max_retries=3)
    patient = client.with_options(timeout=120.0, max_retries=1)
    with pytest.raises(TraceUnavailable):
        patient.health()
    assert len(service.requests) == 2
    assert service.requests[0].extensions["timeout"]["read"] == 120.0
    with pytest.raises(TraceUnavailable):
        client.health()
    assert len(service.requests) == 2 + 4
    assert service.requests[-1].extensions["timeout"]["read"] == 30.0


def test_with_options_validates_and_keeps_what_it_is_not_given(connect: Connect) -> None:
    client, service = connect(lambda _: answer(Health()), token="s3cret", timeout=5.0)
    with pytest.raises(ValueError, match="max_retries must be >= 0"):
        client.with_options(max_retries=-1)
    client.with_options(max_retries=0).health()
    (sent,) = service.requests
    assert sent.headers["Authorization"] == "Bearer s3cret"
    assert sent.extensions["timeout"]["read"] == 5.0


def test_closing_a_with_options_copy_leaves_the_connections_open() -> None:
    transport = httpx.MockTransport(lambda _: answer(Health()))
    with TraceClient("http://trace.test", transport=transport) as client:
        with client.with_options(timeout=1.0) as copy:
            copy.health()
        assert client.health() == Health()
    with pytest.raises(RuntimeError, match="closed"):
        copy.health()


async def test_async_with_options_shares_the_connections() -> None:
    transport = httpx.MockTransport(lambda _: answer(Health()))
    async with AsyncTraceClient("http://trace.test", transport=transport) as client:
        async with client.with_options(max_retries=0) as copy:
            assert await copy.health() == Health()
        assert await client.health() == Health()


@pytest.mark.parametrize("client_class", [TraceClient, AsyncTraceClient])
def test_url_and_token_default_to_the_environment(
    client_class: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACE_URL", "http://from-env.test:8000/prefix")
    monkeypatch.setenv("TRACE_TOKEN", "env-token")
    client = client_class(transport=httpx.MockTransport(lambda _: answer(Health())))
    assert client._core.base_url == "http://from-env.test:8000/prefix"
    assert client._core.headers["Authorization"] == "Bearer env-token"


def test_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACE_URL", "http://from-env.test")
    monkeypatch.setenv("TRACE_TOKEN", "env-token")
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(Health())

    with TraceClient("http://given.test", token="given", transport=httpx.MockTransport(handler)) as client:
        client.health()
    assert str(seen[0].url) == "http://given.test/healthz"
    assert seen[0].headers["Authorization"] == "Bearer given"


def test_an_empty_token_variable_means_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACE_TOKEN", "")
    with TraceClient("http://trace.test") as client:
        assert "Authorization" not in client._core.headers


@pytest.mark.parametrize("value", [None, ""])
@pytest.mark.parametrize("client_class", [TraceClient, AsyncTraceClient])
def test_no_url_anywhere_is_a_clear_error(
    client_class: type[Any], value: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is None:
        monkeypatch.delenv("TRACE_URL", raising=False)
    else:
        monkeypatch.setenv("TRACE_URL", value)
    with pytest.raises(ValueError, match="no service URL: pass base_url or set TRACE_URL"):
        client_class()


def test_a_bad_url_in_the_environment_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACE_URL", "trace:8000")
    with pytest.raises(ValueError, match="TRACE_URL must be an absolute http"):
        TraceClient()


def refusing_transport() -> httpx.MockTransport:
    """A service that records one event of a batch and refuses the other."""
    refused = RejectedEvent(event_id="e2", status=409, error="node n1 already has a next turn")
    return httpx.MockTransport(lambda _: answer(ExpandResponse(accepted=1, duplicates=0, rejected=[refused])))


PARTLY_REFUSED_EVENTS = [
    ExpandEvent(event_id="e1", tree_id="t", node_id="n1", done=True, reward=1.0),
    ExpandEvent(event_id="e2", tree_id="t", node_id="n2", parent_id="n1"),
]


def test_refused_events_are_logged_by_default(caplog: pytest.LogCaptureFixture) -> None:
    with (
        TraceClient("http://trace.test", transport=refusing_transport()) as client,
        caplog.at_level("WARNING"),
    ):
        response = client.expand(PARTLY_REFUSED_EVENTS)
    assert [item.event_id for item in response.rejected] == ["e2"]
    (record,) = [r for r in caplog.records if r.name == "trace_client"]
    assert record.getMessage() == "the service refused 1 event(s): e2: 409 node n1 already has a next turn"


def test_refused_events_raise_on_request_and_pass_silently_when_handled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with TraceClient("http://trace.test", transport=refusing_transport()) as client:
        with pytest.raises(TraceRejectedEventsError, match="e2: 409") as raised:
            client.expand(PARTLY_REFUSED_EVENTS, on_rejected="raise")
        assert raised.value.response.accepted == 1
        with caplog.at_level("WARNING"):
            assert client.expand(PARTLY_REFUSED_EVENTS, on_rejected="ignore").rejected
    assert not [r for r in caplog.records if r.name == "trace_client"]


async def test_the_async_client_deals_with_refused_events_alike() -> None:
    async with AsyncTraceClient("http://trace.test", transport=refusing_transport()) as client:
        with pytest.raises(TraceRejectedEventsError):
            await client.expand(PARTLY_REFUSED_EVENTS, on_rejected="raise")
