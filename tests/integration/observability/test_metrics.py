"""Prometheus metrics: counters and the histogram move by exactly what happened, on every storage;
the task gauges read the storage at scrape time; a real runexecutor serves them over HTTP; the
testproject's django-prometheus /metrics view shows them; the Grafana dashboard uses only them."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import logging
import re
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.records import NewTask, new_info
from django_reliable_executor.master.chores import MasterChores
from django_reliable_executor.observability import metrics
from django_reliable_executor.observability.metrics import TaskCountCollector
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.conftest import BACKENDS, db_params, require
from tests.support.contract_support import LEASE, new_task, run_claims
from tests.support.processes import Backend, service_for, wait_until

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
COUNTERS = ("scheduled", "executed", "completed", "failed", "timeout", "retried")
HISTOGRAM = "reliable_executor_task_execution_seconds"
# Every sample name the app exports (counters with _total, the histogram's series).
EXPORTED_SAMPLES = {
    *(f"reliable_executor_tasks_{name}_total" for name in COUNTERS),
    "reliable_executor_steps_finished_total",
    "reliable_executor_waits_total",
    f"{HISTOGRAM}_bucket",
    f"{HISTOGRAM}_sum",
    f"{HISTOGRAM}_count",
    "reliable_executor_is_master",
    "reliable_executor_threadpool_queue_size",
    "reliable_executor_tasks",
    "reliable_executor_dead_letters",
    "reliable_executor_oldest_due_task_age_seconds",
    "reliable_executor_queue_paused",
    "reliable_executor_rate_limited_tasks",
    "reliable_executor_rate_limit_started",
    "reliable_executor_waiting_tasks",
    "reliable_executor_schedule_runs_fired_total",
    "reliable_executor_schedule_runs_skipped_total",
    "reliable_executor_schedule_overlap_skipped_total",
    "reliable_executor_schedule_lag_seconds_bucket",
    "reliable_executor_schedule_lag_seconds_sum",
    "reliable_executor_schedule_lag_seconds_count",
}


HISTOGRAMS = {HISTOGRAM, "reliable_executor_schedule_lag_seconds"}
# Samples a dashboard or the docs need not query: the histograms' sums and counts.
UNQUERIED = {
    f"{HISTOGRAM}_sum",
    f"{HISTOGRAM}_count",
    "reliable_executor_schedule_lag_seconds_sum",
    "reliable_executor_schedule_lag_seconds_count",
}


def fresh_queue() -> str:
    """A queue of this test's own: its labelled series start from nothing in the registry."""
    return f"m-{uuid.uuid4().hex[:10]}"


def observed(task_name: str, queue: str) -> dict[str, float]:
    """The counters and histogram count of one (task_name, queue) in this process's registry."""
    labels = {"task_name": task_name, "queue": queue}
    values = {
        name: REGISTRY.get_sample_value(f"reliable_executor_tasks_{name}_total", labels) or 0.0
        for name in COUNTERS
    }
    values["seconds_count"] = REGISTRY.get_sample_value(f"{HISTOGRAM}_count", labels) or 0.0
    return values


def expect(**counts: float) -> dict[str, float]:
    values = dict.fromkeys([*COUNTERS, "seconds_count"], 0.0)
    values.update(counts)
    return values


def drain(executor: ReliableExecutor, queue: str) -> list[TaskStatus | None]:
    """Claim every due task of ``queue`` and run each through the real TaskRunner."""
    executor.storage.promote_due(100)
    claims = executor.storage.claim("w-metrics", [queue], 100, LEASE)
    return run_claims(executor, claims)


