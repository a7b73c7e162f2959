"""Prometheus collectors (in the default registry, which django-prometheus exports); no side
effects at import: collectors are created on first use, and only if prometheus_client exists.

Every metric is created once per process, in ``prometheus_client.REGISTRY``; without
prometheus_client (an optional extra) every hook below is a no-op. Labels are ``task_name`` and
``queue`` only (``status`` on the task gauge): never a task id, so series stay bounded.

Counters count what happened in the process that exports them: submits in the process that
submitted, starts and handler outcomes in the worker that ran them, timeouts and lease recoveries
in the master that recorded them. Sum them over every instance (docs/metrics.md).
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from .states import DEAD_LETTER_STATUSES, TaskStatus

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram
    from prometheus_client.metrics_core import Metric

    from .clock import Clock
    from .records import TaskInfo, Transition

logger = logging.getLogger("django_reliable_executor")

PREFIX = "reliable_executor"
LABELS = ("task_name", "queue")
# From a few milliseconds (a cache write) to an hour (a report): handlers vary that much.
EXECUTION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
# The task gauges query the storage (a GROUP BY, one indexed lookup per queue): at most once
# per this many seconds per process, whatever the number of scrapers.
COUNT_CACHE_SECONDS = 5.0
# Attempts started here whose outcome was never recorded here (the lease was lost and another
# worker recorded it) are forgotten oldest first beyond this many.
MAX_TRACKED_ATTEMPTS = 10_000

# Outcomes counted in ``failed_total``: the task ended without success and not by its deadline
# (ERROR: it could not run here at all: no handler, or a parameter param_type rejects).
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)  # schedule lag
FAILED_COUNTED = frozenset({TaskStatus.FAILED, TaskStatus.ERROR})
# ``dead_letters{queue}`` sums the DEAD_LETTER_STATUSES per queue.


class _Metrics:
    """The collectors of this process's own events."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        def counter(name: str, documentation: str) -> Counter:
            return _find_or_create(
                f"{PREFIX}_{name}", lambda: Counter(f"{PREFIX}_{name}", documentation, LABELS)
            )

        self.scheduled: Counter = counter(
            "tasks_scheduled", "Tasks submitted (stored) by this process."
        )
        self.executed: Counter = counter(
            "tasks_executed", "Attempts started by this worker (retries included)."
        )
        self.completed: Counter = counter(
            "tasks_completed", "Attempts that completed successfully in this worker."
        )
        self.failed: Counter = counter(
            "tasks_failed",
            "Tasks that ended FAILED (retries used up, or an exception outside retry_on) "
            "or ERROR (no handler, or a parameter that does not fit param_type).",
        )
        self.timeout: Counter = counter(
            "tasks_timeout", "Tasks that ended TIMEOUT (max_duration_millis passed)."
        )
        self.retried: Counter = counter(
            "tasks_retried",
            "Failed attempts rescheduled as PENDING for an automatic retry "
            "(handler failures, and lost workers' attempts the master recovered).",
        )
        name = f"{PREFIX}_task_execution_seconds"
        self.execution_seconds: Histogram = _find_or_create(
            name,
            lambda: Histogram(
                name,
                "Seconds from the start of an attempt in this worker to its recorded outcome.",
                LABELS,
                buckets=EXECUTION_BUCKETS,
            ),
        )
        # Schedules (fired by the master), unlabelled: a million schedules must not make a
        # million series.
        self.schedule_fired: Counter = _find_or_create(
            f"{PREFIX}_schedule_runs_fired_total",
            lambda: Counter(f"{PREFIX}_schedule_runs_fired", "Schedule runs fired as tasks."),
        )
        self.schedule_skipped: Counter = _find_or_create(
            f"{PREFIX}_schedule_runs_skipped_total",
            lambda: Counter(
                f"{PREFIX}_schedule_runs_skipped",
                "Missed schedule runs their misfire policy dropped (skip, run_once, or past "
                "SCHEDULE_CATCH_UP_LIMIT).",
            ),
        )
        lag = f"{PREFIX}_schedule_lag_seconds"
        self.schedule_lag: Histogram = _find_or_create(
            lag,
            lambda: Histogram(
                lag, "Seconds from a run's planned time to its fire.", buckets=LAG_BUCKETS
            ),
        )
        # (id of the metric, task_name, queue) -> its labelled child: labels() takes the metric's
        # lock on every call, which eight pool threads then queue on for each task.
        self._children: dict[tuple[int, str, str], Any] = {}
        # (task_id, attempt) -> time.monotonic() at the start, for attempts started here.
        self.started: collections.OrderedDict[tuple[str, int], float] = collections.OrderedDict()
        self.started_lock = threading.Lock()

    def child(self, metric: Any, task: TaskInfo) -> Any:
        """``metric.labels(task_name, queue)``, cached (label values are bounded)."""
        key = (id(metric), task.task_name, task.queue)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(task.task_name, task.queue)
        return found

    def attempt_started(self, task: TaskInfo) -> None:
        with self.started_lock:
            self.started[(task.task_id, task.attempts)] = time.monotonic()
            while len(self.started) > MAX_TRACKED_ATTEMPTS:
                self.started.popitem(last=False)

    def attempt_seconds(self, task: TaskInfo) -> float | None:
        """How long the attempt ran, if it started in this process (then forgotten)."""
        with self.started_lock:
            started = self.started.pop((task.task_id, task.attempts), None)
        return None if started is None else time.monotonic() - started


