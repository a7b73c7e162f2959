"""Prometheus metrics (in the default registry, which django-prometheus exports): the hooks the
service and the worker call, the task gauges' registration and the worker's metrics server.

No side effects at import: every metric is created once per process, on first use, in
``prometheus_client.REGISTRY`` (``collectors``; the task gauges are ``task_gauges``); without
prometheus_client (an optional extra) every hook below is a no-op. Labels are ``task_name`` and
``queue`` only (``status`` on the task gauge): never a task id, so series stay bounded.

Counters count what happened in the process that exports them: submits in the process that
submitted, starts and handler outcomes in the worker that ran them, timeouts and lease recoveries
in the master that recorded them. Sum them over every instance (docs/metrics.md).
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..core.states import TaskStatus
from .collectors import LABEL_VALUES, PREFIX, observe_many, process_metrics, unlabelled_gauge
from .task_gauges import TaskCountCollector, TaskCounts

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ..core.records import TaskInfo, Transition

logger = logging.getLogger("django_reliable_executor")

# Outcomes counted in ``failed_total``: the task ended without success and not by its deadline
# (ERROR: it could not run here at all: no handler, or a parameter param_type rejects).
FAILED_COUNTED = frozenset({TaskStatus.FAILED, TaskStatus.ERROR})

TASK = operator.attrgetter("task")  # a transition's task, read in C

_lock = threading.Lock()
_task_collector: TaskCountCollector | None = None


# -- hooks the service and the worker call (each cheap, and a no-op without prometheus_client) --
def count_submitted(tasks: list[TaskInfo]) -> None:
    """Tasks just stored (after the caller's transaction committed, where there was one)."""
    collectors = process_metrics()
    if collectors is None:
        return
    for task in tasks:
        collectors.child(collectors.scheduled, task).inc()


def count_started(task: TaskInfo) -> None:
    """An attempt started (status RUNNING, ``task.attempts`` counts it)."""
    count_started_many([task])


def count_started_many(tasks: list[TaskInfo]) -> None:
    """Attempts started together (one start write, or one claim that started them):
    ``executed_total`` goes up once per task name and queue, their start times are noted
    under one lock."""
    collectors = process_metrics()
    if collectors is None or not tasks:
        return
    for (task_name, queue), count in Counter(map(LABEL_VALUES, tasks)).items():
        collectors.child_of(collectors.executed, task_name, queue).inc(count)
    collectors.attempts_started(tasks)


def count_step_finished(task: TaskInfo) -> None:
    """A durable step's checkpoint of ``task`` was written (committed)."""
    collectors = process_metrics()
    if collectors is not None:
        collectors.child(collectors.steps_finished, task).inc()


def count_wait(task: TaskInfo, kind: str) -> None:
    """A handler of ``task`` stopped to wait (a durable wait of ``kind``, or "stop")."""
    collectors = process_metrics()
    if collectors is not None:
        collectors.waits.labels(task.task_name, task.queue, kind).inc()


def count_transition(transition: Transition) -> None:
    """A recorded outcome: COMPLETED, PENDING (a retry), FAILED, TIMEOUT, ERROR, CANCELLED.

    The execution-time histogram gets one sample per attempt started in this process, at the
    first outcome recorded for it: the master's timeout of a task another worker runs, a lease
    it recovers, or a deadline passed before the start add none (nothing ran here to time)."""
    collectors = process_metrics()
    if collectors is None:
        return
    task = transition.task
    status = transition.status
    if status is TaskStatus.COMPLETED:
        collectors.child(collectors.completed, task).inc()
    elif status is TaskStatus.PENDING:
        collectors.child(collectors.retried, task).inc()
    elif status in FAILED_COUNTED:
        collectors.child(collectors.failed, task).inc()
    elif status is TaskStatus.TIMEOUT:
        collectors.child(collectors.timeout, task).inc()
    if transition.previous is TaskStatus.RUNNING:
        seconds = collectors.attempt_seconds(task)
        if seconds is not None:
            collectors.child(collectors.execution_seconds, task).observe(seconds)


def count_completed(transitions: list[Transition]) -> None:
    """``count_transition`` for a batch of completions (RUNNING -> COMPLETED) recorded
    together: ``completed_total`` goes up once per task name and queue, the start times of the
    attempts are looked up under one lock, and the histogram takes each label's samples at
    once."""
    collectors = process_metrics()
    if collectors is None:
        return
    tasks = list(map(TASK, transitions))
    labels = list(map(LABEL_VALUES, tasks))
    counts = Counter(labels)
    for (task_name, queue), count in counts.items():
        collectors.child_of(collectors.completed, task_name, queue).inc(count)
    if len(counts) == 1:  # the usual batch: one task name in one queue
        groups = {labels[0]: tasks}
    else:
        groups = {}
        for key, task in zip(labels, tasks, strict=True):
            groups.setdefault(key, []).append(task)
    for (task_name, queue), group in groups.items():
        samples = collectors.attempts_seconds(group)
        if samples:
            histogram = collectors.child_of(collectors.execution_seconds, task_name, queue)
            observe_many(histogram, samples)


# -- schedules: fired by the master ----------------------------------------------------------
def _schedule_collectors() -> tuple[Any, Any, Any] | None:
    """(runs fired, runs skipped, lag histogram), unlabelled: a million schedules must not
    make a million series."""
    collectors = process_metrics()
    if collectors is None:
        return None
    return (collectors.schedule_fired, collectors.schedule_skipped, collectors.schedule_lag)


def count_schedule_fired(lags: Iterable[float]) -> None:
    """Runs just fired (their tasks newly stored), each this many seconds after its plan."""
    collectors = _schedule_collectors()
    if collectors is None:
        return
    fired, _, lag = collectors
    count = 0
    for seconds in lags:
        lag.observe(max(seconds, 0.0))
        count += 1
    fired.inc(count)


def count_schedule_skipped(count: int) -> None:
    """Missed runs a misfire policy dropped."""
    collectors = _schedule_collectors()
    if collectors is not None:
        collectors[1].inc(count)


def count_schedule_overlap_skipped(count: int) -> None:
    """Runs not fired because their schedule's previous run was not terminal. Unlabelled as
    the other schedule counters; each schedule stores its own count (``overlap_skipped``)."""
    collectors = process_metrics()
    if collectors is not None:
        collectors.schedule_overlap_skipped.inc(count)


def set_master(is_master: bool) -> None:
    """This process holds the master lock now, or not."""
    gauge = unlabelled_gauge(
        f"{PREFIX}_is_master", "1 while this worker holds the master lock (runs the chores)."
    )
    if gauge is not None:
        gauge.set(1 if is_master else 0)


def track_pool(queue_size: Callable[[], int]) -> None:
    """The worker's pool: ``queue_size()`` says how many claims wait in its local queue."""
    gauge = unlabelled_gauge(
        f"{PREFIX}_threadpool_queue_size",
        "Claimed tasks waiting in this worker's pool queue for a free thread.",
    )
    if gauge is not None:
        gauge.set_function(lambda: float(queue_size()))


def register_collectors(executor: TaskCounts | None = None) -> TaskCountCollector | None:
    """Create this process's metrics and register the task gauges, read through ``executor``,
    in the default registry, once (later calls return the same collector; the app makes the
    first, with the service, when Django starts). Touches no storage: that happens per scrape.
    Returns None without prometheus_client."""
    global _task_collector
    if process_metrics() is None:
        return None
    with _lock:
        if _task_collector is None:
            from prometheus_client import REGISTRY

            existing = getattr(REGISTRY, "_names_to_collectors", {}).get(f"{PREFIX}_tasks")
            if existing is not None:  # registered before this module was imported again
                _task_collector = existing
            elif executor is None:
                raise RuntimeError("the task gauges are registered with the executor they read")
            else:
                _task_collector = TaskCountCollector(executor)
                REGISTRY.register(_task_collector)  # type: ignore[arg-type]
        return _task_collector


class _ConnectionClosingRegistry:
    """The default registry, closing the scraping thread's database connections after each
    scrape: the metrics server runs every request in a new thread, and the task gauges may
    open a connection there that nothing else would close."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self.registry.collect()
        finally:
            connections.close_all()

    def restricted_registry(self, names: Iterable[str]) -> _ConnectionClosingRegistry:
        return _ConnectionClosingRegistry(self.registry.restricted_registry(names))


def serve(port: int) -> None:
    """Serve the default registry over HTTP on ``port`` (runexecutor --metrics-port), the task
    gauges included."""
    try:
        from prometheus_client import REGISTRY, start_http_server
    except ImportError as exc:
        raise RuntimeError(
            "--metrics-port needs prometheus_client: "
            "pip install 'django-reliable-executor[prometheus]'"
        ) from exc
    register_collectors()
    start_http_server(port, registry=_ConnectionClosingRegistry(REGISTRY))  # type: ignore[arg-type]
    logger.info("serving Prometheus metrics on port %d", port)


__all__: list[Any] = [
    "TaskCountCollector",
    "TaskCounts",
    "count_started",
    "count_started_many",
    "count_completed",
    "count_submitted",
    "count_transition",
    "register_collectors",
    "serve",
    "set_master",
    "track_pool",
]
