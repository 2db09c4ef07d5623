"""What the sync and async clients share: building requests, the retry policy, parsing and error mapping.

Only the loop that sends a request and sleeps between attempts differs between `TraceClient` and
`AsyncTraceClient`; every decision inside it is made here.

Every v1 call is safe to retry: reads are reads, `/v1/allocate` carries an `Idempotency-Key` that is
fixed before the first attempt, `/v1/expand` events carry client-made `event_id`s the server
deduplicates, a claim only leases instructions (an unused lease expires), and closing a closed tree
or deleting a deleted job changes nothing. So a timeout after the request was sent is retried like a
refused connection, and a 500 like a 503.

Like openai-python's client, a client takes its defaults from the environment (`TRACE_URL`,
`TRACE_TOKEN`) and logs each retry at INFO on the `trace_client` logger.
"""

import copy
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Generic, Literal, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from trace_client.errors import (
    TraceAPIError,
    TraceConnectionError,
    TraceRejectedEventsError,
    TraceResponseError,
    TraceTimeoutError,
    error_class,
    rejected_summary,
)
from trace_proto import (
    API_VERSION,
    DEFAULT_JOB,
    AllocateRequest,
    AllocateResponse,
    ErrorResponse,
    ExpandEvent,
    ExpandRequest,
    ExpandResponse,
    Health,
    HistoryIn,
    InstructionsQuery,
    InstructionsResponse,
    JobDeleted,
    JobStats,
    PredictorInfo,
    PredictRequest,
    PredictResponse,
    Ready,
    TreeResponse,
    paths,
)
from trace_proto.v1.common import Identifier, JobName

ModelT = TypeVar("ModelT", bound=BaseModel)
#: Seconds for every phase, or an `httpx.Timeout` for connect/read/write/pool separately.
TimeoutOption = httpx.Timeout | float

logger = logging.getLogger("trace_client")

#: The service's URL and bearer token when the constructor is given none.
URL_VARIABLE = "TRACE_URL"
TOKEN_VARIABLE = "TRACE_TOKEN"
#: Connecting should be quick; an allocation over a large pool may take a while to compute.
DEFAULT_TIMEOUT = httpx.Timeout(connect=2.0, read=30.0, write=10.0, pool=5.0)
DEFAULT_MAX_RETRIES = 3
#: A request timeout, load shedding, a failed server or gateway: a second try may pass (every call is
#: safe to repeat). Any other error status would fail the same way again.
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: The request may not have reached the service, or its answer was lost on the way back.
RETRYABLE_TRANSPORT_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
USER_AGENT = f"trace-client/{API_VERSION}"
_SHOWN_BODY_CHARS = 300

_job_name = TypeAdapter(JobName)
_identifier = TypeAdapter(Identifier)


