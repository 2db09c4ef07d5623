"""The service's log lines: text or JSON (`TRACE_LOG_FORMAT`), the request id on each, and a real
`trace-rollout serve` whose every stderr line is one JSON object."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from trace_lab.local import free_port, wait_for_port
from trace_service.logs import TEXT_FORMAT, JsonFormatter, RequestIdFilter
from trace_service.middleware import REQUEST_ID


def record(
    message: str, *args: object, exc_info: bool = False, extra: dict[str, object] | None = None
) -> logging.LogRecord:
    """A record as a logger makes it, stamped by the filter in the current context."""
    error = None
    if exc_info:
        try:
            raise RuntimeError("store down")
        except RuntimeError:
            error = sys.exc_info()
    made = logging.getLogger("trace_service.engine").makeRecord(
        "trace_service.engine", logging.WARNING, __file__, 1, message, args, error, extra=extra
    )
    assert RequestIdFilter().filter(made)
    return made


def test_a_json_line_carries_the_request_id_it_was_logged_under() -> None:
    token = REQUEST_ID.set("req-7")
    try:
        stamped = record("tree %s failed to apply", "t1")
    finally:
        REQUEST_ID.reset(token)
    entry = json.loads(JsonFormatter().format(stamped))
    assert entry.pop("time").endswith("+00:00")
    assert entry == {
        "level": "WARNING",
        "logger": "trace_service.engine",
        "message": "tree t1 failed to apply",
        "request_id": "req-7",
    }


def test_outside_a_request_the_id_is_a_dash() -> None:
    assert json.loads(JsonFormatter().format(record("sweeper: 3 trees closed")))["request_id"] == "-"


def test_a_traceback_stays_inside_its_one_json_line() -> None:
    line = JsonFormatter().format(record("round failed\nsecond line", exc_info=True))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "round failed\nsecond line"
    assert "RuntimeError: store down" in entry["exception"]


def test_the_fields_given_with_extra_are_kept_and_what_json_cannot_hold_is_its_repr() -> None:
    extra = {
        "tree_id": "t1",
        "rounds": 3,
        "budgets": [4, 2],
        "data_dir": Path("/var/trace"),
        "by_pair": {(1, 2): 3},
    }
    entry = json.loads(JsonFormatter().format(record("round placed", extra=extra)))
    assert entry["tree_id"] == "t1" and entry["rounds"] == 3 and entry["budgets"] == [4, 2]
    assert entry["data_dir"] == repr(Path("/var/trace"))
    assert entry["by_pair"] == "{(1, 2): 3}"  # tuple keys: JSON has none
    assert not {"args", "msg", "levelno", "pathname", "created"} & entry.keys()  # the record's own attributes


def test_a_json_line_logged_inside_a_span_carries_its_trace_and_span_ids() -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the tracing extra is not installed")
    outside = json.loads(JsonFormatter().format(record("sweeper: 3 trees closed")))
    assert "trace_id" not in outside and "span_id" not in outside
    with sdk.TracerProvider().get_tracer(__name__).start_as_current_span("POST /v1/expand") as span:
        entry = json.loads(JsonFormatter().format(record("tree %s failed to apply", "t1")))
    context = span.get_span_context()
    assert entry["trace_id"] == f"{context.trace_id:032x}"
    assert entry["span_id"] == f"{context.span_id:016x}"


def test_a_text_line_shows_the_request_id() -> None:
    token = REQUEST_ID.set("req-8")
    try:
        line = logging.Formatter(TEXT_FORMAT).format(record("lease %d expired", 3))
    finally:
        REQUEST_ID.reset(token)
    assert line.endswith(" WARNING trace_service.engine [req-8] lease 3 expired")


def test_serve_with_json_logs_writes_only_json_lines_with_request_ids() -> None:
    port = free_port()
    environment = {
        **os.environ,
        "TRACE_LOG_FORMAT": "json",
        "TRACE_STORE_URL": "",
        "TRACE_TORCH_THREADS": "1",
    }
    command = [sys.executable, "-m", "trace_service.cli", "serve", "--port", str(port)]
    server = subprocess.Popen(command, env=environment, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(server.stderr or []), daemon=True)
    reader.start()
    try:
        wait_for_port(port, timeout=120.0)
        for request_id in ("probe-1", "probe-2"):
            answer = httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"X-Request-ID": request_id})
            assert answer.status_code == 200
        # the access log is written after the answer: wait for both lines, however busy the machine
        deadline = time.monotonic() + 120
        while sum('"uvicorn.access"' in line for line in list(lines)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.terminate()
        server.wait(timeout=60)
        reader.join(timeout=60)
    stderr = "".join(lines)
    entries = [json.loads(line) for line in stderr.splitlines()]  # every line parses
    assert {"Started server process", "Application startup complete."} <= {
        entry["message"].split(" [")[0] for entry in entries
    }
    access = [entry for entry in entries if entry["logger"] == "uvicorn.access"]
    assert [entry["request_id"] for entry in access] == ["probe-1", "probe-2"]
    assert all('"GET /healthz HTTP/1.1" 200' in entry["message"] for entry in access)
    assert all(entry.keys() >= {"time", "level", "logger", "message", "request_id"} for entry in entries)
