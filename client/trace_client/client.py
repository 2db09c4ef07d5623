"""`TraceClient` (blocking) and `AsyncTraceClient` (asyncio) for the v1 API.

Both are thin loops around `trace_client._core`: build the request once, send it, and on a retryable
failure sleep and send the same request again.

    with TraceClient("http://trace:8000", token="...") as client:
        allocation = client.allocate(AllocateRequest(step=0, budget=512, prompts=pool))
        patient = client.with_options(timeout=120.0)  # same connections, another default
"""

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self

import httpx

from trace_client import _core
from trace_client._core import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    ApiCall,
    Backoff,
    ClientCore,
    ModelT,
    OnRejected,
    TimeoutOption,
    checked_expand,
)
from trace_proto import (
    DEFAULT_JOB,
    AllocateRequest,
    AllocateResponse,
    ExpandEvent,
    ExpandResponse,
    Health,
    HistoryIn,
    InstructionsResponse,
    JobDeleted,
    JobStats,
    PredictorInfo,
    PredictResponse,
    Ready,
    TreeResponse,
)
from trace_proto.v1.limits import DEFAULT_CLAIM


class _Options:
    """What both clients share: the call core and whether they own their HTTP client."""

    _core: ClientCore
    _owns_http: bool

    def with_options(self, *, timeout: TimeoutOption | None = None, max_retries: int | None = None) -> Self:
        """This client with another default timeout or retry count (None: keep), sending through the
        same connections, as openai-python's `with_options`; closing the copy leaves them open."""
        changed = copy.copy(self)
        changed._core = self._core.with_options(timeout=timeout, max_retries=max_retries)
        changed._owns_http = False
        return changed