_lock = threading.RLock()
_metrics: _Metrics | None = None
_unavailable = False  # prometheus_client is not installed
_gauges: dict[str, Gauge] = {}
_task_collector: TaskCountCollector | None = None


def _find_or_create(name: str, create: Callable[[], Any]) -> Any:
    """The collector already registered under ``name`` (this module was imported again, e.g.
    reloaded by a test), else a new one: a second registration would raise."""
    from prometheus_client import REGISTRY

    names = getattr(REGISTRY, "_names_to_collectors", {})  # no public lookup exists
    existing = names.get(name)
    return existing if existing is not None else create()


def _get() -> _Metrics | None:
    """This process's collectors, created on first use; None without prometheus_client."""
    global _metrics, _unavailable
    if _metrics is not None or _unavailable:
        return _metrics
    with _lock:
        if _metrics is None and not _unavailable:
            try:
                _metrics = _Metrics()
            except ImportError:
                _unavailable = True
        return _metrics


def _gauge(name: str, documentation: str) -> Gauge | None:
    if _get() is None:
        return None
    with _lock:
        gauge = _gauges.get(name)
        if gauge is None:
            from prometheus_client import Gauge

            gauge = _find_or_create(name, lambda: Gauge(name, documentation))
            _gauges[name] = gauge
        return gauge


# -- hooks the service and the worker call (each cheap, and a no-op without prometheus_client) --
def observe_submitted(tasks: list[TaskInfo]) -> None:
    """Tasks just stored (after the caller's transaction committed, where there was one)."""
    collectors = _get()
    if collectors is None:
        return
    for task in tasks:
        collectors.child(collectors.scheduled, task).inc()


def observe_started(task: TaskInfo) -> None:
    """An attempt started (status RUNNING, ``task.attempts`` counts it)."""
    collectors = _get()
    if collectors is None:
        return
    collectors.child(collectors.executed, task).inc()
    collectors.attempt_started(task)


def observe_transition(transition: Transition) -> None:
    """A recorded outcome: COMPLETED, PENDING (a retry), FAILED, TIMEOUT, ERROR, CANCELLED.

    The execution-time histogram gets one sample per attempt started in this process, at the
    first outcome recorded for it: the master's timeout of a task another worker runs, a lease
    it recovers, or a deadline passed before the start add none (nothing ran here to time)."""
    collectors = _get()
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


# -- schedules: fired by the master ----------------------------------------------------------
def _schedule_collectors() -> tuple[Any, Any, Any] | None:
    """(runs fired, runs skipped, lag histogram), unlabelled: a million schedules must not
    make a million series."""
    collectors = _get()
    if collectors is None:
        return None
    return (collectors.schedule_fired, collectors.schedule_skipped, collectors.schedule_lag)


def observe_schedule_fired(lags: Iterable[float]) -> None:
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


def observe_schedule_skipped(count: int) -> None:
    """Missed runs a misfire policy dropped."""
    collectors = _schedule_collectors()
    if collectors is not None:
        collectors[1].inc(count)


def set_master(is_master: bool) -> None:
    """This process holds the master lock now, or not."""
    gauge = _gauge(
        f"{PREFIX}_is_master", "1 while this worker holds the master lock (runs the scheduler)."
    )
    if gauge is not None:
        gauge.set(1 if is_master else 0)


def track_pool(queue_size: Callable[[], int]) -> None:
    """The worker's pool: ``queue_size()`` says how many claims wait in its local queue."""
    gauge = _gauge(
        f"{PREFIX}_threadpool_queue_size",
        "Claimed tasks waiting in this worker's pool queue for a free thread.",
    )
    if gauge is not None:
        gauge.set_function(lambda: float(queue_size()))


