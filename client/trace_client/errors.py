"""Exceptions raised by the trace-rollout clients.

TraceError
├── TraceConnectionError        the service could not be reached (after retries)
│   └── TraceTimeoutError       ... and the last attempt timed out
├── TraceResponseError          a 2xx answer that is not the v1 shape (a proxy, a version mismatch)
├── TraceRejectedEventsError    /v1/expand refused some events (with on_rejected="raise")
└── TraceAPIError               the service answered with an error status
    ├── TraceBadRequest         4xx: the request is wrong (408 is retried first, as a timeout)
    │   ├── TraceAuthError      401, 403
    │   ├── TraceNotFound       404
    │   ├── TraceConflict       409
    │   ├── TraceValidationError 422
    │   └── TraceRateLimited    429 (raised once retries are exhausted)
    └── TraceServerError        5xx (500, 502, 504 raised once retries are exhausted)
        └── TraceUnavailable    503 (raised once retries are exhausted)
"""

from collections.abc import Sequence

from trace_proto import ErrorItem, ExpandResponse


class TraceError(Exception):
    """Base of every exception the clients raise."""


class TraceConnectionError(TraceError):
    """No answer from the service after `attempts` tries."""

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(f"{message} (after {attempts} attempt{'s' if attempts != 1 else ''})")
        self.attempts = attempts


class TraceTimeoutError(TraceConnectionError):
    """No answer in time after `attempts` tries."""


class TraceResponseError(TraceError):
    """A success status whose body is not what v1 promises."""

    def __init__(self, message: str, *, status: int, request_id: str | None) -> None:
        super().__init__(f"{message} (status {status}, request id {request_id or 'unknown'})")
        self.status = status
        self.request_id = request_id


class TraceRejectedEventsError(TraceError):
    """`/v1/expand` recorded the batch but refused some of its events (`response.rejected` says which
    and why); the rest were recorded, and `response` carries the instructions they made due."""

    def __init__(self, response: ExpandResponse) -> None:
        super().__init__(rejected_summary(response))
        self.response = response


def rejected_summary(response: ExpandResponse) -> str:
    """One line naming the refused events of an `/v1/expand` answer and why (the first five)."""
    shown = "; ".join(f"{item.event_id}: {item.status} {item.error}" for item in response.rejected[:5])
    more = f"; and {len(response.rejected) - 5} more" if len(response.rejected) > 5 else ""
    return f"the service refused {len(response.rejected)} event(s): {shown}{more}"


class TraceAPIError(TraceError):
    """The service's error answer: RFC 9457 problem details and the request id to quote."""

    def __init__(
        self,
        *,
        status: int,
        title: str,
        detail: str,
        request_id: str | None,
        errors: Sequence[ErrorItem] = (),
        problem_type: str = "about:blank",
    ) -> None:
        super().__init__(f"{status} {title}: {detail} (request id {request_id or 'unknown'})")
        self.status = status
        self.title = title
        self.detail = detail
        self.request_id = request_id
        self.errors = tuple(errors)
        self.problem_type = problem_type


class TraceBadRequest(TraceAPIError):
    """4xx: the request was rejected as it is."""


class TraceAuthError(TraceBadRequest):
    """401/403: missing or wrong bearer token."""


class TraceNotFound(TraceBadRequest):
    """404: no such tree, job or endpoint."""


class TraceConflict(TraceBadRequest):
    """409: the request conflicts with the state, e.g. an idempotency key reused with another body."""


class TraceValidationError(TraceBadRequest):
    """422: the body or query failed validation; `errors` says where."""


class TraceRateLimited(TraceBadRequest):
    """429: the service shed load and retries were exhausted."""


class TraceServerError(TraceAPIError):
    """5xx: the service failed."""


class TraceUnavailable(TraceServerError):
    """503: the service is overloaded or not ready, and retries were exhausted."""


_ERROR_BY_STATUS: dict[int, type[TraceAPIError]] = {
    401: TraceAuthError,
    403: TraceAuthError,
    404: TraceNotFound,
    409: TraceConflict,
    422: TraceValidationError,
    429: TraceRateLimited,
    503: TraceUnavailable,
}


def error_class(status: int) -> type[TraceAPIError]:
    """The most specific exception class for an error status."""
    if status in _ERROR_BY_STATUS:
        return _ERROR_BY_STATUS[status]
    if 400 <= status < 500:
        return TraceBadRequest
    if status >= 500:
        return TraceServerError
    return TraceAPIError
