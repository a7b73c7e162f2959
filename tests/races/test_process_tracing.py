"""Tracing across a real runexecutor: the submitter's span is the parent of each attempt's run
span (thread pool on every storage; the event loop and the process pool on SQLite and Redis), a
schedule's run is a root span, and a worker without OpenTelemetry runs as before.

The test process records its own spans with the SDK's InMemorySpanExporter; the worker writes
its spans to a file (RE_OTEL_SPANS, testproject/observability.py), read back here.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest
from django.utils import timezone
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_reliable_executor import TaskStatus
from django_reliable_executor.core.records import TaskSubmitRequest
from tests.conftest import db_params, require
from tests.support.processes import MANAGE, ROOT, Backend, complete_lines, service_for, wait_until

exporter = InMemorySpanExporter()
provider = TracerProvider()  # this module's own: the global provider stays untouched
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("tests")


def read_spans(path) -> list[dict]:
    return [json.loads(line) for line in complete_lines(path)]


def ids(span) -> tuple[str, str]:
    """An SDK span's trace id and span id, in hex as the worker's file has them."""
    return format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")


def run_traced(backend: Backend, workers, tmp_path, task_name: str, *args: str):
    """Submit ``task_name`` (failing its first attempt) inside a span of this process, run a
    worker with tracing on until the task completes; return the submitter span's ids, the
    task, and the spans the worker (and its children) recorded."""
    service = service_for(backend)
    spans_file = tmp_path / "spans.jsonl"
    with tracer.start_as_current_span("submitter") as submitter:
        service.submit(task_name, {"fail_times": 1}, task_id="traced")
    worker = workers.start(backend, *args, env={"RE_OTEL_SPANS": str(spans_file)})
    wait_until(
        lambda: service.get_task("traced").status is TaskStatus.COMPLETED,
        60,
        "the traced task did not complete",
        logs=workers.logs,
    )
    info = service.get_task("traced")
    runs = wait_until(
        lambda: (
            len([s for s in read_spans(spans_file) if s["name"].startswith("run ")]) >= 2
            and read_spans(spans_file)
        ),
        30,
        "the worker wrote no run spans",
        logs=workers.logs,
    )
    return ids(submitter), info, runs, worker.worker_id


def check_attempts(submitter, info, spans, worker_id: str, task_name: str) -> list[dict]:
    """Two attempts: two run spans, children of the submitter's span in its trace; the
    first ERROR with the exception recorded, the second not. Returns them in attempt order."""
    trace_id, span_id = submitter
    assert info.trace_context["traceparent"].split("-")[1:3] == [trace_id, span_id]
    runs = sorted(
        (s for s in spans if s["name"] == f"run {task_name}"),
        key=lambda s: s["attributes"]["attempt"],
    )
    assert [s["attributes"]["attempt"] for s in runs] == [1, 2]
    for run in runs:
        assert (run["trace_id"], run["parent_span_id"]) == (trace_id, span_id)
        assert run["kind"] == "CONSUMER"
        assert run["attributes"]["task_id"] == "traced"
        assert run["attributes"]["queue"] == "default"
        assert run["attributes"]["worker_id"] == worker_id
    failed, succeeded = runs
    assert failed["status"] == "ERROR"
    exception = next(e for e in failed["events"] if e["name"] == "exception")
    assert "ConnectionError" in exception["attributes"]["exception.type"]
    assert "upstream not reachable" in exception["attributes"]["exception.message"]
    assert succeeded["status"] != "ERROR"
    assert succeeded["span_id"] != failed["span_id"]
    # The handler's own span, in each attempt, is the run span's child.
    inner = [s for s in spans if s["name"] == "demo inner"]
    assert sorted(s["parent_span_id"] for s in inner) == sorted(s["span_id"] for s in runs)
    assert {s["trace_id"] for s in inner} == {trace_id}
    return runs


@pytest.mark.parametrize("alias", db_params(["default", "mariadb", "postgres", "redis"]))
def test_each_attempt_is_a_span_of_the_submitters_trace(alias, key_prefix, workers, tmp_path):
    require(alias)
    backend = Backend(alias, key_prefix)
    submitter, info, spans, worker_id = run_traced(backend, workers, tmp_path, "demo.traced")
    check_attempts(submitter, info, spans, worker_id, "demo.traced")


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_an_async_handlers_attempts_are_spans_too(alias, key_prefix, workers, tmp_path):
    require(alias)
    backend = Backend(alias, key_prefix)
    submitter, info, spans, worker_id = run_traced(backend, workers, tmp_path, "demo.async_traced")
    check_attempts(submitter, info, spans, worker_id, "demo.async_traced")


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_process_pool_run_spans_wrap_the_childs_run(alias, key_prefix, workers, tmp_path):
    require(alias)
    backend = Backend(alias, key_prefix)
    submitter, info, spans, worker_id = run_traced(
        backend, workers, tmp_path, "demo.traced", "--pool", "process", "--max-pool-size", "1"
    )
    runs = check_attempts(submitter, info, spans, worker_id, "demo.traced")
    # The run spans are the worker's; the handler's spans were recorded in the child.
    inner = [s for s in spans if s["name"] == "demo inner"]
    assert {s["pid"] for s in runs}.isdisjoint({s["pid"] for s in inner})


@pytest.mark.parametrize("alias", db_params(["default", "mariadb", "postgres", "redis"]))
def test_submit_many_stores_the_trace_context_and_schedules_do_not(alias, key_prefix):
    require(alias)
    service = service_for(Backend(alias, key_prefix))
    with tracer.start_as_current_span("batch") as batch:
        infos = service.submit_many(
            [TaskSubmitRequest("demo.noop", task_id=f"m{i}") for i in range(3)]
        )
        service.schedule("sched", "demo.noop", every=3600)
    trace_id, span_id = ids(batch)
    for info in [*infos, *(service.get_task(f"m{i}") for i in range(3))]:
        assert info.trace_context["traceparent"].split("-")[:3] == ["00", trace_id, span_id]
    untraced = service.submit("demo.noop", task_id="outside")
    assert untraced.trace_context is None
    assert service.get_task("outside").trace_context is None


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_a_schedules_run_is_a_root_span(alias, key_prefix, workers, tmp_path):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    spans_file = tmp_path / "spans.jsonl"
    workers.start(backend, env={"RE_OTEL_SPANS": str(spans_file)})
    start = timezone.now().replace(microsecond=0) + dt.timedelta(seconds=1)
    with tracer.start_as_current_span("scheduler"):  # not carried over to the runs
        service.schedule("beat", "demo.traced", every=3600, start_at=start)

    def run_span() -> dict | None:
        return next((s for s in read_spans(spans_file) if s["name"] == "run demo.traced"), None)

    span = wait_until(run_span, 60, "the schedule's run left no span", logs=workers.logs)
    assert span["parent_span_id"] is None
    assert span["attributes"]["task_id"].startswith("beat@")
    fired = service.get_task(span["attributes"]["task_id"])
    assert fired.trace_context is None


def blocked_environment(attempts) -> dict[str, str]:
    return {
        "RE_BLOCK_IMPORTS": "opentelemetry,sentry_sdk",
        "RE_IMPORT_ATTEMPTS": str(attempts),
    }


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_without_opentelemetry_nothing_changes(alias, key_prefix, workers, tmp_path):
    """Neither package importable (as if not installed): submits and the worker work as
    before, and this app's code never even tries to import them."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    attempts = tmp_path / "import-attempts.txt"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RE_OTEL_SPANS", "RE_LOG_JSON", "RE_BLOCK_IMPORTS", "RE_IMPORT_ATTEMPTS")
    }
    env.update(
        backend.environment(),
        DJANGO_SETTINGS_MODULE="testproject.settings",
        **blocked_environment(attempts),
    )
    submit = (
        "from django_reliable_executor import executor; "
        "info = executor.submit('demo.traced', task_id='plain'); "
        "print('trace_context', info.trace_context)"
    )
    done = subprocess.run(
        [sys.executable, str(MANAGE), "shell", "-c", submit],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "trace_context None" in done.stdout
    # A task that does carry a trace context (submitted here, traced) runs there all the same.
    with tracer.start_as_current_span("submitter"):
        service.submit("demo.traced", {"fail_times": 1}, task_id="traced")
    workers.start(backend, env=blocked_environment(attempts))
    for task_id in ("plain", "traced"):
        wait_until(
            lambda task_id=task_id: service.get_task(task_id).status is TaskStatus.COMPLETED,
            60,
            f"task {task_id} did not complete without OpenTelemetry",
            logs=workers.logs,
        )
    assert service.get_task("traced").attempts == 2
    assert not attempts.exists(), attempts.read_text()
    assert "Traceback" not in workers.logs()
