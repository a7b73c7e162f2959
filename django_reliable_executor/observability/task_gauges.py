"""The task gauges: stored tasks by status and queue, dead letters, the oldest due task's age,
the paused queues, the use of each rate limit and the tasks in a durable wait, read through the
service when Prometheus scrapes."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from ..core.states import DEAD_LETTER_STATUSES, TaskStatus
from .collectors import PREFIX

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ..core.clock import Clock
    from ..core.queries import RateUse

logger = logging.getLogger("django_reliable_executor")

# The task gauges query the storage (a GROUP BY, the oldest due task of every queue): at most once
# per this many seconds per process, whatever the number of scrapers.
COUNT_CACHE_SECONDS = 5.0


class TaskCounts(Protocol):
    """What the task gauges read: the service (``executor``), which sits above this module."""

    @property
    def clock(self) -> Clock: ...

    def count_by_queue(self) -> dict[str, dict[TaskStatus, int]]: ...

    def oldest_due_by_queue(self) -> dict[str, dt.datetime]: ...

    def paused_queues(self) -> set[str]: ...
    def rate_limit_use(self) -> list[RateUse]: ...

    def count_waiting(self) -> dict[str, int]: ...


class TaskCountCollector:
    """``reliable_executor_tasks{status, queue}``,
    ``reliable_executor_dead_letters{queue}`` (the FAILED + TIMEOUT + ERROR of the same counts),
    ``reliable_executor_oldest_due_task_age_seconds{queue}``,
    ``reliable_executor_queue_paused{queue}`` (1 paused, 0 for a queue holding tasks),
    ``reliable_executor_rate_limited_tasks{task_name}`` (waiting tasks a rate limit holds back)
    and ``reliable_executor_rate_limit_started{task_name}`` (starts in the limit's last
    window, every rate key together), read through the service when scraped, at most once per
    ``cache_seconds``. A storage error skips these samples (logged at debug): the scrape itself
    never fails.

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
            # Every queue's oldest due task in one read (as the admin's summary reads them),
            # not one read per queue.
            oldest_due = executor.oldest_due_by_queue()
            now = executor.clock.now()
            ages = {queue: _age_seconds(oldest_due.get(queue), now) for queue in counts}
            paused = executor.paused_queues()
            rates = executor.rate_limit_use()
            waiting = executor.count_waiting()
        except Exception:
            logger.debug("metrics: task counts not read, storage unavailable", exc_info=True)
            return None
        return _Snapshot(counts, ages, paused, rates, waiting)

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
        paused = GaugeMetricFamily(
            f"{PREFIX}_queue_paused",
            "1 while the queue is paused (no worker claims its tasks), 0 for the other queues "
            "holding tasks.",
            labels=["queue"],
        )
        held = GaugeMetricFamily(
            f"{PREFIX}_rate_limited_tasks",
            "Waiting tasks held back by their task name's rate_limit (their window is full).",
            labels=["task_name"],
        )
        started = GaugeMetricFamily(
            f"{PREFIX}_rate_limit_started",
            "Tasks of a rate-limited name started in its limit's last window (all rate keys).",
            labels=["task_name"],
        )
        waits = GaugeMetricFamily(
            f"{PREFIX}_waiting_tasks",
            "Tasks in a durable wait (context.sleep, wait_for_event, wait_for), by kind: "
            "PENDING, holding no worker.",
            labels=["kind"],
        )
        if snapshot is not None:
            for kind, n in snapshot.waiting.items():
                waits.add_metric([kind], n)
            for queue in sorted(set(snapshot.counts) | snapshot.paused):
                paused.add_metric([queue], 1 if queue in snapshot.paused else 0)
            for use in snapshot.rates:
                held.add_metric([use.task_name], use.held_back)
                started.add_metric([use.task_name], use.started)
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
        yield paused
        yield held
        yield started
        yield waits


class _Snapshot:
    def __init__(
        self,
        counts: dict[str, dict[TaskStatus, int]],
        ages: dict[str, float],
        paused: set[str],
        rates: list[RateUse],
        waiting: dict[str, int],
    ) -> None:
        self.counts = counts
        self.ages = ages
        self.paused = paused
        self.rates = rates
        self.waiting = waiting


def _age_seconds(oldest: dt.datetime | None, now: dt.datetime) -> float:
    return 0.0 if oldest is None else max((now - oldest).total_seconds(), 0.0)
