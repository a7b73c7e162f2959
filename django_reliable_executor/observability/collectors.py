"""This process's Prometheus collectors (counters, histograms, gauges), created on first use in
``prometheus_client.REGISTRY``, and only if prometheus_client (an optional extra) is installed."""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
import operator
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram

    from ..core.records import TaskInfo

PREFIX = "reliable_executor"
LABELS = ("task_name", "queue")
# A task's label values and its attempt's key, read in C (map over a batch): no bytecode per task.
LABEL_VALUES = operator.attrgetter(*LABELS)
ATTEMPT = operator.attrgetter("task_id", "attempts")
_NOT_NONE = functools.partial(operator.is_not, None)  # a filter of the values not None, in C

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
# Attempts started here whose outcome was never recorded here (the lease was lost and another
# worker recorded it) are forgotten oldest first beyond this many.
MAX_TRACKED_ATTEMPTS = 10_000
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)  # schedule lag


class ProcessMetrics:
    """The collectors of this process's own events."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        def counter(name: str, documentation: str) -> Counter:
            return find_or_create(
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
        self.steps_finished: Counter = counter(
            "steps_finished",
            "Durable step checkpoints written by the handlers this process ran "
            "(context.step calls that ran their function).",
        )
        self.waits: Counter = _waits_counter()
        name = f"{PREFIX}_task_execution_seconds"
        self.execution_seconds: Histogram = find_or_create(
            name,
            lambda: Histogram(
                name,
                "Seconds from the start of an attempt in this worker to its recorded outcome.",
                LABELS,
                buckets=EXECUTION_BUCKETS,
            ),
        )
        (
            self.schedule_fired,
            self.schedule_skipped,
            self.schedule_overlap_skipped,
            self.schedule_lag,
        ) = _schedule_metrics()
        # (id of the metric, task_name, queue) -> its labelled child: labels() takes the metric's
        # lock on every call, which eight pool threads then queue on for each task.
        self._children: dict[tuple[int, str, str], Any] = {}
        # (task_id, attempt) -> time.monotonic() at the start, for attempts started here.
        self.started: collections.OrderedDict[tuple[str, int], float] = collections.OrderedDict()
        self.started_lock = threading.Lock()

    def child(self, metric: Any, task: TaskInfo) -> Any:
        """``metric.labels(task_name, queue)``, cached (label values are bounded)."""
        return self.child_of(metric, task.task_name, task.queue)

    def child_of(self, metric: Any, task_name: str, queue: str) -> Any:
        key = (id(metric), task_name, queue)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(task_name, queue)
        return found

    def attempts_started(self, tasks: list[TaskInfo]) -> None:
        """Note when attempts started here (their outcome then times them), under one lock."""
        now = time.monotonic()
        started = self.started
        with self.started_lock:
            started.update(dict.fromkeys(map(ATTEMPT, tasks), now))
            while len(started) > MAX_TRACKED_ATTEMPTS:
                started.popitem(last=False)

    def attempt_seconds(self, task: TaskInfo) -> float | None:
        """How long the attempt ran, if it started in this process (then forgotten)."""
        with self.started_lock:
            started = self.started.pop((task.task_id, task.attempts), None)
        return None if started is None else time.monotonic() - started

    def attempts_seconds(self, tasks: list[TaskInfo]) -> list[float]:
        """How long each attempt of ``tasks`` that started in this process ran (then
        forgotten), under one lock; the others have no sample."""
        with self.started_lock:
            starts = list(map(self.started.pop, map(ATTEMPT, tasks), itertools.repeat(None)))
        now = time.monotonic()
        return list(map(operator.sub, itertools.repeat(now), filter(_NOT_NONE, starts)))


def observe_many(histogram: Any, samples: list[float]) -> None:
    """``histogram.observe(sample)`` for each of ``samples``, as one increment of its sum and
    one of each bucket they fall in: per sample, a bisection instead of prometheus_client's
    two locked increments and its walk along the buckets. Falls back to ``observe`` should
    the histogram not keep its sum and buckets as this expects (another prometheus_client)."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total: Any = getattr(histogram, "_sum", None)
    if (
        not isinstance(bounds, list)
        or not isinstance(buckets, list)
        or len(bounds) != len(buckets)
        or not hasattr(total, "inc")
    ):
        for sample in samples:
            histogram.observe(sample)
        return
    # observe() counts a sample in the first bucket whose upper bound is >= it; the last
    # bound is +Inf, so every sample has one.
    counts = collections.Counter(map(functools.partial(bisect.bisect_left, bounds), samples))
    total.inc(sum(samples))
    for index, count in counts.items():
        buckets[index].inc(count)