@dataclass(frozen=True)
class Backoff:
    """Wait before retry number `n` (0 = the first retry): exponential with full jitter,

        delay_n = U · min(max_delay, initial_delay · 2ⁿ),   U ~ Uniform[0, 1),

    so that clients that failed together do not retry together. A `Retry-After` from the server
    replaces it, capped at `max_retry_after` (a server asking for an hour still gets its retry, a
    minute later, instead of the call failing at once or hanging).
    """

    initial_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0
    uniform: Callable[[], float] = field(default=random.random, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial_delay <= self.max_delay:
            raise ValueError(
                f"need 0 < initial_delay <= max_delay; got {self.initial_delay}, {self.max_delay}"
            )
        if self.max_retry_after < 0:
            raise ValueError(f"max_retry_after must be >= 0; got {self.max_retry_after}")

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry `retry`."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        doublings = min(retry, 64)  # past the cap anyway; keeps 2ⁿ from overflowing a float
        return self.uniform() * min(self.max_delay, self.initial_delay * 2.0**doublings)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a `Retry-After` header: delta-seconds or an HTTP date (RFC 9110 §10.2.3).

    `now` is the current Unix time. A date in the past means 0; a missing or malformed header, None.
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            moment = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if moment.tzinfo is None:  # an HTTP date is always GMT; the parser leaves "-0000" naive
            return None
        return max(0.0, moment.timestamp() - now)
    return seconds if seconds >= 0 and seconds != float("inf") else None


@dataclass(frozen=True)
class ApiCall(Generic[ModelT]):
    """One v1 call: what to send and which model its answer is.

    A 2xx answer is a `model`; so is an answer with a status in `answer_statuses` (readiness says
    "not ready" with 503 and a body). Anything else is an error.
    """

    method: str
    path: str
    model: type[ModelT]
    body: bytes | None = None
    params: Mapping[str, str | int] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    answer_statuses: frozenset[int] = frozenset()


def _json_body(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


def _path(template: str, **values: str) -> str:
    # Identifiers are opaque text: escape everything, '/' included, so one always fills one segment.
    return template.format(**{name: quote(value, safe="") for name, value in values.items()})


def allocate_call(request: AllocateRequest, idempotency_key: str | None) -> ApiCall[AllocateResponse]:
    """`POST /v1/allocate`; without a key, a fresh UUID, fixed for every retry of this call."""
    key = uuid.uuid4().hex if idempotency_key is None else _identifier.validate_python(idempotency_key)
    return ApiCall(
        "POST",
        paths.ALLOCATE,
        AllocateResponse,
        body=_json_body(request),
        headers={paths.IDEMPOTENCY_KEY_HEADER: key},
    )


def expand_call(events: Sequence[ExpandEvent]) -> ApiCall[ExpandResponse]:
    return ApiCall("POST", paths.EXPAND, ExpandResponse, body=_json_body(ExpandRequest(events=list(events))))


#: What `expand` does when the service refuses some events of a batch: log a warning and return the
#: answer, raise `TraceRejectedEventsError`, or return it silently (a caller that handles them itself).
OnRejected = Literal["warn", "raise", "ignore"]


def checked_expand(response: ExpandResponse, on_rejected: OnRejected) -> ExpandResponse:
    """The answer of `/v1/expand`, after ``on_rejected`` dealt with the events it refused."""
    if response.rejected and on_rejected != "ignore":
        if on_rejected == "raise":
            raise TraceRejectedEventsError(response)
        logger.warning("%s", rejected_summary(response))
    return response


def claim_call(job: str, max_instructions: int) -> ApiCall[InstructionsResponse]:
    query = InstructionsQuery(job=job, max=max_instructions)
    return ApiCall("GET", paths.INSTRUCTIONS, InstructionsResponse, params=query.model_dump())


def tree_call(tree_id: str) -> ApiCall[TreeResponse]:
    return ApiCall("GET", _path(paths.TREE, tree_id=_identifier.validate_python(tree_id)), TreeResponse)


def close_tree_call(tree_id: str) -> ApiCall[TreeResponse]:
    return ApiCall(
        "POST", _path(paths.TREE_CLOSE, tree_id=_identifier.validate_python(tree_id)), TreeResponse
    )


def predictor_call(job: str = DEFAULT_JOB) -> ApiCall[PredictorInfo]:
    return ApiCall("GET", paths.PREDICTOR, PredictorInfo, params={"job": _job_name.validate_python(job)})


def predict_call(histories: Sequence[HistoryIn], job: str = DEFAULT_JOB) -> ApiCall[PredictResponse]:
    request = PredictRequest(job=job, histories=list(histories))
    return ApiCall("POST", paths.PREDICT, PredictResponse, body=_json_body(request))


def job_stats_call(job: str, from_step: int | None = None, to_step: int | None = None) -> ApiCall[JobStats]:
    window = {
        name: step for name, step in (("from_step", from_step), ("to_step", to_step)) if step is not None
    }
    return ApiCall("GET", _path(paths.JOB_STATS, job=_job_name.validate_python(job)), JobStats, params=window)


def delete_job_call(job: str) -> ApiCall[JobDeleted]:
    return ApiCall("DELETE", _path(paths.JOB, job=_job_name.validate_python(job)), JobDeleted)


def health_call() -> ApiCall[Health]:
    return ApiCall("GET", paths.HEALTH, Health)


def ready_call() -> ApiCall[Ready]:
    return ApiCall("GET", paths.READY, Ready, answer_statuses=frozenset({503}))


def _as_timeout(timeout: TimeoutOption) -> httpx.Timeout:
    return timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)


def _checked_retries(max_retries: int) -> int:
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0; got {max_retries}")
    return max_retries


class ClientCore:
    """Connection settings and every per-attempt decision of a client.

    `base_url` None: `TRACE_URL`; `token` None: `TRACE_TOKEN` (unset or empty: no token).
    """

    def __init__(
        self,
        base_url: str | None,
        *,
        token: str | None,
        timeout: TimeoutOption,
        max_retries: int,
        backoff: Backoff | None,
    ) -> None:
        source = "base_url"
        if base_url is None:
            source, base_url = URL_VARIABLE, os.environ.get(URL_VARIABLE, "")
            if not base_url:
                raise ValueError(f"no service URL: pass base_url or set {URL_VARIABLE}")
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"{source} must be an absolute http(s) URL; got {base_url!r}")
        if token is None:
            token = os.environ.get(TOKEN_VARIABLE) or None
        elif not token.strip():
            raise ValueError("token must not be empty; pass None for a service without auth")
        self.base_url = str(url).rstrip("/")
        self.timeout = _as_timeout(timeout)
        self.max_retries = _checked_retries(max_retries)
        self.backoff = backoff or Backoff()
        self.headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"

    def with_options(self, *, timeout: TimeoutOption | None, max_retries: int | None) -> "ClientCore":
        """A copy with another default timeout or retry count (None: keep this one's)."""
        changed = copy.copy(self)
        if timeout is not None:
            changed.timeout = _as_timeout(timeout)
        if max_retries is not None:
            changed.max_retries = _checked_retries(max_retries)
        return changed

    def build_request(
        self, http: httpx.Client | httpx.AsyncClient, call: ApiCall[ModelT], timeout: TimeoutOption | None
    ) -> httpx.Request:
        """The request, built once so that every attempt sends the same bytes and headers; `timeout`
        None: the client's."""
        headers = {**self.headers, **call.headers}
        if call.body is not None:
            headers["Content-Type"] = "application/json"
        return http.build_request(
            call.method,
            self.base_url + call.path,
            content=call.body,
            params=dict(call.params),
            headers=headers,
            timeout=self.timeout if timeout is None else _as_timeout(timeout),
        )

    def delay_after_error(self, call: ApiCall[ModelT], error: Exception, attempt: int) -> float | None:
        """Seconds before the next attempt after attempt `attempt` (0-based) failed in transport, or
        None: no retries left."""
        if attempt >= self.max_retries:
            return None
        delay = self.backoff.delay(attempt, None)
        self._log_retry(call, attempt, delay, f"{type(error).__name__}: {error}")
        return delay

    def delay_after_response(
        self, call: ApiCall[ModelT], response: httpx.Response, attempt: int
    ) -> float | None:
        """Seconds before the next attempt, or None: the answer is final (`parse` it)."""
        status = response.status_code
        if status not in RETRY_STATUSES or status in call.answer_statuses or attempt >= self.max_retries:
            return None
        retry_after = parse_retry_after(response.headers.get("Retry-After"), time.time())
        delay = self.backoff.delay(attempt, retry_after)
        reason = f"{status} {response.reason_phrase}"
        if retry_after is not None and retry_after > delay:
            reason += f", Retry-After {retry_after:g} s capped"
        request_id = response.headers.get(paths.REQUEST_ID_HEADER)
        if request_id is not None:
            reason += f", request id {request_id}"
        self._log_retry(call, attempt, delay, reason)
        return delay

    def _log_retry(self, call: ApiCall[ModelT], attempt: int, delay: float, reason: str) -> None:
        logger.info(
            "retrying %s %s%s in %.2f s (retry %d of %d): %s",
            call.method,
            self.base_url,
            call.path,
            delay,
            attempt + 1,
            self.max_retries,
            reason,
        )

    def parse(self, call: ApiCall[ModelT], response: httpx.Response) -> ModelT:
        """The answer as its model; an error status raises the matching `TraceAPIError`."""
        status = response.status_code
        if not (200 <= status < 300 or status in call.answer_statuses):
            raise api_error(response)
        try:
            return call.model.model_validate_json(response.content)
        except ValidationError as error:
            first = error.errors()[0]
            raise TraceResponseError(
                f"{call.method} {call.path}: the answer is not a valid {call.model.__name__} "
                f"({'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']})",
                status=status,
                request_id=response.headers.get(paths.REQUEST_ID_HEADER),
            ) from error

    def connection_error(
        self, call: ApiCall[ModelT], error: Exception, attempts: int
    ) -> TraceConnectionError:
        kind = TraceTimeoutError if isinstance(error, httpx.TimeoutException) else TraceConnectionError
        return kind(
            f"{call.method} {self.base_url}{call.path}: {type(error).__name__}: {error}", attempts=attempts
        )


def api_error(response: httpx.Response) -> TraceAPIError:
    """The exception for an error answer: from its problem details, or from the bare status if the
    body is not one (a proxy or load balancer answered)."""
    status = response.status_code
    header_request_id = response.headers.get(paths.REQUEST_ID_HEADER)
    try:
        problem = ErrorResponse.model_validate_json(response.content)
    except ValidationError:
        title = response.reason_phrase or "HTTP error"
        body = response.text.strip()
        detail = body[:_SHOWN_BODY_CHARS] + ("…" if len(body) > _SHOWN_BODY_CHARS else "") if body else title
        return error_class(status)(status=status, title=title, detail=detail, request_id=header_request_id)
    return error_class(status)(
        status=status,
        title=problem.title,
        detail=problem.detail,
        request_id=problem.request_id or header_request_id,
        errors=problem.errors or (),
        problem_type=problem.type,
    )