class TraceClient(_Options):
    """Blocking client of the trace-rollout v1 API.

    Args:
        base_url: The service, e.g. `http://trace-rollout:8000` (a path prefix is kept); by default
            the `TRACE_URL` environment variable.
        token: Bearer token, when the service requires one; by default `TRACE_TOKEN` (unset or
            empty: none).
        timeout: Per-attempt limits (seconds, or an `httpx.Timeout` for connect/read/write/pool);
            every call also takes a `timeout` of its own.
        max_retries: Retries after the first attempt, on connection failures, timeouts and
            408/429/500/502/503/504; never on other statuses. Each retry is logged at INFO on the
            `trace_client` logger.
        backoff: Wait between attempts (exponential with full jitter; a `Retry-After` is honoured up
            to `Backoff.max_retry_after`).
        http_client: An `httpx.Client` to send through (it is not closed by `close`); by default the
            client makes and owns one.
        transport: Transport of the client this one makes (e.g. `httpx.MockTransport` in tests).
        sleep: How to wait between attempts (tests pass a recorder).

    Raises (from every call): `ValueError` for a request that v1 rejects, before anything is sent
    (and from the constructor, for bad options or no URL at all);
    `TraceAPIError` subclasses for error answers; `TraceConnectionError` / `TraceTimeoutError` once
    retries are exhausted; `TraceResponseError` for an answer that is not the v1 shape.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        timeout: TimeoutOption = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff: Backoff | None = None,
        http_client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if http_client is not None and transport is not None:
            raise ValueError("pass either http_client or transport, not both")
        self._core = ClientCore(
            base_url, token=token, timeout=timeout, max_retries=max_retries, backoff=backoff
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(transport=transport)
        self._sleep = sleep

    def allocate(
        self,
        request: AllocateRequest,
        *,
        idempotency_key: str | None = None,
        timeout: TimeoutOption | None = None,
    ) -> AllocateResponse:
        """`POST /v1/allocate`. Retries reuse one idempotency key, so a retry never allocates twice."""
        return self._send(_core.allocate_call(request, idempotency_key), timeout)

    def expand(
        self,
        events: Sequence[ExpandEvent],
        *,
        timeout: TimeoutOption | None = None,
        on_rejected: OnRejected = "warn",
    ) -> ExpandResponse:
        """`POST /v1/expand`: report finished turns; the answer carries new branching instructions.
        Events the service refused are in the answer's `rejected`; ``on_rejected`` says whether to log
        a warning about them (the default), raise `TraceRejectedEventsError`, or say nothing."""
        return checked_expand(self._send(_core.expand_call(events), timeout), on_rejected)

    def claim_instructions(
        self,
        job: str = DEFAULT_JOB,
        max_instructions: int = DEFAULT_CLAIM,
        *,
        timeout: TimeoutOption | None = None,
    ) -> InstructionsResponse:
        """`GET /v1/instructions`: lease up to `max_instructions` instructions nobody has started."""
        return self._send(_core.claim_call(job, max_instructions), timeout)

    def get_tree(self, tree_id: str, *, timeout: TimeoutOption | None = None) -> TreeResponse:
        """`GET /v1/trees/{tree_id}`."""
        return self._send(_core.tree_call(tree_id), timeout)

    def close_tree(self, tree_id: str, *, timeout: TimeoutOption | None = None) -> TreeResponse:
        """`POST /v1/trees/{tree_id}/close`: stop waiting for outstanding rollouts; returns the tree."""
        return self._send(_core.close_tree_call(tree_id), timeout)

    def predictor_info(
        self, job: str = DEFAULT_JOB, *, timeout: TimeoutOption | None = None
    ) -> PredictorInfo:
        """`GET /v1/predictor`: the job's predictor."""
        return self._send(_core.predictor_call(job), timeout)

    def predict(
        self, histories: Sequence[HistoryIn], *, job: str = DEFAULT_JOB, timeout: TimeoutOption | None = None
    ) -> PredictResponse:
        """`POST /v1/predict`: Ṽ(H) for each history, in order."""
        return self._send(_core.predict_call(histories, job), timeout)

    def job_stats(
        self,
        job: str = DEFAULT_JOB,
        *,
        from_step: int | None = None,
        to_step: int | None = None,
        timeout: TimeoutOption | None = None,
    ) -> JobStats:
        """`GET /v1/jobs/{job}/stats`, over the steps in `[from_step, to_step]` when given."""
        return self._send(_core.job_stats_call(job, from_step, to_step), timeout)

    def delete_job(self, job: str, *, timeout: TimeoutOption | None = None) -> JobDeleted:
        """`DELETE /v1/jobs/{job}`: everything of the job, its predictor included."""
        return self._send(_core.delete_job_call(job), timeout)

    def health(self, *, timeout: TimeoutOption | None = None) -> Health:
        """`GET /healthz`."""
        return self._send(_core.health_call(), timeout)

    def ready(self, *, timeout: TimeoutOption | None = None) -> Ready:
        """`GET /readyz`: a "not ready" answer (503) is returned, not raised or retried."""
        return self._send(_core.ready_call(), timeout)

    def close(self) -> None:
        """Close the HTTP client if this object made it."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _send(self, call: ApiCall[ModelT], timeout: TimeoutOption | None) -> ModelT:
        request = self._core.build_request(self._http, call, timeout)
        attempt = 0
        while True:
            try:
                response = self._http.send(request)
            except _core.RETRYABLE_TRANSPORT_ERRORS as error:
                delay = self._core.delay_after_error(call, error, attempt)
                if delay is None:
                    raise self._core.connection_error(call, error, attempt + 1) from error
            else:
                delay = self._core.delay_after_response(call, response, attempt)
                if delay is None:
                    return self._core.parse(call, response)
            self._sleep(delay)
            attempt += 1


class AsyncTraceClient(_Options):
    """Asyncio client of the trace-rollout v1 API; the same calls as `TraceClient`, awaited.

    Arguments as for `TraceClient`, with an `httpx.AsyncClient`, an `httpx.AsyncBaseTransport` and
    an awaitable `sleep`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        timeout: TimeoutOption = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff: Backoff | None = None,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if http_client is not None and transport is not None:
            raise ValueError("pass either http_client or transport, not both")
        self._core = ClientCore(
            base_url, token=token, timeout=timeout, max_retries=max_retries, backoff=backoff
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(transport=transport)
        self._sleep = sleep

    async def allocate(
        self,
        request: AllocateRequest,
        *,
        idempotency_key: str | None = None,
        timeout: TimeoutOption | None = None,
    ) -> AllocateResponse:
        """`POST /v1/allocate`. Retries reuse one idempotency key, so a retry never allocates twice."""
        return await self._send(_core.allocate_call(request, idempotency_key), timeout)

    async def expand(
        self,
        events: Sequence[ExpandEvent],
        *,
        timeout: TimeoutOption | None = None,
        on_rejected: OnRejected = "warn",
    ) -> ExpandResponse:
        """`POST /v1/expand`, as `TraceClient.expand`."""
        return checked_expand(await self._send(_core.expand_call(events), timeout), on_rejected)

    async def claim_instructions(
        self,
        job: str = DEFAULT_JOB,
        max_instructions: int = DEFAULT_CLAIM,
        *,
        timeout: TimeoutOption | None = None,
    ) -> InstructionsResponse:
        """`GET /v1/instructions`: lease up to `max_instructions` instructions nobody has started."""
        return await self._send(_core.claim_call(job, max_instructions), timeout)

    async def get_tree(self, tree_id: str, *, timeout: TimeoutOption | None = None) -> TreeResponse:
        """`GET /v1/trees/{tree_id}`."""
        return await self._send(_core.tree_call(tree_id), timeout)

    async def close_tree(self, tree_id: str, *, timeout: TimeoutOption | None = None) -> TreeResponse:
        """`POST /v1/trees/{tree_id}/close`: stop waiting for outstanding rollouts; returns the tree."""
        return await self._send(_core.close_tree_call(tree_id), timeout)

    async def predictor_info(
        self, job: str = DEFAULT_JOB, *, timeout: TimeoutOption | None = None
    ) -> PredictorInfo:
        """`GET /v1/predictor`: the job's predictor."""
        return await self._send(_core.predictor_call(job), timeout)

    async def predict(
        self, histories: Sequence[HistoryIn], *, job: str = DEFAULT_JOB, timeout: TimeoutOption | None = None
    ) -> PredictResponse:
        """`POST /v1/predict`: Ṽ(H) for each history, in order."""
        return await self._send(_core.predict_call(histories, job), timeout)

    async def job_stats(
        self,
        job: str = DEFAULT_JOB,
        *,
        from_step: int | None = None,
        to_step: int | None = None,
        timeout: TimeoutOption | None = None,
    ) -> JobStats:
        """`GET /v1/jobs/{job}/stats`, over the steps in `[from_step, to_step]` when given."""
        return await self._send(_core.job_stats_call(job, from_step, to_step), timeout)

    async def delete_job(self, job: str, *, timeout: TimeoutOption | None = None) -> JobDeleted:
        """`DELETE /v1/jobs/{job}`: everything of the job, its predictor included."""
        return await self._send(_core.delete_job_call(job), timeout)

    async def health(self, *, timeout: TimeoutOption | None = None) -> Health:
        """`GET /healthz`."""
        return await self._send(_core.health_call(), timeout)

    async def ready(self, *, timeout: TimeoutOption | None = None) -> Ready:
        """`GET /readyz`: a "not ready" answer (503) is returned, not raised or retried."""
        return await self._send(_core.ready_call(), timeout)

    async def aclose(self) -> None:
        """Close the HTTP client if this object made it."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _send(self, call: ApiCall[ModelT], timeout: TimeoutOption | None) -> ModelT:
        request = self._core.build_request(self._http, call, timeout)
        attempt = 0
        while True:
            try:
                response = await self._http.send(request)
            except _core.RETRYABLE_TRANSPORT_ERRORS as error:
                delay = self._core.delay_after_error(call, error, attempt)
                if delay is None:
                    raise self._core.connection_error(call, error, attempt + 1) from error
            else:
                delay = self._core.delay_after_response(call, response, attempt)
                if delay is None:
                    return self._core.parse(call, response)
            await self._sleep(delay)
            attempt += 1
