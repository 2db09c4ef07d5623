"""The service's log lines: plain text, or one JSON object per line for log pipelines (Kubernetes,
Loki, Elasticsearch), each with the id of the request it was logged under (and, traced, its trace).

`logging_config` is handed to uvicorn, so its own loggers (startup, access log) go through the same
handler and format as the service's.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from trace_service.middleware import REQUEST_ID
from trace_service.settings import LogFormat
from trace_service.telemetry import active_span_ids

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


class RequestIdFilter(logging.Filter):
    """Stamps each record with the current request id ("-" outside a request, as the middleware's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


#: What every record has (and what formatters add to it): any other attribute came with ``extra=``.
#: ``color_message`` is uvicorn's copy of its message with terminal colours.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, request_id; trace_id
    and span_id (hex) when a span is active; the fields given with ``extra=`` (a value JSON cannot hold
    as its repr); the traceback as `exception` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", REQUEST_ID.get()),
        }
        # Formatted where it was logged (a StreamHandler does not hand records to another thread).
        if (span_ids := active_span_ids()) is not None:
            entry["trace_id"], entry["span_id"] = span_ids
        # A private attribute is another library's (ray's record factory stamps `_ray_timestamp_ns`).
        extra = {
            name: value
            for name, value in vars(record).items()
            if name not in _RECORD_ATTRIBUTES and name not in entry and not name.startswith("_")
        }
        entry.update(extra)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        try:
            return json.dumps(entry, ensure_ascii=False, default=repr)
        except (TypeError, ValueError):  # an extra that no repr inside it mends: non-string keys, a cycle
            entry.update((name, _json_or_repr(value)) for name, value in extra.items())
            return json.dumps(entry, ensure_ascii=False, default=repr)


def _json_or_repr(value: object) -> object:
    try:
        json.dumps(value, default=repr)
    except (TypeError, ValueError):
        return repr(value)
    return value


def logging_config(level: str, log_format: LogFormat) -> dict[str, Any]:
    """A `logging.config.dictConfig` document: every logger, uvicorn's included, to stderr through one
    handler that adds the request id, at `level`."""
    formatter: dict[str, Any] = {"()": JsonFormatter} if log_format == "json" else {"format": TEXT_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}},
        "formatters": {"service": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "service",
                "filters": ["request_id"],
            }
        },
        # uvicorn's loggers bring handlers of their own by default; here they hand records to the root.
        "loggers": {
            name: {"handlers": [], "propagate": True, "level": level}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
        "root": {"handlers": ["stderr"], "level": level},
    }