# -- the counters and the histogram, on every storage --------------------------------------------
def test_counters_count_submits_starts_and_each_outcome(executor, storage, clock):
    queue = fresh_queue()
    executor.submit("demo.echo", 1, task_id="ok", queue=queue)
    executor.submit("demo.echo", 2, task_id="ok", queue=queue)  # idempotent: not scheduled again
    executor.submit_many(
        [
            TaskSubmitRequest("demo.flaky", {"fail_times": 1}, task_id="flaky", queue=queue),
            TaskSubmitRequest("demo.always_fails", task_id="fails", queue=queue, retry_limit=0),
            TaskSubmitRequest("demo.echo", task_id="late", queue=queue, max_duration_millis=1000),
            TaskSubmitRequest("demo.echo", task_id="cancelled", queue=queue),
        ]
    )
    assert executor.cancel_task("cancelled")
    # Written straight to storage (as another service might): a parameter param_type rejects.
    stale = new_task("stale", "demo.process_order", {"order": 1}, clock.now())
    storage.enqueue([dataclasses.replace(stale, queue=queue)])

    clock.advance(2)  # "late" is past its deadline before it starts
    outcomes = drain(executor, queue)  # ok, flaky, fails, late, stale
    clock.advance(1)  # the flaky task's retry is due
    outcomes += drain(executor, queue)
    assert sorted(outcomes) == sorted(
        [
            TaskStatus.COMPLETED,
            TaskStatus.PENDING,
            TaskStatus.FAILED,
            TaskStatus.TIMEOUT,
            TaskStatus.ERROR,
            TaskStatus.COMPLETED,
        ]
    )

    # echo: 3 stored by the service (ok, late, cancelled), one run; "late" never started.
    assert observed("demo.echo", queue) == expect(
        scheduled=3, executed=1, completed=1, timeout=1, seconds_count=1
    )
    assert observed("demo.flaky", queue) == expect(
        scheduled=1, executed=2, retried=1, completed=1, seconds_count=2
    )
    assert observed("demo.always_fails", queue) == expect(
        scheduled=1, executed=1, failed=1, seconds_count=1
    )
    # ERROR counts as failed; a task written past the service was not "scheduled" here.
    assert observed("demo.process_order", queue) == expect(executed=1, failed=1, seconds_count=1)


def test_outcomes_the_master_records_count_but_add_no_execution_time(executor, storage, clock):
    """A lease recovered, or a deadline passed, for attempts another process started: the
    retry and the timeout count; nothing ran here, so no execution-time sample."""
    queue = fresh_queue()
    # Ids of this test's own: the registry remembers attempts started in this process by (task
    # id, attempt), and another test's "lost" attempt 1, never ended here, would time ours.
    lost, overdue = f"lost-{queue}", f"overdue-{queue}"
    executor.submit("demo.echo", task_id=lost, queue=queue, retry_limit=1)
    executor.submit("demo.echo", task_id=overdue, queue=queue, max_duration_millis=5000)
    for claim in storage.claim("elsewhere", [queue], 10, LEASE):  # another worker starts both
        assert storage.start(claim, LEASE) is not None
    chores = MasterChores(executor, retention_seconds=3600)
    clock.advance(10)  # past "overdue"'s deadline, leases still valid
    chores.run_once()
    clock.advance(LEASE)  # the other worker stopped heartbeating: "lost" is recovered
    chores.run_once()
    assert executor.get_task(overdue).status is TaskStatus.TIMEOUT
    assert executor.get_task(lost).status is TaskStatus.PENDING
    assert observed("demo.echo", queue) == expect(scheduled=2, timeout=1, retried=1)

    clock.advance(10)  # the retry is due (DEFAULT_RETRY_INTERVAL later)
    assert drain(executor, queue) == [TaskStatus.COMPLETED]  # it runs here
    assert observed("demo.echo", queue) == expect(
        scheduled=2, timeout=1, retried=1, executed=1, completed=1, seconds_count=1
    )


def test_metric_labels_are_task_name_and_queue_only(executor):
    """Task metrics carry task_name and queue; the schedule ones none (a million schedules
    must not make a million series)."""
    queue = fresh_queue()
    executor.submit("demo.flaky", {"fail_times": 1}, task_id="f", queue=queue)
    drain(executor, queue)
    ours = [f for f in REGISTRY.collect() if f.name.startswith("reliable_executor_")]
    assert {f.name for f in ours} >= {f"reliable_executor_tasks_{name}" for name in COUNTERS}
    seen = 0
    for family in ours:
        for sample in family.samples:
            if sample.name.endswith("_created") or family.type not in ("counter", "histogram"):
                continue
            keys = set(sample.labels) - ({"le"} if sample.name.endswith("_bucket") else set())
            expected = (
                set()
                if family.name.startswith("reliable_executor_schedule_")
                else {"task_name", "queue", "kind"}  # the kind of a wait (a bounded set)
                if family.name == "reliable_executor_waits"
                else {"task_name", "queue"}
            )
            assert keys == expected, sample
            seen += 1
    assert seen > 0


