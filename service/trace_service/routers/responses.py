"""The error responses every route documents (one body shape: ErrorResponse)."""

from __future__ import annotations

from typing import Any

from trace_proto import PROBLEM_MEDIA_TYPE, ErrorResponse

_PROBLEM = {"model": ErrorResponse, "content": {PROBLEM_MEDIA_TYPE: {}}}

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {**_PROBLEM, "description": "Missing or invalid bearer token"},
    413: {**_PROBLEM, "description": "Request body too large"},
    422: {**_PROBLEM, "description": "Invalid request"},
    503: {**_PROBLEM, "description": "Tree store unavailable; retry after Retry-After seconds"},
}
#: The 503 of a route that starts new work: the store may also be full.
STORE_FULL = (
    "Tree store unavailable, or full (new allocations wait for trees to finish and be freed); retry "
    "after Retry-After seconds"
)
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {**_PROBLEM, "description": "Unknown tree or job"}}
