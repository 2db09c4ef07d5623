"""Both clients against a failing mock service: retries bounded, waits honoured and logged, and an
allocation safe to send again."""

import logging
import time
from email.utils import formatdate

import httpx
import pytest
from client_replies import ALLOCATE_REQUEST, ALLOCATION, Connect, answer, problem

from trace_client import (
    TraceAPIError,
    TraceBadRequest,
    TraceConnectionError,
    TraceRateLimited,
    TraceServerError,
    TraceTimeoutError,
    TraceUnavailable,
)
from trace_proto import Health


def with_retry_after(response: httpx.Response, value: str) -> httpx.Response:
    response.headers["Retry-After"] = value
    return response


def test_retry_after_in_seconds_is_honoured(connect: Connect) -> None:
    replies = [with_retry_after(problem(503, "Service Unavailable", "busy"), "3"), answer(Health())]
    client, service = connect(lambda _: replies.pop(0))
    assert client.health() == Health()
    assert service.sleeps == [3.0]
    assert len(service.requests) == 2


def test_retry_after_as_an_http_date_is_honoured(connect: Connect) -> None:
    date = formatdate(time.time() + 30, usegmt=True)
    replies = [with_retry_after(problem(429, "Too Many Requests", "slow down"), date), answer(Health())]
    client, service = connect(lambda _: replies.pop(0))
    client.health()
    (waited,) = service.sleeps
    assert 28.0 < waited <= 30.0  # the date has whole seconds


def test_a_retry_after_beyond_the_cap_waits_the_cap_and_retries(connect: Connect) -> None:
    replies = [with_retry_after(problem(503, "Service Unavailable", "down"), "3600"), answer(Health())]
    client, service = connect(lambda _: replies.pop(0))
    assert client.health() == Health()
    assert service.sleeps == [60.0]  # Backoff.max_retry_after
    assert len(service.requests) == 2


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (408, TraceBadRequest),
        (429, TraceRateLimited),
        (500, TraceServerError),
        (502, TraceServerError),
        (503, TraceUnavailable),
        (504, TraceServerError),
    ],
)
def test_retryable_statuses_back_off_exponentially_then_raise(
    connect: Connect, status: int, error_class: type[TraceAPIError]
) -> None:
    client, service = connect(lambda _: problem(status, "Busy", "try later"), max_retries=3)
    with pytest.raises(error_class) as raised:
        client.predictor_info()
    assert raised.value.status == status
    assert len(service.requests) == 4
    assert service.sleeps == [0.5, 1.0, 2.0]  # U = 1: the backoff cap itself


def test_connection_errors_are_retried_then_reported(connect: Connect) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client, service = connect(refuse, max_retries=2)
    with pytest.raises(TraceConnectionError, match="after 3 attempts") as raised:
        client.health()
    assert not isinstance(raised.value, TraceTimeoutError)
    assert raised.value.attempts == 3
    assert isinstance(raised.value.__cause__, httpx.ConnectError)
    assert len(service.sleeps) == 2


def test_timeouts_are_retried_then_reported_as_timeouts(connect: Connect) -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    client, service = connect(hang, max_retries=1)
    with pytest.raises(TraceTimeoutError, match="ReadTimeout"):
        client.job_stats("run-1")
    assert len(service.requests) == 2


def test_a_transient_failure_is_invisible_to_the_caller(connect: Connect) -> None:
    outcomes: list[Exception | httpx.Response] = [
        httpx.ConnectTimeout("slow"),
        httpx.RemoteProtocolError("server hung up"),
        answer(Health()),
    ]

    def flaky(request: httpx.Request) -> httpx.Response:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    client, service = connect(flaky)
    assert client.health() == Health()
    assert service.sleeps == [0.5, 1.0]


def test_each_retry_is_logged_with_its_wait_and_reason(
    connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    replies = [
        with_retry_after(problem(503, "Service Unavailable", "busy"), "7200"),
        httpx.Response(500, headers={"X-Request-ID": "req-9"}),
        answer(Health()),
    ]
    client, _ = connect(lambda _: replies.pop(0))
    with caplog.at_level(logging.INFO, logger="trace_client"):
        client.health()
    assert [(record.name, record.levelname) for record in caplog.records] == [("trace_client", "INFO")] * 2
    assert [record.getMessage() for record in caplog.records] == [
        "retrying GET http://trace.test/api/healthz in 60.00 s (retry 1 of 3): "
        "503 Service Unavailable, Retry-After 7200 s capped",
        "retrying GET http://trace.test/api/healthz in 1.00 s (retry 2 of 3): "
        "500 Internal Server Error, request id req-9",
    ]


def test_a_transport_failure_retry_is_logged(connect: Connect, caplog: pytest.LogCaptureFixture) -> None:
    outcomes: list[Exception | httpx.Response] = [httpx.ConnectError("connection refused"), answer(Health())]

    def flaky(request: httpx.Request) -> httpx.Response:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    client, _ = connect(flaky, max_retries=1)
    with caplog.at_level(logging.INFO, logger="trace_client"):
        client.health()
    assert [record.getMessage() for record in caplog.records] == [
        "retrying GET http://trace.test/api/healthz in 0.50 s (retry 1 of 1): "
        "ConnectError: connection refused"
    ]


def test_a_final_answer_logs_nothing(connect: Connect, caplog: pytest.LogCaptureFixture) -> None:
    client, _ = connect(lambda _: problem(503, "Service Unavailable", "busy"), max_retries=0)
    with caplog.at_level(logging.DEBUG, logger="trace_client"), pytest.raises(TraceUnavailable):
        client.health()
    assert caplog.records == []


def test_no_retries_when_max_retries_is_zero(connect: Connect) -> None:
    client, service = connect(lambda _: problem(503, "Service Unavailable", "busy"), max_retries=0)
    with pytest.raises(TraceUnavailable):
        client.health()
    assert len(service.requests) == 1


def test_allocate_reuses_its_idempotency_key_across_retries(connect: Connect) -> None:
    replies = [
        problem(503, "Service Unavailable", "busy"),
        problem(502, "Bad Gateway", "x"),
        answer(ALLOCATION),
    ]
    client, service = connect(lambda _: replies.pop(0))
    assert client.allocate(ALLOCATE_REQUEST) == ALLOCATION
    keys = {sent.headers["Idempotency-Key"] for sent in service.requests}
    assert len(service.requests) == 3
    assert len(keys) == 1
    assert {sent.content for sent in service.requests} == {service.requests[0].content}


def test_each_allocate_call_gets_its_own_key_unless_given(connect: Connect) -> None:
    client, service = connect(lambda _: answer(ALLOCATION))
    client.allocate(ALLOCATE_REQUEST)
    client.allocate(ALLOCATE_REQUEST)
    client.allocate(ALLOCATE_REQUEST, idempotency_key="step-1-alloc")
    first, second, chosen = (sent.headers["Idempotency-Key"] for sent in service.requests)
    assert first != second
    assert chosen == "step-1-alloc"