def _waits_counter() -> Counter:
    """Durable waits by task and kind (the worker's suspends)."""
    from prometheus_client import Counter

    return find_or_create(
        f"{PREFIX}_waits",
        lambda: Counter(
            f"{PREFIX}_waits",
            "Handlers that stopped to wait, each one resumption to come, by kind: sleep, "
            "event, tasks (durable waits), stop (handed back at a step as the worker stopped).",
            (*LABELS, "kind"),
        ),
    )


def _schedule_metrics() -> tuple[Counter, Counter, Counter, Histogram]:
    """Runs fired, runs skipped (misfire policy), runs skipped (overlap) and the lag histogram
    of the schedules (fired by the master), unlabelled: a million schedules must not make a
    million series."""
    from prometheus_client import Counter, Histogram

    fired = find_or_create(
        f"{PREFIX}_schedule_runs_fired_total",
        lambda: Counter(f"{PREFIX}_schedule_runs_fired", "Schedule runs fired as tasks."),
    )
    skipped = find_or_create(
        f"{PREFIX}_schedule_runs_skipped_total",
        lambda: Counter(
            f"{PREFIX}_schedule_runs_skipped",
            "Missed schedule runs their misfire policy dropped (skip, run_once, or past "
            "SCHEDULE_CATCH_UP_LIMIT).",
        ),
    )
    overlap_skipped = find_or_create(
        f"{PREFIX}_schedule_overlap_skipped_total",
        lambda: Counter(
            f"{PREFIX}_schedule_overlap_skipped",
            'Schedule runs not fired because the previous run was not terminal (overlap="skip").',
        ),
    )
    lag = f"{PREFIX}_schedule_lag_seconds"
    histogram = find_or_create(
        lag,
        lambda: Histogram(
            lag, "Seconds from a run's planned time to its fire.", buckets=LAG_BUCKETS
        ),
    )
    return fired, skipped, overlap_skipped, histogram


_lock = threading.RLock()
_metrics: ProcessMetrics | None = None
_unavailable = False  # prometheus_client is not installed
_gauges: dict[str, Gauge] = {}


def find_or_create(name: str, create: Callable[[], Any]) -> Any:
    """The collector already registered under ``name`` (this module was imported again, e.g.
    reloaded by a test), else a new one: a second registration would raise."""
    from prometheus_client import REGISTRY

    names = getattr(REGISTRY, "_names_to_collectors", {})  # no public lookup exists
    existing = names.get(name)
    return existing if existing is not None else create()


def process_metrics() -> ProcessMetrics | None:
    """This process's collectors, created on first use; None without prometheus_client."""
    global _metrics, _unavailable
    if _metrics is not None or _unavailable:
        return _metrics
    with _lock:
        if _metrics is None and not _unavailable:
            try:
                _metrics = ProcessMetrics()
            except ImportError:
                _unavailable = True
        return _metrics


def unlabelled_gauge(name: str, documentation: str) -> Gauge | None:
    """The unlabelled gauge ``name``, created on first use; None without prometheus_client."""
    if process_metrics() is None:
        return None
    with _lock:
        found = _gauges.get(name)
        if found is None:
            from prometheus_client import Gauge

            found = _gauges[name] = find_or_create(name, lambda: Gauge(name, documentation))
        return found