# -- the task gauges: read from the storage at scrape time ---------------------------------
class TaskCounts(Protocol):
    """What the task gauges read: the service (``executor``), which sits above this module."""

    @property
    def clock(self) -> Clock: ...

    def count_by_queue(self) -> dict[str, dict[TaskStatus, int]]: ...

    def oldest_due_at(self, queue: str | None = None) -> dt.datetime | None: ...


class TaskCountCollector:
    """``reliable_executor_tasks{status, queue}``,
    ``reliable_executor_dead_letters{queue}`` (the FAILED + TIMEOUT + ERROR of the same counts)
    and ``reliable_executor_oldest_due_task_age_seconds{queue}``, read through the service when
    scraped, at most once per ``cache_seconds``. A storage error skips these samples (logged at
    debug): the scrape itself never fails.

    Every process exporting it reports the same stored totals: aggregate with ``max``, not
    ``sum``, across instances."""

    def __init__(self, executor: TaskCounts, cache_seconds: float = COUNT_CACHE_SECONDS) -> None:
        self._executor = executor
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._snapshot: _Snapshot | None = None

    def clear_cache(self) -> None:
        """Read the storage again at the next scrape."""
        with self._lock:
            self._read_at = None

    def describe(self) -> Iterable[Metric]:
        """The families without samples: registering must not touch the storage."""
        return self._families(None)

    def collect(self) -> Iterable[Metric]:
        return self._families(self._read())

    def _read(self) -> _Snapshot | None:
        with self._lock:  # concurrent scrapes share one storage read
            now = time.monotonic()
            if self._read_at is None or now - self._read_at >= self.cache_seconds:
                self._snapshot = self._query()
                self._read_at = time.monotonic()
            return self._snapshot

    def _query(self) -> _Snapshot | None:
        executor = self._executor
        try:
            counts = executor.count_by_queue()
            ages: dict[str, float] = {}
            for queue, by_status in counts.items():
                waiting = by_status.get(TaskStatus.CREATED, 0) + by_status.get(
                    TaskStatus.PENDING, 0
                )
                oldest = executor.oldest_due_at(queue) if waiting else None
                ages[queue] = _age_seconds(oldest, executor.clock.now())
        except Exception:
            logger.debug("metrics: task counts not read, storage unavailable", exc_info=True)
            return None
        return _Snapshot(counts, ages)

    @staticmethod
    def _families(snapshot: _Snapshot | None) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        tasks = GaugeMetricFamily(
            f"{PREFIX}_tasks", "Stored tasks by status and queue.", labels=["status", "queue"]
        )
        dead = GaugeMetricFamily(
            f"{PREFIX}_dead_letters",
            "Stored tasks that ended FAILED, TIMEOUT or ERROR (dead letters), by queue.",
            labels=["queue"],
        )
        age = GaugeMetricFamily(
            f"{PREFIX}_oldest_due_task_age_seconds",
            "Seconds the oldest due, unclaimed task of the queue has waited (0: none waits).",
            labels=["queue"],
        )
        if snapshot is not None:
            for queue, by_status in snapshot.counts.items():
                for status in TaskStatus:
                    tasks.add_metric([status.value, queue], by_status.get(status, 0))
                dead.add_metric(
                    [queue], sum(by_status.get(status, 0) for status in DEAD_LETTER_STATUSES)
                )
                age.add_metric([queue], snapshot.ages[queue])
        yield tasks
        yield dead
        yield age


class _Snapshot:
    def __init__(self, counts: dict[str, dict[TaskStatus, int]], ages: dict[str, float]) -> None:
        self.counts = counts
        self.ages = ages


def _age_seconds(oldest: dt.datetime | None, now: dt.datetime) -> float:
    return 0.0 if oldest is None else max((now - oldest).total_seconds(), 0.0)


def register_collectors(executor: TaskCounts | None = None) -> TaskCountCollector | None:
    """Create this process's metrics and register the task gauges, read through ``executor``,
    in the default registry, once (later calls return the same collector; the app makes the
    first, with the service, when Django starts). Touches no storage: that happens per scrape.
    Returns None without prometheus_client."""
    global _task_collector
    if _get() is None:
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
        from django.db import connections

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
    "observe_started",
    "observe_submitted",
    "observe_transition",
    "register_collectors",
    "serve",
    "set_master",
    "track_pool",
]