@pytest.mark.parametrize("alias", db_params(["default"]))  # timing, not storage
def test_execution_seconds_time_the_handler(alias, executor):
    queue = fresh_queue()
    executor.submit("demo.slow", {"seconds": 0.3}, task_id="slow", queue=queue)
    assert drain(executor, queue) == [TaskStatus.COMPLETED]
    labels = {"task_name": "demo.slow", "queue": queue}
    assert REGISTRY.get_sample_value(f"{HISTOGRAM}_count", labels) == 1
    assert 0.3 <= REGISTRY.get_sample_value(f"{HISTOGRAM}_sum", labels) < 5
    assert REGISTRY.get_sample_value(f"{HISTOGRAM}_bucket", {**labels, "le": "0.25"}) == 0
    assert REGISTRY.get_sample_value(f"{HISTOGRAM}_bucket", {**labels, "le": "+Inf"}) == 1


def test_a_batch_of_samples_fills_the_histogram_as_observing_each_does():
    """The completion writer's batches go into the histogram at once: the same buckets, count
    and sum as one observe() per sample, bounds and the +Inf bucket included."""
    from prometheus_client import CollectorRegistry, Histogram

    from django_reliable_executor.observability.collectors import EXECUTION_BUCKETS, observe_many

    samples = [0.0, 0.004, 0.005, 0.0051, 0.3, 0.3, 1.0, 59.9, 3600.0, 7200.5]
    registry = CollectorRegistry()
    histogram = Histogram("h", "h", ["l"], buckets=EXECUTION_BUCKETS, registry=registry)
    for sample in samples:
        histogram.labels("each").observe(sample)
    observe_many(histogram.labels("batch"), samples)
    each, batch = ({"l": "each"}, {"l": "batch"})
    for bound in [*map(str, EXECUTION_BUCKETS), "+Inf"]:
        value = registry.get_sample_value("h_bucket", {**each, "le": bound})
        assert registry.get_sample_value("h_bucket", {**batch, "le": bound}) == value, bound
    assert registry.get_sample_value("h_count", batch) == len(samples)
    assert registry.get_sample_value("h_sum", batch) == pytest.approx(sum(samples))
    assert registry.get_sample_value("h_bucket", {**batch, "le": "0.005"}) == 3


# -- the task gauges -----------------------------------------------------------------------------
def gauges(collector: TaskCountCollector) -> dict[str, dict[tuple[str, ...], float]]:
    """family name -> {label values: value}."""
    return {
        family.name: {tuple(s.labels.values()): s.value for s in family.samples}
        for family in collector.collect()
    }


def test_collector_reports_tasks_by_status_and_queue_and_the_oldest_due_age(executor, clock):
    busy, quiet = fresh_queue(), fresh_queue()
    executor.submit_many(
        [TaskSubmitRequest("demo.echo", task_id=f"b{i}", queue=busy) for i in (1, 2, 3)]
    )
    clock.advance(30)
    executor.submit("demo.echo", task_id="b4", queue=busy)
    executor.submit("demo.echo", task_id="b5", queue=busy, delay_millis=600_000)  # not due
    executor.submit("demo.echo", task_id="q1", queue=quiet)
    executor.submit("demo.echo", task_id="q2", queue=quiet)
    assert executor.cancel_task("q2")
    assert drain(executor, quiet) == [TaskStatus.COMPLETED]

    read = gauges(TaskCountCollector(executor, cache_seconds=0))
    tasks = read["reliable_executor_tasks"]
    expected = {(status.value, queue): 0.0 for status in TaskStatus for queue in (busy, quiet)}
    expected[("CREATED", busy)] = 5
    expected[("COMPLETED", quiet)] = 1
    expected[("CANCELLED", quiet)] = 1
    assert tasks == expected
    # b1..b3 became due 30 s ago; the quiet queue has nothing waiting.
    ages = read["reliable_executor_oldest_due_task_age_seconds"]
    assert ages == {(busy,): pytest.approx(30, abs=0.01), (quiet,): 0.0}


