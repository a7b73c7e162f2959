"""JsonFormatter: log records as one JSON object per line, with the worker's transition fields."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

# The attributes every LogRecord has: what is left of a record's __dict__ came in extra=.
_STANDARD = frozenset(vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
# The fields of the worker's transition lines (announcing.transition_fields), first in order.
TRANSITION_FIELDS = (
    "task_id",
    "task_name",
    "from",
    "to",
    "attempt",
    "worker_id",
    "queue",
    "duration_ms",
    "trace_id",
)


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", <extra fields>, "exception"}`` per record, for
    log shippers. The worker's transition lines carry task_id, task_name, from, to, attempt,
    worker_id, queue, duration_ms (null until an attempt ends) and, when traced, trace_id;
    any other ``extra=`` field of any logger is kept too (values JSON cannot hold become
    strings). Use it in Django's LOGGING::

        "formatters": {"json": {"()": "django_reliable_executor.logging.JsonFormatter"}}
    """

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        values = record.__dict__
        for name in TRANSITION_FIELDS:
            if name in values:
                data[name] = values[name]
        for name, value in values.items():
            if name not in _STANDARD and name not in data:
                data[name] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return json.dumps(data, default=str, ensure_ascii=False)
