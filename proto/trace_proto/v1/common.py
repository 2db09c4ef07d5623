"""Base classes and field types shared by every v1 model.

Requests are validated strictly: unknown fields are rejected (a typo must not silently fall back to a
default) and numbers are not coerced from strings or booleans (`"5"` or `true` for a count is a
caller's bug). Responses are tolerant readers: a client built against v1 ignores fields a newer server
adds, and their numbers are ordinary (lax) types so that the server can build them from numpy scalars.
Every model is immutable.
"""

from typing import Annotated, Final

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat

from trace_proto.v1.limits import JOB_PATTERN, MAX_FEATURE_DIM, MAX_ID_LENGTH, MAX_TEXT_LENGTH


class RequestModel(BaseModel):
    """A body or query the server receives: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ResponseModel(BaseModel):
    """A body the server sends: unknown fields are ignored so that v1 can grow additively."""

    model_config = ConfigDict(extra="ignore", frozen=True)


# Request field types (strict).


def _integral(value: object) -> object:
    """A float with no fractional part (``4.0``) as the integer it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: Written last in a request integer's ``Annotated[StrictInt, Field(...), Integral]``: a JSON number
#: without a fractional part, ``4`` or ``4.0`` (both are integers to JSON Schema) is taken; a string, a
#: boolean or ``4.5`` is not.
Integral = BeforeValidator(_integral)
FiniteFloat = Annotated[StrictFloat, Field(allow_inf_nan=False)]
FeatureVector = Annotated[list[FiniteFloat], Field(min_length=1, max_length=MAX_FEATURE_DIM)]

# Response field types (lax).
Count = Annotated[int, Field(ge=0)]
Real = Annotated[float, Field(allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Correlation = Annotated[float, Field(ge=-1.0, le=1.0, allow_inf_nan=False)]

# Requests and responses.
Identifier = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]
JobName = Annotated[str, Field(pattern=JOB_PATTERN, description="Letters, digits, '_', '.', '-'.")]
Text = Annotated[str, Field(max_length=MAX_TEXT_LENGTH)]

API_VERSION: Final = "v1"
DEFAULT_JOB: Final = "default"


def repeated(values: list[str], shown: int = 5) -> list[str]:
    """The values that occur more than once, in first-repeat order, at most `shown` of them."""
    seen: set[str] = set()
    repeats: dict[str, None] = {}
    for value in values:
        if value in seen:
            repeats[value] = None
            if len(repeats) == shown:
                break
        seen.add(value)
    return list(repeats)
