"""The worker's transition log lines as JSON (django_reliable_executor.logging.JsonFormatter), read
from a real runexecutor's log file on every storage: the fields of each transition, and the
trace id of the submitter's trace when the task was submitted in one."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import TracerProvider

from django_reliable_executor import TaskStatus
from tests.conftest import db_params, require
from tests.support.processes import Backend, complete_lines, service_for, wait_until

tracer = TracerProvider().get_tracer("tests")  # a provider of this module's own


def json_lines(path) -> list[dict]:
    return [json.loads(line) for line in complete_lines(path)]


@pytest.mark.parametrize("alias", db_params(["default", "mariadb", "postgres", "redis"]))
def test_transition_lines_carry_their_fields_as_json(alias, key_prefix, workers, tmp_path):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    log_file = tmp_path / "worker.jsonl"
    with tracer.start_as_current_span("submitter") as submitter:
        service.submit("demo.traced", {"fail_times": 1}, task_id="traced")
    service.submit("demo.traced", task_id="plain")  # outside any trace
    worker = workers.start(
        backend,
        log_level="INFO",
        env={"RE_LOG_JSON": str(log_file), "RE_OTEL_SPANS": str(tmp_path / "spans.jsonl")},
    )
    for task_id in ("traced", "plain"):
        wait_until(
            lambda task_id=task_id: service.get_task(task_id).status is TaskStatus.COMPLETED,
            60,
            f"task {task_id} did not complete",
            logs=workers.logs,
        )

    def transitions(task_id: str) -> list[dict]:
        return [line for line in json_lines(log_file) if line.get("task_id") == task_id]

    # The completion is logged by the writer just after it is stored: wait for its line.
    lines = wait_until(
        lambda: len(transitions("traced")) >= 4 and transitions("traced"),
        30,
        "the worker logged no completion line",
        logs=workers.logs,
    )
    steps = [(line["from"], line["to"], line["attempt"]) for line in lines]
    assert steps == [
        ("claimed", "RUNNING", 1),
        ("RUNNING", "PENDING", 1),
        ("claimed", "RUNNING", 2),
        ("RUNNING", "COMPLETED", 2),
    ]
    trace_id = format(submitter.get_span_context().trace_id, "032x")
    for line in lines:
        assert line["task_name"] == "demo.traced"
        assert line["worker_id"] == worker.worker_id
        assert line["queue"] == "default"
        assert line["trace_id"] == trace_id
        assert line["logger"] == "django_reliable_executor"
        assert line["message"].startswith("task traced (demo.traced) ")
        assert line["time"].endswith("+00:00")
    assert [line["level"] for line in lines] == ["INFO", "WARNING", "INFO", "INFO"]
    # How long each attempt ran, once it ended; none for a start.
    assert [isinstance(line["duration_ms"], int) for line in lines] == [False, True, False, True]
    assert all(line["duration_ms"] >= 0 for line in lines if line["duration_ms"] is not None)
    plain = wait_until(
        lambda: len(transitions("plain")) >= 2 and transitions("plain"),
        30,
        "no lines of the untraced task",
        logs=workers.logs,
    )
    assert [(line["from"], line["to"]) for line in plain] == [
        ("claimed", "RUNNING"),
        ("RUNNING", "COMPLETED"),
    ]
    # A task submitted outside a trace: a root span in the worker; its completion, logged by
    # the completion writer after the span ended, has no trace id.
    assert "trace_id" not in plain[-1]
