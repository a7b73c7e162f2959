"""Durable waits on the database storage: a waiting task's row and its wait's record, the
events sent to tasks (reliable_executor_task_event), and the tasks a ``wait_for`` waits on,
linked as dependencies are (reliable_executor_dependency) so their ending wakes it."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.db import transaction
from django.db.models import Count, F
from django.db.models.fields.json import KT

from ...core.dependencies import WAITING_RUN_AT
from ...core.records import Claim, Transition
from ...core.serialization import Encoded
from ...core.states import TaskStatus
from ...core.waits import EVENT, SLEEP, TASKS, WAIT_KINDS, Wait
from ...models import ReliableDependency, ReliableTaskEvent
from .access import DatabaseAccess
from .rows import TERMINAL
from .step_rows import step_rows


def _events(alias: str) -> Any:
    return ReliableTaskEvent.objects.using(alias)


class Waits(DatabaseAccess):
    """suspend, send_event and task_events (dependencies.py wakes a ``wait_for`` waiter)."""

    def suspend(self, claim: Claim, wait: Wait | None) -> Transition | None:
        """One transaction: the fenced UPDATE that makes the task PENDING without a lease (its
        attempt handed back, a resumption counted), then what the wait needs: its record among
        the checkpoints, and for an event sent already or tasks ended already, due now. The
        tasks a ``wait_for`` awaits are locked first, as a new dependent locks its
        dependencies, before the waiter's row (an ending write holds its own row, then its
        waiters'), so the two never wait on each other in a cycle."""
        now = self.clock.now()

        def write() -> Transition | None:
            with transaction.atomic(using=self.alias):
                return self._suspend(claim, wait, now)

        return self._retrying(write)

    def _suspend(self, claim: Claim, wait: Wait | None, now: dt.datetime) -> Transition | None:
        awaited: list[str] = []
        if wait is not None and wait.kind == TASKS:
            awaited = self._not_ended(list(wait.task_ids))
            wait = dataclasses.replace(wait, task_ids=tuple(awaited))
        # Available, as a delayed task is: claims take it at its run_at, and no
        # max_concurrency counts it (an unavailable task without a lease would look held).
        run_at, due = _resumes_at(wait, awaited, now)
        described = None if wait is None else wait.describe()
        changed = (
            self._tasks()
            .filter(
                pk=claim.task_id,
                lease_token=claim.token,
                status=TaskStatus.RUNNING.value,
                cancel_requested=False,
            )
            .update(
                status=TaskStatus.PENDING.value,
                available=True,
                run_at=run_at,
                lease_expires_at=None,
                attempts=F("attempts") - 1,
                budget_attempts=F("budget_attempts") - 1,
                resumptions=F("resumptions") + 1,
                waiting=described,
                waiting_for=awaited or None,
            )
        )
        if not changed:
            return None
        if wait is not None:
            self._record(claim, wait, now)
            if wait.kind == EVENT and self._event_sent(claim.task_id, wait.event):
                run_at, due = now, True
                self._tasks().filter(pk=claim.task_id).update(run_at=now)
            elif awaited:
                self._link(claim.task_id, awaited)
        if due:
            self._work_committed([claim.task.queue])
        task = claim.task
        return Transition(
            task=dataclasses.replace(
                task,
                status=TaskStatus.PENDING,
                run_at=run_at,
                attempts=task.attempts - 1,
                resumptions=task.resumptions + 1,
                waiting=described,
                waiting_for=tuple(awaited),
                handler_running=False,
            ),
            previous=TaskStatus.RUNNING,
        )

    def _not_ended(self, task_ids: list[str]) -> list[str]:
        """Those of ``task_ids`` that have not ended, read with a locking read (in id order):
        live, or terminal while a timed-out handler runs on (its lease kept). A task that does
        not exist any more was purged, so it had ended."""
        rows = (
            self._tasks()
            .select_for_update()
            .filter(pk__in=task_ids)
            .order_by("pk")
            .values_list("pk", "status", "lease_expires_at")
        )
        live = {pk for pk, status, lease in rows if status not in TERMINAL or lease is not None}
        return [task_id for task_id in task_ids if task_id in live]

    def _record(self, claim: Claim, wait: Wait, now: dt.datetime) -> None:
        """The wait's record among the task's checkpoints, unless a resumed call's is there."""
        rows = step_rows(self.alias)
        if not rows.filter(task_id=claim.task_id, name=wait.name).exists():
            rows.create(
                task_id=claim.task_id,
                name=wait.name,
                result=wait.record(),
                finished_at=now,
                token=claim.token,
            )

    def _event_sent(self, task_id: str, name: str | None) -> bool:
        return bool(_events(self.alias).filter(task_id=task_id, name=name).exists())

    def _link(self, waiter: str, awaited: list[str]) -> None:
        """Edges from the awaited tasks (locked by ``_not_ended``) to the waiter, and their
        has_dependents flag: their ending settles it as it settles a dependent."""
        ReliableDependency.objects.using(self.alias).bulk_create(
            [ReliableDependency(dependency_id=d, dependent_id=waiter) for d in awaited],
            ignore_conflicts=True,
        )
        self._tasks().filter(pk__in=awaited, has_dependents=False).update(has_dependents=True)

    def send_event(self, task_id: str, name: str, payload: Encoded) -> bool:
        """One transaction: the task's row locked first (as ``suspend`` locks it), the event
        stored unless one of that name is (the first payload is kept), then a task waiting
        for it made due now. False, storing nothing, for a task unknown or terminal."""
        now = self.clock.now()

        def write() -> bool:
            with transaction.atomic(using=self.alias):
                row = self._tasks().select_for_update().filter(pk=task_id)
                found = row.values_list("status", flat=True).first()
                if found is None or found in TERMINAL:
                    return False
                if not self._event_sent(task_id, name):
                    _events(self.alias).create(
                        task_id=task_id, name=name, payload=payload.value, sent_at=now
                    )
                # Read again: on SQLite the INSERT took the write lock only now.
                status, waiting, queue = row.values_list("status", "waiting", "queue").get()
                # Waiting for it, and not a claimed resumption (its claim cleared waiting;
                # made due again, it would lose its claim).
                waits_for_it = (
                    status == TaskStatus.PENDING.value
                    and isinstance(waiting, dict)
                    and waiting.get("kind") == EVENT
                    and waiting.get("event") == name
                )
                if waits_for_it and row.filter(lease_expires_at__isnull=True).update(run_at=now):
                    self._work_committed([queue])
                return True

        return self._retrying(write)

    def task_events(self, task_id: str) -> dict[str, Any]:
        rows = _events(self.alias).filter(task_id=task_id).order_by("id")
        return dict(rows.values_list("name", "payload"))

    def count_waiting(self) -> dict[str, int]:
        counts = dict.fromkeys(WAIT_KINDS, 0)
        rows = (
            self._tasks()
            .filter(
                status=TaskStatus.PENDING.value,
                waiting__isnull=False,
                lease_expires_at__isnull=True,  # not claimed (resumed) yet
            )
            .order_by()
            .values(kind=KT("waiting__kind"))
            .annotate(n=Count("pk"))
        )
        for row in rows:
            if row["kind"] in counts:
                counts[row["kind"]] = row["n"]
        return counts


def _resumes_at(
    wait: Wait | None, awaited: list[str], now: dt.datetime
) -> tuple[dt.datetime, bool]:
    """When the suspended task is due again, and whether that is now: a stop (no wait) or a
    wait for tasks that have all ended at once; a sleep at its end; an event or tasks at the
    timeout, if any, or only once woken."""
    if wait is not None and wait.kind == SLEEP:
        assert wait.until is not None
        return wait.until, wait.until <= now
    if wait is None or (wait.kind == TASKS and not awaited):
        return now, True
    return wait.until or WAITING_RUN_AT, False
