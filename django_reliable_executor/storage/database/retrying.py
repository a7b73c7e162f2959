"""Retrying a task of the database storage by hand: its row reset, or a dependent waiting again."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from django.db.models import F, Q

from ...core.dependencies import WAITING_RUN_AT, awaited_on_retry
from ...core.records import Transition
from ...core.states import RETRYABLE_BY_HAND, TaskStatus
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
        .update(**_retried_columns(storage, row, now, awaited))
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
    return _transition(row, now, awaited)


def _transition(row: ReliableTask, now: dt.datetime, awaited: tuple[str, ...]) -> Transition:
    """The retry of ``row`` as written, for the announcer."""
    previous = TaskStatus(row.status)
    row.status = TaskStatus.CREATED.value if awaited else TaskStatus.PENDING.value
    row.run_at, row.finished_at = (WAITING_RUN_AT if awaited else now), None
    row.waiting_for = list(awaited) or None
    row.waiting = None
    row.cancel_requested, row.result, row.progress = False, None, None
    return Transition(task=to_info(row), previous=previous)


def _retried_columns(
    storage: DatabaseAccess, row: ReliableTask, now: dt.datetime, awaited: tuple[str, ...]
) -> dict[str, object]:
    """Every column a retry of ``row`` writes."""
    return {
        **_reset(row, now, awaited),
        # A task parked at its key's cap when it ended (key_parking.py) waits in its
        # name's range again: no parked key may still name that range.
        "limited_name": row.task_name if row.task_name in storage.flow_limits.names() else "",
        "budget_attempts": 0,
        "cancel_requested": False,
        "finished_at": None,
        "result": None,
        "progress": None,  # a fresh run reports afresh
        "lease_expires_at": None,
        "lease_token": F("lease_token") + 1,  # no earlier claim of it counts any more
    }


def retry_plain_rows(
    storage: DatabaseAccess, task_ids: Sequence[str]
) -> tuple[list[Transition], list[str]]:
    """``TaskStorage.retry_plain`` in the open transaction: the plain rows of ``task_ids``
    (retryable, no dependencies, no batch, no lease) read under a lock and reset by one
    UPDATE per group of rows that get the same columns; the rest left to ``retry``."""
    plain = Q(
        pk__in=list(task_ids),
        status__in=sorted(s.value for s in RETRYABLE_BY_HAND),
        lease_expires_at__isnull=True,
        batch_id__isnull=True,
    )
    if storage.vendor == "sqlite":
        # The first write takes the database's write lock: the rows read next stay as read.
        storage._tasks().filter(plain).update(status=F("status"))
    read = storage._tasks().select_for_update().filter(plain)
    # A dependent's retry reads its dependencies first (retry_row): left to retry.
    rows = [row for row in read if row.depends_on in (None, [], "[]")]
    now = storage.clock.now()
    groups: dict[tuple[str, int | None, str], list[ReliableTask]] = {}
    for row in rows:
        groups.setdefault((row.task_name, row.max_duration_millis, row.status), []).append(row)
    for group in groups.values():
        ids = [row.pk for row in group]
        columns = _retried_columns(storage, group[0], now, ())
        storage._tasks().filter(plain, pk__in=ids).update(**columns)
    if rows:
        storage._work_committed(sorted({row.queue for row in rows}))
    done = {row.pk for row in rows}
    return [_transition(row, now, ()) for row in rows], [i for i in task_ids if i not in done]


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
