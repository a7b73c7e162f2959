"""JsonFormatter and the fields of a transition's log record, without a storage."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys

from django_reliable_executor.core.records import copy_with, created_info
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.observability.announcer import transition_fields
from django_reliable_executor.observability.json_logs import JsonFormatter
from django_reliable_executor.observability.tracing import trace_id_of

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def record(message: str, **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("unit.json")
    return logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, message, (), None, extra=extra
    )


def test_a_record_becomes_one_json_object_with_its_extra_fields():
    line = JsonFormatter().format(record("task %s", task_id="t1", to="FAILED", other=object()))
    data = json.loads(line)
    assert "\n" not in line
    assert (data["level"], data["logger"], data["task_id"], data["to"]) == (
        "WARNING",
        "unit.json",
        "t1",
        "FAILED",
    )
    assert data["other"].startswith("<object object")  # not JSON: as text
    assert dt.datetime.fromisoformat(data["time"]).tzinfo is not None


def test_the_exception_is_kept_as_text():
    try:
        raise ValueError("boom")
    except ValueError:
        logger = logging.getLogger("unit.json")
        rec = logger.makeRecord(
            logger.name, logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    data = json.loads(JsonFormatter().format(rec))
    assert data["exception"].endswith("ValueError: boom")


def test_transition_fields_of_an_ended_attempt():
    task = created_info("t1", "demo.echo", "mail", 0, None, 3, 2000, "fixed", None, T0, T0)
    started = copy_with(task, status=TaskStatus.RUNNING, attempts=1, started_at=T0, worker_id="w1")
    done = copy_with(
        started,
        status=TaskStatus.COMPLETED,
        finished_at=T0 + dt.timedelta(milliseconds=1500),
        trace_context={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"},
    )
    assert transition_fields(done, TaskStatus.RUNNING) == {
        "task_id": "t1",
        "task_name": "demo.echo",
        "from": "RUNNING",
        "to": "COMPLETED",
        "attempt": 1,
        "worker_id": "w1",
        "queue": "mail",
        "duration_ms": 1500,
        "trace_id": TRACE,
    }
    start = transition_fields(started, "claimed")
    assert (start["from"], start["to"], start["duration_ms"]) == ("claimed", "RUNNING", None)


def test_trace_id_of_a_stored_context():
    assert trace_id_of({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}) == TRACE
    assert trace_id_of({"traceparent": "garbage"}) is None
    assert trace_id_of(None) is None
