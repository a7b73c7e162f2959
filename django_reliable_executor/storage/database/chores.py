"""The master's chores on the database storage: recover leases, time out, purge."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Any

from django.db import connections
from django.db.models import F, Q, QuerySet

from ...core.records import Transition
from ...core.retries import failure_outcome, timeout_message
from ...core.states import TaskStatus
from ...models import ReliableParkedKey, ReliableTask
from .access import DatabaseAccess
from .fair_rounds import FairKeyUpkeep
from .key_parking import is_parked_lane
from .retry_counts import add_retries, purge_retry_counts
from .rows import (
    LIVE,
    TERMINAL,
    chunks,
    claim_of,
    failure_changes,
    to_info,
)
from .step_rows import purge_steps


class Chores(DatabaseAccess):
    """recover_expired, expire_overdue, purge_finished: batch-bounded, each row a CAS."""

    def recover_expired(self, limit: int) -> list[Transition]:
        now = self.clock.now()
        rows = list(
            self._tasks()
            .filter(available=False, lease_expires_at__lt=now, status__in=LIVE)
            .order_by("lease_expires_at")[:limit]
        )
        transitions = []
        requeued: list[str] = []  # the queues of tasks due again at once
        for row in rows:
            held = self._tasks().filter(
                pk=row.pk,
                lease_token=row.lease_token,
                status=row.status,
                available=False,
                lease_expires_at__lt=now,
                cancel_requested=row.cancel_requested,
            )
            if row.status != TaskStatus.RUNNING.value:
                # Claimed but never started: back to the queue, no attempt counted.
                if held.update(
                    available=True,
                    worker_id=None,
                    lease_expires_at=None,
                    lease_token=F("lease_token") + 1,  # the old holder can no longer start it
                ):
                    requeued.append(row.queue)
                continue
            error = f"worker lost: {row.worker_id} stopped renewing its lease"
            status, run_at = failure_outcome(
                claim_of(row),
                now,
                self.backoff_cap_millis,
                retryable=True,
                cancel_requested=row.cancel_requested,
            )
            changes = failure_changes(status, run_at, error, now)
            if self._update_settled(held, changes, row, status):
                for key, value in changes.items():
                    setattr(row, key, value)
                transitions.append(Transition(task=to_info(row), previous=TaskStatus.RUNNING))
                if run_at is not None and run_at <= now:
                    requeued.append(row.queue)
        add_retries(self.alias, now, sum(t.status is TaskStatus.PENDING for t in transitions))
        self._work_committed(requeued)
        # Tasks that timed out while their handler ran, whose worker is gone (the lease it
        # kept lapsed): they end now (no status change, no transition to announce).
        for task_id in (
            self._tasks()
            .filter(available=False, lease_expires_at__lt=now, status__in=TERMINAL)
            .order_by("lease_expires_at")
            .values_list("pk", flat=True)[:limit]
        ):
            self._handler_ended(Q(pk=task_id, lease_expires_at__lt=now))
        return transitions

    def expire_overdue(self, limit: int) -> list[Transition]:
        now = self.clock.now()
        rows = list(
            self._tasks()
            .filter(deadline_at__lte=now, status__in=LIVE)
            .order_by("deadline_at")[:limit]
        )
        transitions = []
        for row in rows:
            error = timeout_message(row.max_duration_millis, row.last_error)
            changes = failure_changes(TaskStatus.TIMEOUT, None, error, now)
            match = self._tasks().filter(
                pk=row.pk, status=row.status, lease_token=row.lease_token, deadline_at__lte=now
            )
            if row.status == TaskStatus.RUNNING.value:
                # Its handler may run on (threads cannot be stopped): the holder keeps its
                # lease, renewed by its heartbeat, and the task has not *ended* until the
                # handler returns (Transitions.handler_returned) or the lease lapses
                # (recover_expired): its dependents and batch are settled then, and a
                # retry, a unique key, an overlap check and max_concurrency wait for it.
                del changes["lease_expires_at"]
                changed = match.update(**changes)
            else:
                changed = self._update_settled(match, changes, row, TaskStatus.TIMEOUT)
            if changed:
                previous = TaskStatus(row.status)
                for key, value in changes.items():
                    setattr(row, key, value)
                transitions.append(Transition(task=to_info(row), previous=previous))
        return transitions

    def _update_settled(
        self,
        rows: QuerySet[ReliableTask],
        changes: dict[str, Any],
        row: ReliableTask,
        status: TaskStatus,
    ) -> int:
        """UPDATE ``rows`` (the task ``row``) with ``changes``; when they end it (``status``
        terminal), its dependents and its batch are settled in the same transaction."""
        if not status.is_terminal:
            return rows.update(**changes)

        def end() -> int:
            changed = rows.update(**changes)
            if changed:
                self._settle_endings([(row.batch_id, row.task_id, status.value)])
            return changed

        return self._ending(end)

    def mark_limited(self, names: Collection[str], limit: int) -> int:
        """Waiting tasks whose ``limited_name`` disagrees with ``names`` set right, at most
        ``limit`` each way: the ranges of names no longer limited emptied into the claim of
        all other names (each range found by one index probe), and the tasks of a limited
        name stored without it moved into its range (read through the index on task
        names). A parked range (key_parking.py) is left to the claim of its name while a
        parked key names it; one no key names (its name lost its per-key cap, or a task
        parked there ended and was retried by hand after its key was forgotten) is emptied
        too. Then fairness's upkeep (fair_rounds.FairKeyUpkeep): the tasks whose rounds it
        cleared count among those changed."""
        changed = self._unpark_unkeyed(self.flow_limits.keyed(), limit)
        lanes = self._lanes()
        parked = [lane for lane in lanes if is_parked_lane(lane)]
        known: set[str] = set()
        for chunk in chunks(parked):
            noted = ReliableParkedKey.objects.using(self.alias).filter(lane__in=chunk)
            known.update(noted.values_list("lane", flat=True))
        lanes = [lane for lane in lanes if lane not in known]
        for lane in lanes:
            if lane not in names:
                changed += self._set_lane("''", "limited_name = %s", [lane], limit)
        if names:
            marks = ", ".join(["%s"] * len(names))
            where = f"limited_name = %s AND task_name IN ({marks})"
            changed += self._set_lane("task_name", where, ["", *sorted(names)], limit)
        # fairness, once the tasks are in their ranges: the rows of keys with nothing waiting
        # forgotten (numbering never goes back), the rounds of names no longer fair cleared.
        changed += FairKeyUpkeep(self, limit).run()
        return changed

    def _unpark_unkeyed(self, keyed: Collection[str], limit: int) -> int:
        """The parked tasks (key_parking.py) of names that lost their max_concurrency_per_key
        moved to the claim of all other names (mark_limited then moves those of a name still
        limited into its range), at most ``limit``; the keys emptied forgotten."""
        parked = ReliableParkedKey.objects.using(self.alias).exclude(name__in=list(keyed))
        moved = 0
        for lane in parked.values_list("lane", flat=True):
            room = limit - moved
            if room <= 0:
                break
            changed = self._set_lane("''", "limited_name = %s", [lane], room)
            moved += changed
            if changed < room:  # none left
                ReliableParkedKey.objects.using(self.alias).filter(lane=lane).delete()
        return moved

    def _lanes(self) -> list[str]:
        """The limited names of the waiting tasks, one index probe each (no scan of a range)."""
        lanes: list[str] = []
        with connections[self.alias].cursor() as cursor:
            while True:
                cursor.execute(
                    f"SELECT MIN(limited_name) FROM {self._table} WHERE available = %s "
                    "AND limited_name > %s",
                    [True, lanes[-1] if lanes else ""],
                )
                (lane,) = cursor.fetchone()
                if lane is None:
                    return lanes
                lanes.append(lane)

    def _set_lane(self, value_sql: str, where: str, params: list[Any], limit: int) -> int:
        """``limited_name = value_sql`` on up to ``limit`` waiting tasks ``where`` chooses.
        The ids are read first: the column only says which claim takes a task, and both
        claims check its name, so a task that changes meanwhile is never claimed wrong."""
        with connections[self.alias].cursor() as cursor:
            cursor.execute(
                f"SELECT task_id FROM {self._table} WHERE available = %s AND {where} LIMIT %s",
                [True, *params, limit],
            )
            ids = [task_id for (task_id,) in cursor.fetchall()]
        changed = 0
        for chunk in chunks(ids):
            ids_sql, id_params = self._in("task_id", chunk)
            changed += self._execute(
                f"UPDATE {self._table} SET limited_name = {value_sql} WHERE {ids_sql}", id_params
            )
        return changed

    def _purge_finished(
        self, finished_before: dt.datetime, limit: int, statuses: frozenset[TaskStatus]
    ) -> int:
        chosen = sorted(s.value for s in statuses)
        now = self.clock.now()
        # A timed-out task whose handler still runs is kept until it ended (its lease let go
        # by the handler's return or the recovery of its lapsed lease, which settles it).
        ids = list(
            self._tasks()
            .filter(
                lease_expires_at__isnull=True, finished_at__lt=finished_before, status__in=chosen
            )
            .values_list("pk", flat=True)[:limit]
        )
        # Unique keys past their window go with the finished tasks (not counted: not tasks).
        self._purge_unique_keys(now)
        purge_retry_counts(self.alias, now)  # the chart's counters, 2 h old
        if not ids or not chosen:
            return 0
        # Hand-written: at 1 000 tasks/s the queryset delete's compiling of 500-value IN lists
        # took a third of a worker's Python time, in the chores thread, beside the pool.
        statuses_sql, status_params = self._in("status", chosen)
        deleted = 0
        for chunk in chunks(ids):
            ids_sql, id_params = self._in("task_id", chunk)
            deleted += self._execute(
                f"DELETE FROM {self._table} WHERE {ids_sql} AND {statuses_sql}"
                " AND lease_expires_at IS NULL",
                [*id_params, *status_params],
            )
            self._purge_dependencies(chunk)
            purge_steps(self.alias, chunk, self._table)  # their durable steps' checkpoints
        return deleted