def test_dead_letters_sum_failed_timeout_and_error_by_queue(executor, storage, clock):
    mixed, failing, idle = fresh_queue(), fresh_queue(), fresh_queue()
    executor.submit_many(
        [
            TaskSubmitRequest("demo.always_fails", task_id="f1", queue=mixed, retry_limit=0),
            TaskSubmitRequest("demo.echo", task_id="late", queue=mixed, max_duration_millis=1000),
            TaskSubmitRequest("demo.echo", task_id="ok", queue=mixed),
            TaskSubmitRequest("demo.echo", task_id="cancelled", queue=mixed),
            TaskSubmitRequest("demo.always_fails", task_id="f2", queue=failing, retry_limit=0),
            TaskSubmitRequest("demo.always_fails", task_id="f3", queue=failing, retry_limit=0),
            TaskSubmitRequest("demo.echo", task_id="waiting", queue=idle),
        ]
    )
    assert executor.cancel_task("cancelled")
    stale = new_task("stale", "demo.process_order", {"order": 1}, clock.now())  # -> ERROR
    storage.enqueue([dataclasses.replace(stale, queue=mixed)])
    clock.advance(2)  # "late" is past its deadline before it starts: TIMEOUT
    assert sorted(drain(executor, mixed)) == sorted(
        [TaskStatus.FAILED, TaskStatus.TIMEOUT, TaskStatus.COMPLETED, TaskStatus.ERROR]
    )
    assert drain(executor, failing) == [TaskStatus.FAILED, TaskStatus.FAILED]

    collector = TaskCountCollector(executor, cache_seconds=0)
    read = gauges(collector)
    assert read["reliable_executor_dead_letters"] == {(mixed,): 3, (failing,): 2, (idle,): 0}
    # The same cached counts as the task gauge: its FAILED + TIMEOUT + ERROR.
    tasks = read["reliable_executor_tasks"]
    for (queue,), dead in read["reliable_executor_dead_letters"].items():
        assert dead == sum(tasks[(s, queue)] for s in ("FAILED", "TIMEOUT", "ERROR"))
    # Retrying a dead letter takes it out at the next read.
    assert executor.retry_task("f2")
    assert gauges(collector)["reliable_executor_dead_letters"][(failing,)] == 1
    # The exposition names it as a gauge with a queue label.
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert "# TYPE reliable_executor_dead_letters gauge" in text
    assert f'reliable_executor_dead_letters{{queue="{mixed}"}} 3.0' in text


def test_queue_paused_is_1_for_paused_queues_and_0_for_the_others(executor):
    busy, stopped, empty = fresh_queue(), fresh_queue(), fresh_queue()
    executor.submit("demo.echo", task_id="b", queue=busy)
    executor.submit("demo.echo", task_id="s", queue=stopped)
    executor.submit("demo.echo", task_id="e", queue=empty)
    executor.pause_queue(stopped)
    executor.pause_queue(empty)
    assert executor.cancel_task("e")
    executor.purge_finished(executor.clock.now().replace(year=2100))  # empty: no task left
    collector = TaskCountCollector(executor, cache_seconds=0)
    assert gauges(collector)["reliable_executor_queue_paused"] == {
        (busy,): 0,
        (stopped,): 1,
        (empty,): 1,
    }
    executor.resume_queue(stopped)
    assert gauges(collector)["reliable_executor_queue_paused"][(stopped,)] == 0


def test_collector_caches_between_scrapes(executor):
    queue = fresh_queue()
    executor.submit("demo.echo", task_id="a", queue=queue)
    collector = TaskCountCollector(executor, cache_seconds=60)
    assert gauges(collector)["reliable_executor_tasks"][("CREATED", queue)] == 1
    executor.submit("demo.echo", task_id="b", queue=queue)
    assert gauges(collector)["reliable_executor_tasks"][("CREATED", queue)] == 1  # cached
    collector.clear_cache()
    assert gauges(collector)["reliable_executor_tasks"][("CREATED", queue)] == 2


