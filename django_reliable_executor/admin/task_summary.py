"""The task list's summary: counts by queue and status (reused a while when counting is slow),
the oldest due task's age of each queue, its sparkline of completions, the throughput chart, the
master and the workers."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from collections.abc import Collection
from typing import Any

from ..core.records import WorkerInfo
from ..core.states import DEAD_LETTER_STATUSES, TaskStatus
from ..service.reliable_executor import ReliableExecutor
from .health import SPARKLINE_QUEUES, DueThresholds, Sparkline, chart, sparkline
from .task_pages import DEAD_LETTERS, Filters, format_duration


class SlowCounts:
    """``count_by_queue``, reused for up to ``max_age`` seconds when computing it took at least
    ``slow_seconds``.

    On Redis the counts are one small hash, read fresh on every page. On a database they are
    a GROUP BY over the whole task table's (queue, status) index: hundreds of milliseconds at a
    million rows, which a few operators reloading the list must not repeat every second.
    Operating from the admin forgets the saved counts, so the page after an action is exact.
    """

    def __init__(self, max_age: float = 10.0, slow_seconds: float = 0.05) -> None:
        self.max_age = max_age
        self.slow_seconds = slow_seconds
        self._lock = threading.Lock()
        # (the storage counted, its counts, monotonic time they were read)
        self._saved: tuple[object, dict[str, dict[TaskStatus, int]], float] | None = None

    def get(self, executor: ReliableExecutor) -> tuple[dict[str, dict[TaskStatus, int]], float]:
        """The counts and their age in seconds (0 when just read)."""
        storage = executor.storage
        now = time.monotonic()
        with self._lock:
            saved = self._saved
        if saved is not None and saved[0] is storage and now - saved[2] < self.max_age:
            return saved[1], now - saved[2]
        counts = executor.count_by_queue()
        took = time.monotonic() - now
        with self._lock:
            self._saved = (storage, counts, now) if took >= self.slow_seconds else None
        return counts, 0.0

    def forget(self) -> None:
        with self._lock:
            self._saved = None


@dataclasses.dataclass(frozen=True)
class DueAge:
    """How long a queue's (or the store's) oldest due task has waited, and its colour."""

    since: dt.datetime
    age: str  # "3 min 5 s"
    level: str  # "ok", "amber" or "red" (health.DueThresholds)


def due_age(
    since: dt.datetime | None, now: dt.datetime, thresholds: DueThresholds
) -> DueAge | None:
    if since is None:
        return None
    return DueAge(since, format_duration(now - since), thresholds.level(now - since))


@dataclasses.dataclass(frozen=True)
class QueueCounts:
    queue: str
    counts: list[tuple[TaskStatus, int, str]]  # status, count, list URL of those tasks
    total: int
    url: str
    paused: bool = False
    oldest_due: DueAge | None = None
    completed: Sparkline | None = None  # None past the first SPARKLINE_QUEUES queues


def summary(
    executor: ReliableExecutor,
    by_queue: dict[str, dict[TaskStatus, int]],
    counts_age: float = 0.0,
    thresholds: DueThresholds = DueThresholds(),  # noqa: B008 - frozen, shared safely
) -> dict[str, Any]:
    """Counts by status and queue (paused queues marked, listed even when empty), the oldest
    due task's age of each queue and of all, the tasks completed per minute over the last hour
    of each queue (the first SPARKLINE_QUEUES) and ended per minute of all,
    the master, the live workers and the use of each rate limit."""
    statuses = list(TaskStatus)
    base = Filters()
    paused = executor.paused_queues()
    now = executor.clock.now()
    due = executor.oldest_due_by_queue()
    # A paused queue is listed even with no task left, so that it can be resumed here.
    shown: dict[str, dict[TaskStatus, int]] = {**{queue: {} for queue in paused}, **by_queue}
    ordered = sorted(shown.items())
    queues = _queue_rows(executor, ordered, paused, due, now, thresholds)
    totals = {s: sum(counts.get(s, 0) for counts in by_queue.values()) for s in statuses}
    dead_letters = sum(totals[s] for s in DEAD_LETTER_STATUSES)
    # A queue holding due tasks always has counts; read at another moment, a task may be
    # due in a queue the counts missed: the overall age still shows it.
    oldest_due = min(due.values(), default=None)
    workers: list[WorkerInfo] = executor.workers()
    minutes = executor.throughput()
    return {
        "rate_limits": executor.rate_limit_use(),
        "key_limits": executor.concurrency_key_use(),
        "statuses": statuses,
        "queues": queues,
        "paused_queues": sorted(paused),
        "totals": [(s, totals[s], base.url(status=s.value)) for s in statuses],
        "grand_total": sum(totals.values()),
        "dead_letters": dead_letters,
        "dead_letters_url": base.url(status=DEAD_LETTERS),
        "dead_letter_statuses": sorted(DEAD_LETTER_STATUSES, key=statuses.index),
        "counts_age": format_duration(dt.timedelta(seconds=counts_age)) if counts_age else "",
        "oldest_due_at": oldest_due,
        "oldest_due_age": format_duration(now - oldest_due) if oldest_due else "",
        "oldest_due": due_age(oldest_due, now, thresholds),
        "thresholds": thresholds,
        "throughput": chart(minutes),
        "completed_all": sparkline("All queues", [m.completed for m in minutes]),
        "sparkline_queues": SPARKLINE_QUEUES,
        "sparklines_capped": len(ordered) > SPARKLINE_QUEUES,
        "master": executor.master(),
        "workers": [
            {
                "info": worker,
                "seen_ago": format_duration(now - worker.last_seen_at),
                "up_for": format_duration(now - worker.started_at),
            }
            for worker in workers
        ],
    }


STATUSES = list(TaskStatus)  # the table's columns, in order


def _queue_rows(
    executor: ReliableExecutor,
    ordered: list[tuple[str, dict[TaskStatus, int]]],
    paused: Collection[str],
    due: dict[str, dt.datetime],
    now: dt.datetime,
    thresholds: DueThresholds,
) -> list[QueueCounts]:
    """The queue table's rows, with the completions per minute of the first queues only
    (SPARKLINE_QUEUES: one bounded read)."""
    base = Filters()
    completed = executor.completed_by_queue([queue for queue, _ in ordered[:SPARKLINE_QUEUES]])
    return [
        QueueCounts(
            queue=queue,
            counts=[(s, counts.get(s, 0), base.url(queue=queue, status=s.value)) for s in STATUSES],
            total=sum(counts.values()),
            url=base.url(queue=queue),
            paused=queue in paused,
            oldest_due=due_age(due.get(queue), now, thresholds),
            completed=sparkline(queue, completed[queue]) if queue in completed else None,
        )
        for queue, counts in ordered
    ]
