"""`GET /healthz` (liveness) and `GET /readyz` (readiness)."""

from typing import Literal

from pydantic import Field

from trace_proto.v1.common import API_VERSION, ResponseModel


class Health(ResponseModel):
    """The process is alive; says nothing about its dependencies."""

    status: Literal["ok"] = "ok"
    api_version: str = API_VERSION


class Ready(ResponseModel):
    """Whether this replica can serve; sent with 200 when ready and 503 when not."""

    ready: bool
    store: bool = Field(description="The tree store answers.")
    predictor: bool = Field(description="A predictor (possibly the cold-start one) is loaded.")
