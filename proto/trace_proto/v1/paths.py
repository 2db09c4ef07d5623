"""URL paths and headers of the v1 API, shared by the server's routers and the client."""

from typing import Final

ALLOCATE: Final = "/v1/allocate"
EXPAND: Final = "/v1/expand"
INSTRUCTIONS: Final = "/v1/instructions"
TREE: Final = "/v1/trees/{tree_id}"
TREE_CLOSE: Final = "/v1/trees/{tree_id}/close"
PREDICTOR: Final = "/v1/predictor"
PREDICT: Final = "/v1/predict"
JOB: Final = "/v1/jobs/{job}"
JOB_STATS: Final = "/v1/jobs/{job}/stats"
HEALTH: Final = "/healthz"
READY: Final = "/readyz"
METRICS: Final = "/metrics"

IDEMPOTENCY_KEY_HEADER: Final = "Idempotency-Key"
REQUEST_ID_HEADER: Final = "X-Request-ID"
