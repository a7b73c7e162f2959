"""Dependencies on the database storage: storing a dependent, and settling the dependents of
tasks that just ended, in the transaction of the write that ended them."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction
from django.db.models import F

from ...dependencies import WAITING_RUN_AT, failure_message, missing_error
from ...models import ReliableDependency
from ...records import NewTask, TaskInfo, copy_with
from ...states import TERMINAL_STATUSES, TaskStatus
from .access import DatabaseAccess
from .rows import chunks

TERMINAL_VALUES = frozenset(s.value for s in TERMINAL_STATUSES)


def _ids(value: Any) -> list[str]:
    """A JSON list column's value (text on some drivers, a list on others; None: empty)."""
    if isinstance(value, str):
        value = json.loads(value)
    return list(value or ())


class Dependencies(DatabaseAccess):
    """Dependents stored CREATED at WAITING_RUN_AT (no claim takes them), their edges in
    reliable_executor_dependency, and the settling that releases or cancels them."""

    def _edges(self) -> Any:
        return ReliableDependency.objects.using(self.alias)

    def _enqueue_waiting(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        """A batch holding dependents: one transaction (a savepoint in the caller's), tasks
        stored in the order given, so a task may depend on one before it (a chain). A
        dependency that does not exist rolls the whole batch back (InvalidDependencyError)."""
        results: list[tuple[TaskInfo, bool]] = []
        with transaction.atomic(using=self.alias):
            for task in tasks:
                if task.unique_key is not None:
                    holder = self._take_unique_key(task)
                    if holder is not None:
                        results.append((holder, False))
                        continue
                if not task.depends_on:
                    results.append(self._enqueue_one(task))
                    continue
                # Stored waiting first: on SQLite this write takes the database's write lock
                # before the dependencies are read, so none can end unseen in between.
                waiting = copy_with(task, run_at=WAITING_RUN_AT, deadline_at=None)
                info, created = self._enqueue_one(waiting)
                if created:
                    info = self._wait_for(task)
                results.append((info, created))
        return results

    def _wait_for(self, task: NewTask) -> TaskInfo:
        """Record the edges of the new dependent ``task``, read its dependencies with a
        locking read (one ending now waits for this transaction, then finds the edge) and
        settle it against those already ended."""
        ids = list(task.depends_on)
        self._tasks().filter(pk=task.task_id).update(
            depends_on=ids, waiting_for=ids, on_dependency_failure=task.on_dependency_failure
        )
        self._edges().bulk_create(
            [ReliableDependency(dependency_id=d, dependent_id=task.task_id) for d in ids]
        )
        found = dict(
            self._tasks()
            .select_for_update()
            .filter(pk__in=ids)
            .order_by("pk")
            .values_list("pk", "status")
        )
        missing = [d for d in ids if d not in found]
        if missing:
            raise missing_error(task.task_id, missing)
        ended = [(d, found[d]) for d in ids if found[d] in TERMINAL_VALUES]
        now = self.clock.now()
        if ended:
            outcome = self._settle_one(
                task.task_id, ids, ended, task.on_dependency_failure, task.max_duration_millis, now
            )
            if outcome == "released":
                self._work_committed([task.queue])
        info = self.get(task.task_id)
        assert info is not None
        return info

    def _settle_one(
        self,
        task_id: str,
        waiting: list[str],
        ended: Sequence[tuple[str, str]],
        on_failure: str | None,
        max_duration_millis: int | None,
        now: dt.datetime,
    ) -> str | None:
        """Apply ``ended`` (dependencies that just ended, with their status) to the waiting
        dependent ``task_id``: cancel it, make it due now, or keep it waiting for the rest.
        Returns "cancelled", "released" or None (still waiting)."""
        failed = next(((d, s) for d, s in ended if s != TaskStatus.COMPLETED.value), None)
        row = self._tasks().filter(pk=task_id, status=TaskStatus.CREATED.value)
        if failed is not None and on_failure == "cancel":
            row.update(
                status=TaskStatus.CANCELLED.value,
                available=False,
                finished_at=now,
                last_error=failure_message(*failed),
                waiting_for=None,
                deadline_at=None,
                lease_token=F("lease_token") + 1,
            )
            return "cancelled"
        gone = {d for d, _ in ended}
        remaining = [d for d in waiting if d not in gone]
        if remaining:
            row.update(waiting_for=remaining)
            return None
        # Released: due now, its max duration counted from now.
        deadline = (
            now + dt.timedelta(milliseconds=max_duration_millis) if max_duration_millis else None
        )
        row.update(run_at=now, deadline_at=deadline, waiting_for=None)
        return "released"

    def _settle_dependents(self, ended: Mapping[str, str]) -> None:
        """Settle the dependents of the tasks in ``ended`` (id -> terminal status), which the
        caller's open transaction just ended: release those with nothing left to wait for,
        cancel those a failed dependency cancels, and theirs in turn (no signal is sent for
        such cascaded cancels). The cost is the edges of these tasks, not the waiting tasks."""
        now: dt.datetime | None = None
        released_queues: list[str] = []
        todo = dict(ended)
        while todo:
            edges: dict[str, list[str]] = {}
            for chunk in chunks(list(todo)):
                for dependency, dependent in (
                    self._edges()
                    .filter(dependency_id__in=chunk)
                    .values_list("dependency_id", "dependent_id")
                ):
                    edges.setdefault(dependent, []).append(dependency)
            if not edges:
                break
            now = now or self.clock.now()
            rows = (
                self._tasks()
                .select_for_update()
                .filter(pk__in=sorted(edges), status=TaskStatus.CREATED.value)
                .exclude(waiting_for=None)
                .order_by("pk")
                .values_list(
                    "pk", "waiting_for", "on_dependency_failure", "max_duration_millis", "queue"
                )
            )
            cascaded: dict[str, str] = {}
            for task_id, waiting_json, on_failure, max_duration, queue in rows:
                waiting = _ids(waiting_json)
                here = [(d, todo[d]) for d in edges[task_id] if d in waiting]
                if not here:
                    continue  # settled before (its dependency was retried and ended again)
                outcome = self._settle_one(task_id, waiting, here, on_failure, max_duration, now)
                if outcome == "cancelled":
                    cascaded[task_id] = TaskStatus.CANCELLED.value
                elif outcome == "released":
                    released_queues.append(queue)
            todo = cascaded
        self._work_committed(released_queues)

    def dependents_of(self, task_id: str) -> list[str]:
        """The tasks that were submitted to wait for ``task_id``, by id."""
        return sorted(
            self._edges().filter(dependency_id=task_id).values_list("dependent_id", flat=True)
        )

    def _purge_dependencies(self, task_ids: Sequence[str]) -> None:
        """Forget the edges of purged tasks (either end)."""
        for chunk in chunks(list(task_ids)):
            self._edges().filter(dependent_id__in=chunk).delete()
            self._edges().filter(dependency_id__in=chunk).delete()