def test_unreachable_storage_skips_the_task_gauges_without_failing_the_scrape(caplog):
    import redis

    from django_reliable_executor.storage.redis import RedisStorage

    client = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
    collector = TaskCountCollector(ReliableExecutor(RedisStorage(client, "unreachable")))
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="django_reliable_executor"):
        read = gauges(collector)
    assert time.monotonic() - started < 10
    assert read == {
        "reliable_executor_tasks": {},
        "reliable_executor_dead_letters": {},
        "reliable_executor_oldest_due_task_age_seconds": {},
        "reliable_executor_queue_paused": {},
        "reliable_executor_rate_limited_tasks": {},
        "reliable_executor_rate_limit_started": {},
        "reliable_executor_waiting_tasks": {},
    }
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert "storage unavailable" in caplog.records[0].getMessage()


# -- registration, once per process --------------------------------------------------------------
def test_register_collectors_is_idempotent_and_survives_a_reimport():
    collector = metrics.register_collectors()
    assert collector is not None
    assert metrics.register_collectors() is collector
    queue = fresh_queue()
    now = dt.datetime.now(dt.timezone.utc)
    info = new_info(NewTask("t", "demo.echo", queue, 0, None, 0, 0, "fixed", None, now, now, None))
    metrics.count_submitted([info])
    reloaded = importlib.reload(metrics)  # a second import must not register anything twice
    assert reloaded.register_collectors() is collector
    reloaded.count_submitted([info])
    labels = {"task_name": "demo.echo", "queue": queue}
    assert REGISTRY.get_sample_value("reliable_executor_tasks_scheduled_total", labels) == 2


