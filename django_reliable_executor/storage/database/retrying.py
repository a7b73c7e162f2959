"""Retrying a task of the database storage by hand: its row reset, or a dependent waiting again."""

from __future__ import annotations

import datetime as dt

from django.db.models import F, Q

from ...core.dependencies import WAITING_RUN_AT, awaited_on_retry
from ...core.records import Transition
from ...core.states import TaskStatus
from ...exceptions import AttemptStillRunningError
from ...models import ReliableTask
from .access import DatabaseAccess
from .rows import to_info


def retry_row(
    storage: DatabaseAccess, row: ReliableTask, depends_on: list[str]
) -> Transition | None:
    """Retry ``row`` as it was read; a dependent (``depends_on``) in the open transaction."""
    task_id = row.task_id
    now = storage.clock.now()
    awaited = awaited_dependencies(storage, row, depends_on) if depends_on else ()
    # Refused while the previous attempt's holder still holds its lease (a timed-out
    # handler still running, see expire_overdue): both would run at once. A lease that
    # lapsed ends the task first (dependents and batch settled), as its recovery would.
    if row.lease_expires_at is not None and row.lease_expires_at <= now:
        storage._handler_ended(Q(pk=task_id, lease_expires_at__lte=now))
    lease_gone = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now)
    changed = (
        storage._tasks()
        .filter(lease_gone, pk=task_id, status=row.status)
        .update(
            **_reset(row, now, awaited),
            # A task parked at its key's cap when it ended (key_parking.py) waits in its
            # name's range again: no parked key may still name that range.
            limited_name=row.task_name if row.task_name in storage.flow_limits.names() else "",
            budget_attempts=0,
            cancel_requested=False,
            finished_at=None,
            result=None,
            progress=None,  # a fresh run reports afresh
            lease_expires_at=None,
            lease_token=F("lease_token") + 1,  # no earlier claim of it counts any more
        )
    )
    if changed and row.batch_id is not None:
        storage._reopen_batch_member(row.batch_id, task_id, row.status)
    if not changed:
        holder = (
            storage._tasks()
            .filter(pk=task_id, status=row.status, lease_expires_at__gt=now)
            .values_list("worker_id", "lease_expires_at")
            .first()
        )
        if holder is not None and holder[1] is not None:
            raise AttemptStillRunningError(task_id, holder[0], holder[1])
        return None
    if not awaited:
        storage._work_committed([row.queue])
    previous = TaskStatus(row.status)
    row.status = TaskStatus.CREATED.value if awaited else TaskStatus.PENDING.value
    row.run_at, row.finished_at = (WAITING_RUN_AT if awaited else now), None
    row.waiting_for = list(awaited) or None
    row.waiting = None
    row.cancel_requested, row.result, row.progress = False, None, None
    return Transition(task=to_info(row), previous=previous)


def _reset(row: ReliableTask, now: dt.datetime, awaited: tuple[str, ...]) -> dict[str, object]:
    """The columns a retry of ``row`` sets besides its attempt's: due now, or, ``awaited``,
    waiting for those dependencies."""
    deadline = (
        now + dt.timedelta(milliseconds=row.max_duration_millis)
        if row.max_duration_millis
        else None
    )
    changes: dict[str, object] = {
        "status": TaskStatus.PENDING.value,
        "available": True,
        "run_at": now,
        "deadline_at": deadline,
        "waiting_for": None,
        "waiting": None,
    }
    if awaited:
        # Waits again as at its submit: CREATED, out of every claim's way, until its
        # dependencies' endings release it (they still have its edges).
        changes.update(
            status=TaskStatus.CREATED.value,
            available=False,
            run_at=WAITING_RUN_AT,
            deadline_at=None,
            waiting_for=list(awaited),
        )
    return changes


def awaited_dependencies(
    storage: DatabaseAccess, row: ReliableTask, depends_on: list[str]
) -> tuple[str, ...]:
    """The dependencies of ``row`` not ended, read with a locking read in the open
    transaction (as a dependent's submit reads them: dependency rows before the
    dependent's, the order of an ending write); raises DependencyNotCompletedError when
    one ended otherwise than COMPLETED (see dependencies.awaited_on_retry)."""
    if storage.vendor == "sqlite":
        # The first write takes the database's write lock: what follows is read alone.
        storage._tasks().filter(pk=row.task_id).update(status=F("status"))
    found = {
        # Terminal with its lease kept: its timed-out handler still runs, so it has not
        # ended (as in Dependencies._wait_for); its handler's return settles the dependent.
        pk: status if lease is None else TaskStatus.RUNNING.value
        for pk, status, lease in storage._tasks()
        .select_for_update()
        .filter(pk__in=depends_on)
        .order_by("pk")
        .values_list("pk", "status", "lease_expires_at")
    }
    return awaited_on_retry(row.task_id, depends_on, found, row.on_dependency_failure)
