"""The reading half of the storage interface: tasks by id, pages of the task list, counts and
the charts' minute counts (what the admin, the API and the service read)."""

from __future__ import annotations

import abc
import builtins
import datetime as dt
from collections.abc import Collection, Sequence

from ..core.clock import Clock
from ..core.minute_counts import CHART_MINUTES, MinuteCounts
from ..core.parameter_filter import Pairs
from ..core.queries import TaskQuery
from ..core.records import TaskInfo
from ..core.states import TaskStatus
from ..core.task_count import TaskCount
from .checks import every_minute, minute_span, task_query


class ReadStorage(abc.ABC):
    """Reads only: nothing here changes a task."""

    clock: Clock

    @abc.abstractmethod
    def get(self, task_id: str) -> TaskInfo | None: ...

    def get_many(self, task_ids: Sequence[str]) -> dict[str, TaskInfo]:
        """The stored tasks among these ids, by id (unknown ids left out)."""
        found: dict[str, TaskInfo] = {}
        for task_id in task_ids:
            info = self.get(task_id)
            if info is not None:
                found[task_id] = info
        return found

    @abc.abstractmethod
    def dependents_of(self, task_id: str, limit: int | None = None) -> builtins.list[str]:
        """The ids of the tasks submitted with ``depends_on`` naming ``task_id`` (while both
        are stored), sorted. ``limit``: at most that many are read (the databases: the first
        in id order; Redis: that many of its set, in no set order), so that a task thousands
        wait for costs what is shown; ``count_dependents`` says how many there are."""

    @abc.abstractmethod
    def count_dependents(self, task_id: str) -> int:
        """How many ids ``dependents_of(task_id)`` would return (one cheap read)."""

    def list(
        self,
        *,
        status: TaskStatus | None = None,
        task_name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        offset: int = 0,
        statuses: Collection[TaskStatus] | None = None,
        batch_id: str | None = None,
        schedule_runs: bool | None = None,
        schedule_id: str | None = None,
        tag: str | None = None,
        parameter: Pairs | None = None,
        indexed: tuple[tuple[str, str], ...] = (),
    ) -> list[TaskInfo]:
        """Newest first (by creation, then task id). ``statuses`` lists the tasks of any of
        these statuses (an empty one: none); it cannot be combined with ``status``.
        ``batch_id``: the tasks whose ``TaskInfo.batch_id`` it is (members and callbacks).
        ``schedule_runs``: True only the tasks schedules fired, False none of them;
        ``schedule_id``: only the runs of that schedule (see ``TaskQuery.origin_matches``).
        ``tag``: only the tasks submitted with that tag. ``parameter``: only the tasks whose
        parameter is an object holding these (key, value) pairs (core/parameter_filter.py);
        ``indexed``: those of them the parameter index answers (core/parameter_index.py)."""
        query = task_query(
            status,
            statuses,
            task_name,
            queue,
            limit,
            offset,
            batch_id,
            schedule_runs,
            schedule_id,
            tag,
            parameter,
            indexed,
        )
        return [] if query is None else self._list(query)

    @abc.abstractmethod
    def _list(self, query: TaskQuery) -> builtins.list[TaskInfo]:
        """``list`` of one page (its statuses never empty, its limit > 0)."""

    def count_tasks(
        self,
        query: TaskQuery,
        cap: int,
        *,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> TaskCount:
        """How many tasks ``list`` lists for ``query`` (its limit and offset ignored) that
        were submitted at or after ``since`` and at or before ``until`` (None: any time),
        read in one pass over the same filters: counting stops at ``cap`` (then the count is
        ``cap``, incomplete), so its cost is bounded by the cap where an index answers the
        filters; Redis, where none answers a task name, stops after a bound of index entries
        read (then incomplete too: docs/benchmarks.md#bulk-action-counts)."""
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"cap must be an int >= 1, got {cap!r}")
        if query.statuses is not None and not query.statuses:
            return TaskCount(0)
        return self._count_tasks(query, cap, since, until)

    @abc.abstractmethod
    def _count_tasks(
        self, query: TaskQuery, cap: int, since: dt.datetime | None, until: dt.datetime | None
    ) -> TaskCount:
        """``count_tasks`` (its statuses never empty, its cap >= 1)."""

    @abc.abstractmethod
    def count(self, queue: str | None = None) -> dict[TaskStatus, int]: ...

    @abc.abstractmethod
    def count_by_queue(self) -> dict[str, dict[TaskStatus, int]]:
        """Counts by status for every queue that holds tasks (every status present)."""

    @abc.abstractmethod
    def oldest_due(self, queue: str | None = None) -> dt.datetime | None:
        """The run_at of the earliest task that is due now and not claimed, or None."""

    @abc.abstractmethod
    def oldest_due_by_queue(self) -> dict[str, dt.datetime]:
        """``oldest_due`` of every queue that has a task due now and not claimed (paused
        queues included: their tasks wait too), read at once (one query, or one Redis round
        trip per index level), by queue name."""

    def throughput(self, minutes: int = CHART_MINUTES) -> builtins.list[MinuteCounts]:
        """Tasks that ended in each of the last ``minutes`` UTC minutes, oldest first, the
        current (partial) minute last: completed, failed (FAILED, TIMEOUT, ERROR) and retried
        (automatic retries scheduled). See ``django_reliable_executor.core.minute_counts``."""
        first, last = minute_span(self.clock, minutes)
        return every_minute(self._minute_counts(first, last), first, last)

    @abc.abstractmethod
    def _minute_counts(self, first: int, last: int) -> dict[int, MinuteCounts]:
        """``throughput`` of epoch minutes ``first..last`` (both included); minutes with no
        ending may be left out."""

    def completed_by_queue(
        self, queues: Sequence[str], minutes: int = CHART_MINUTES
    ) -> dict[str, builtins.list[int]]:
        """Tasks completed in each of the last ``minutes`` UTC minutes in each of ``queues``
        (as throughput's *completed*, split by queue): by queue, in the order given, each list
        oldest first, the current (partial) minute last, a queue with none all zeros. Reads
        only the queues asked for: the caller bounds how many."""
        first, last = minute_span(self.clock, minutes)
        asked = list(dict.fromkeys(queues))
        counted = self._completed_by_queue(asked, first, last) if asked else {}
        return {
            queue: [counted.get(queue, {}).get(minute, 0) for minute in range(first, last + 1)]
            for queue in asked
        }

    @abc.abstractmethod
    def _completed_by_queue(
        self, queues: builtins.list[str], first: int, last: int
    ) -> dict[str, dict[int, int]]:
        """``completed_by_queue`` of epoch minutes ``first..last`` (both included) for
        ``queues`` (not empty, no repeats): by queue, then by minute; queues and minutes with
        no completion may be left out."""