def test_every_hook_is_a_no_op_without_prometheus_client():
    script = textwrap.dedent(
        """
        import datetime as dt, sys
        sys.modules["prometheus_client"] = None  # as if the extra were not installed
        from django_reliable_executor.observability import metrics
        from django_reliable_executor.core.records import NewTask, Transition, new_info
        from django_reliable_executor.core.states import TaskStatus

        now = dt.datetime.now(dt.timezone.utc)
        task = new_info(NewTask("t", "n", "q", 0, None, 0, 0, "fixed", None, now, now, None))
        metrics.count_submitted([task])
        metrics.count_started(task)
        metrics.count_transition(Transition(task=task, previous=TaskStatus.RUNNING))
        metrics.set_master(True)
        metrics.track_pool(lambda: 0)
        assert metrics.register_collectors() is None
        try:
            metrics.serve(0)
        except RuntimeError as exc:
            assert "prometheus" in str(exc)
        else:
            raise AssertionError("serve() without prometheus_client")
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


# -- end to end: a real runexecutor, and the web process's /metrics view ------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value, from the Prometheus text format."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def families(text: str) -> dict[str, str]:
    """Family name -> type."""
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def labelled(**labels: str) -> frozenset:
    return frozenset(labels.items())


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_runexecutor_serves_the_metrics_over_http(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit_many(
        [TaskSubmitRequest("demo.echo", i, task_id=f"echo-{i}") for i in range(3)]
        + [
            TaskSubmitRequest("demo.flaky", {"fail_times": 1}, task_id="flaky"),
            TaskSubmitRequest("demo.always_fails", task_id="fails", retry_limit=0),
        ]
    )
    port = free_port()
    workers.start(backend, "--metrics-port", str(port))
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            return response.read().decode()

    expected = {
        ("reliable_executor_tasks_executed_total", "demo.echo"): 3,
        ("reliable_executor_tasks_completed_total", "demo.echo"): 3,
        ("reliable_executor_tasks_executed_total", "demo.flaky"): 2,
        ("reliable_executor_tasks_retried_total", "demo.flaky"): 1,
        ("reliable_executor_tasks_completed_total", "demo.flaky"): 1,
        ("reliable_executor_tasks_executed_total", "demo.always_fails"): 1,
        ("reliable_executor_tasks_failed_total", "demo.always_fails"): 1,
        (f"{HISTOGRAM}_count", "demo.echo"): 3,
        (f"{HISTOGRAM}_count", "demo.flaky"): 2,
    }

    def settled() -> dict[tuple[str, frozenset], float] | None:
        """The scraped samples once they show every outcome, else None."""
        read = parse(scrape())
        counted = all(
            read.get((name, labelled(task_name=task, queue="default"))) == value
            for (name, task), value in expected.items()
        )
        stored = read.get(
            ("reliable_executor_tasks", labelled(status="COMPLETED", queue="default"))
        )
        master = read.get(("reliable_executor_is_master", frozenset()))
        return read if counted and stored == 4 and master == 1 else None

    ids = [*(f"echo-{i}" for i in range(3)), "flaky", "fails"]
    wait_until(
        lambda: all(service.get_task(i).is_terminal for i in ids),
        30,
        "the tasks did not finish",
        logs=workers.logs,
    )
    # The first scrape now reads final counts (the task gauges are then cached for 5 s); the
    # counters may still trail the stored outcomes by a moment (completions are announced
    # after they are written).
    samples = wait_until(
        settled, 30, "the scraped metrics did not reach the expected values", logs=workers.logs
    )

    def echo(sample: str, **labels: str) -> float | None:
        return samples.get((sample, labelled(queue="default", **labels)))

    assert samples[("reliable_executor_threadpool_queue_size", frozenset())] == 0
    assert echo("reliable_executor_tasks", status="FAILED") == 1
    assert echo("reliable_executor_tasks", status="CREATED") == 0
    assert echo("reliable_executor_dead_letters") == 1  # "fails"
    assert echo("reliable_executor_oldest_due_task_age_seconds") == 0
    assert echo(f"{HISTOGRAM}_bucket", task_name="demo.echo", le="+Inf") == 3
    assert echo(f"{HISTOGRAM}_sum", task_name="demo.echo") >= 0
    # The submits happened in this test process, not in the worker.
    assert echo("reliable_executor_tasks_scheduled_total", task_name="demo.echo") is None
    exported = {name for name, _ in samples if name.startswith("reliable_executor_")}
    assert exported - {n for n in exported if n.endswith("_created")} == EXPORTED_SAMPLES - {
        "reliable_executor_tasks_scheduled_total",
        "reliable_executor_tasks_timeout_total",
        "reliable_executor_steps_finished_total",  # these demo tasks make no steps
        "reliable_executor_waits_total",  # nor waits
    }
    types = families(scrape())
    assert types["reliable_executor_task_execution_seconds"] == "histogram"
    assert types["reliable_executor_tasks_executed"] == "counter"
    assert types["reliable_executor_is_master"] == "gauge"


@pytest.mark.parametrize("pool", ["process"])  # a pool thread's are counted as any task's
@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_the_worker_exports_its_handlers_steps_and_waits(alias, pool, key_prefix, workers):
    """Under --pool process the child writes the checkpoints; the worker counts them."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.steps", {}, task_id="stepper")
    service.submit("demo.waits", {"wait": "sleep", "seconds": 0.5}, task_id="sleeper")
    port = free_port()
    workers.start(backend, "--metrics-port", str(port), "--pool", pool)

    def counted() -> dict[tuple[str, frozenset], float] | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            read = parse(response.read().decode())
        steps = read.get(
            (
                "reliable_executor_steps_finished_total",
                labelled(task_name="demo.steps", queue="default"),
            )
        )
        waits = read.get(
            (
                "reliable_executor_waits_total",
                labelled(task_name="demo.waits", queue="default", kind="sleep"),
            )
        )
        # demo.waits: its step "before" ran before the sleep, "after" once resumed.
        sleeper_steps = read.get(
            (
                "reliable_executor_steps_finished_total",
                labelled(task_name="demo.waits", queue="default"),
            )
        )
        done = all(service.get_task(i).is_terminal for i in ("stepper", "sleeper"))
        return read if done and (steps, waits, sleeper_steps) == (3, 1, 2) else None

    wait_until(counted, 30, "the steps and waits were not counted", logs=workers.logs)


