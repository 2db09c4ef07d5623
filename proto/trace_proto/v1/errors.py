"""The one error shape of the v1 API: RFC 9457 problem details plus the request id."""

from typing import Annotated

from pydantic import Field

from trace_proto.v1.common import ResponseModel

PROBLEM_MEDIA_TYPE = "application/problem+json"


class ErrorItem(ResponseModel):
    """One invalid part of a request."""

    loc: list[str | int] = Field(
        description="Path to the offending value, e.g. ['body', 'prompts', 3, 'features']."
    )
    msg: str
    type: str | None = Field(default=None, description="Machine-readable kind, e.g. 'greater_than_equal'.")


class ErrorResponse(ResponseModel):
    """Every error the service answers, with `Content-Type: application/problem+json`."""

    type: str = Field(default="about:blank", description="URI identifying the problem type.")
    title: str = Field(description="Short summary of the problem type, e.g. 'Not Found'.")
    status: Annotated[int, Field(ge=400, le=599)]
    detail: str = Field(description="What went wrong with this request, for a person.")
    request_id: str = Field(description="Also in the X-Request-ID header; quote it when reporting a problem.")
    errors: list[ErrorItem] | None = Field(default=None, description="Each invalid part of the request.")
