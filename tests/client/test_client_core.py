"""The client core's pure parts: backoff, Retry-After parsing, error classes; and the light install."""

import subprocess
import sys
from email.utils import formatdate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_client import (
    Backoff,
    TraceAPIError,
    TraceAuthError,
    TraceBadRequest,
    TraceServerError,
    TraceUnavailable,
    TraceValidationError,
)
from trace_client._core import parse_retry_after
from trace_client.errors import error_class

NOW = 1_750_000_000.0


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("0", 0.0),
        ("7", 7.0),
        (" 1.5 ", 1.5),
        ("-3", None),
        ("nan", None),
        ("inf", None),
        ("soon", None),
        ("", None),
        (formatdate(NOW + 42, usegmt=True), 42.0),
        (formatdate(NOW - 42, usegmt=True), 0.0),
        ("Sun, 06 Nov 1994 08:49:37 -0000", None),  # RFC 9110 dates are GMT; "-0000" means unknown zone
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, NOW) == expected


@given(
    retry=st.integers(0, 40),
    unit=st.floats(0.0, 1.0, exclude_max=True),
    initial=st.floats(0.01, 5.0),
    ratio=st.floats(1.0, 100.0),
)
def test_backoff_is_full_jitter_below_the_exponential_cap(
    retry: int, unit: float, initial: float, ratio: float
) -> None:
    backoff = Backoff(initial_delay=initial, max_delay=initial * ratio, uniform=lambda: unit)
    cap = min(initial * ratio, initial * 2.0**retry)
    delay = backoff.delay(retry, None)
    assert delay is not None
    assert delay == pytest.approx(unit * cap)
    assert 0.0 <= delay < cap


def test_backoff_stays_at_the_cap_for_any_retry_count() -> None:
    assert Backoff(initial_delay=1.0, max_delay=8.0, uniform=lambda: 1.0).delay(10_000, None) == 8.0


@given(retry_after=st.floats(0.0, 1_000.0), limit=st.floats(0.0, 1_000.0))
def test_backoff_honours_retry_after_capped_at_its_limit(retry_after: float, limit: float) -> None:
    backoff = Backoff(max_retry_after=limit, uniform=lambda: 0.5)
    assert backoff.delay(3, retry_after) == min(retry_after, limit)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"initial_delay": 0.0}, "0 < initial_delay <= max_delay"),
        ({"initial_delay": 2.0, "max_delay": 1.0}, "0 < initial_delay <= max_delay"),
        ({"max_retry_after": -1.0}, "max_retry_after must be >= 0"),
    ],
)
def test_backoff_rejects_bad_settings(options: dict[str, float], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        Backoff(**options)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, TraceBadRequest),
        (403, TraceAuthError),
        (418, TraceBadRequest),
        (422, TraceValidationError),
        (501, TraceServerError),
        (503, TraceUnavailable),
        (302, TraceAPIError),
    ],
)
def test_error_class_is_the_most_specific(status: int, expected: type[TraceAPIError]) -> None:
    assert error_class(status) is expected


def test_the_client_imports_no_heavy_dependency() -> None:
    heavy = ["torch", "numpy", "fastapi", "redis", "trace_service"]
    code = f"import sys, trace_client; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