# Every app installed (the view goes through the auth middleware); committed, so the submits'
# on_commit hooks count them, as in a real request.
@pytest.mark.django_db(transaction=True)
def test_the_web_process_metrics_view_shows_the_executor_metrics(client):
    from django_reliable_executor.service.reliable_executor import executor

    collector = metrics.register_collectors()
    assert collector is not None
    collector.clear_cache()
    queue = fresh_queue()
    executor.submit("demo.echo", task_id="web-1", queue=queue)
    executor.submit("demo.echo", task_id="web-2", queue=queue)

    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    samples = parse(text)
    assert (
        samples[
            (
                "reliable_executor_tasks_scheduled_total",
                labelled(task_name="demo.echo", queue=queue),
            )
        ]
        == 2
    )
    assert samples[("reliable_executor_tasks", labelled(status="CREATED", queue=queue))] == 2
    assert samples[("reliable_executor_oldest_due_task_age_seconds", labelled(queue=queue))] >= 0
    assert samples[("reliable_executor_dead_letters", labelled(queue=queue))] == 0
    types = families(text)
    for name in COUNTERS:
        assert types[f"reliable_executor_tasks_{name}"] == "counter"
    assert types[HISTOGRAM] == "histogram"
    assert types["reliable_executor_tasks"] == "gauge"
    assert types["reliable_executor_dead_letters"] == "gauge"


# -- the Grafana dashboard -----------------------------------------------------------------------
PROMQL_WORDS = {
    # functions, aggregations and keywords the dashboard's queries use
    "sum", "max", "min", "avg", "count", "rate", "increase", "irate", "histogram_quantile",
    "clamp_min", "time", "by", "without", "or", "and", "unless", "on", "ignoring", "bool",
    "label_values", "max_over_time", "vector", "topk", "sort_desc", "changes", "resets", "delta",
    # label names
    "task_name", "queue", "status", "le", "instance", "job", "kind",
}  # fmt: skip


def queries(node: object) -> list[str]:
    """Every PromQL expression in the dashboard: panel targets and variable queries."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                found.append(value)
            elif key == "query" and isinstance(value, dict) and "query" in value:
                found.append(value["query"])
            else:
                found.extend(queries(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(queries(item))
    return found


def metric_names(expr: str) -> set[str]:
    """The identifiers of a PromQL expression that are neither functions, keywords, label
    names nor Grafana variables: the metric names it reads."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings (label values)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", "", expr)  # numbers
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    unknown = names - PROMQL_WORDS - EXPORTED_SAMPLES
    assert not unknown, f"{expr!r}: not a function, label or metric of ours: {unknown}"
    return names & EXPORTED_SAMPLES


def test_grafana_dashboard_is_valid_and_queries_only_our_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    used: set[str] = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, f"{panel['title']}: {target['expr']!r} reads no metric of ours"
            used |= names
    for expr in queries(dashboard["templating"]):
        used |= metric_names(expr)
    # Every metric is on the dashboard somewhere.
    assert used >= EXPORTED_SAMPLES - UNQUERIED


def test_the_metrics_page_queries_only_our_metrics():
    text = (ROOT / "docs" / "metrics.md").read_text()
    blocks = re.findall(r"```promql\n(.*?)```", text, re.S)
    assert blocks
    expressions = "\n".join(blocks).split("\n\n")
    used: set[str] = set()
    for expr in expressions:
        expr = "\n".join(line for line in expr.splitlines() if not line.startswith("#"))
        used |= metric_names(expr)
    assert used >= EXPORTED_SAMPLES - UNQUERIED
    for line in text.splitlines():  # the metrics table names every metric
        if line.startswith("| `reliable_executor_"):
            name = line.split("`")[1]
            assert name in EXPORTED_SAMPLES or name in HISTOGRAMS, name


def test_the_app_registered_the_task_gauges_reading_the_service():
    from django_reliable_executor.service.reliable_executor import executor

    collector = metrics.register_collectors()
    assert collector is not None
    assert collector._executor is executor
