"""Dependencies on the database storage: storing a dependent, and settling the dependents of
tasks that just ended, in the transaction of the write that ended them."""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import F

from ...core.dependencies import WAITING_RUN_AT, failure_message, missing_error
from ...core.records import NewTask, TaskInfo, copy_with
from ...core.states import TERMINAL_STATUSES, TaskStatus
from ...models import ReliableDependency
from .access import DatabaseAccess
from .rows import chunks

TERMINAL_VALUES = frozenset(s.value for s in TERMINAL_STATUSES)


def json_ids(value: Any) -> list[str]:
    """A JSON list column's value (text on some drivers, a list on others; None: empty)."""
    if isinstance(value, str):
        value = json.loads(value)
    return list(value or ())


class Dependencies(DatabaseAccess):
    """Dependents stored CREATED, unavailable, at WAITING_RUN_AT (no claim sees them), their
    edges in reliable_executor_dependency, and the settling that releases or cancels them."""

    def _edges(self) -> Any:
        return ReliableDependency.objects.using(self.alias)

    def _enqueue_waiting(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        """A batch holding dependents: one transaction (a savepoint in the caller's), tasks
        stored in the order given, so a task may depend on one before it (a chain). A
        dependency that does not exist rolls the whole batch back (InvalidDependencyError).

        Locks are taken in the order every ending write takes them: task rows first (each
        dependent's dependencies as it is stored), batch rows last, once, for the members
        cancelled at once (an ending write holds its task rows, then wants its batch's row: a
        batch row held while a dependency is then locked closes a cycle). The dependencies
        are not all locked up front: each stays locked until the commit, and a running one
        cannot renew its lease meanwhile (its heartbeat's UPDATE waits)."""
        results: list[tuple[TaskInfo, bool]] = []
        cancelled: list[tuple[str | None, str, str]] = []
        with transaction.atomic(using=self.alias):
            for task in tasks:
                # A dependent is stored waiting first: on SQLite this write takes the
                # database's write lock before the dependencies are read, so none can end
                # unseen in between.
                row = (
                    copy_with(task, run_at=WAITING_RUN_AT, deadline_at=None)
                    if task.depends_on
                    else task
                )
                if task.unique_key is not None:
                    store = functools.partial(self._enqueue_one, row)
                    info, created = self._enqueue_unique(task, store)
                else:
                    info, created = self._enqueue_one(row)
                if created and task.depends_on:
                    info = self._wait_for(task)
                    if info.status is TaskStatus.CANCELLED:  # a member counts as ended at once
                        cancelled.append((task.batch_id, task.task_id, info.status.value))
                results.append((info, created))
            self._settle_batches(cancelled)
        return results

    def _wait_for(self, task: NewTask) -> TaskInfo:
        """Read the dependencies of the new dependent ``task`` with a locking read, flag them
        has_dependents (a write ending one now waits for this transaction, then reads the
        flag and finds the edge), record its edges, and settle it against those already
        ended. Its batch is not counted here (see ``_enqueue_waiting``)."""
        ids = list(task.depends_on)
        # Unavailable while it waits: out of the claim index's way (a claim never walks the
        # waiting dependents), and waiting_for set tells it from a claimed task.
        self._tasks().filter(pk=task.task_id).update(
            depends_on=ids,
            waiting_for=ids,
            on_dependency_failure=task.on_dependency_failure,
            available=False,
        )
        found: dict[str, str] = {}
        unflagged: list[str] = []
        # Locked before the edges are inserted: on MySQL an ending write's locking read of
        # its edges waits for an uncommitted edge, so an edge inserted first, then a wait for
        # the dependency's row (which that write holds), would be a deadlock.
        for pk, status, flagged, lease in (
            self._tasks()
            .select_for_update()
            .filter(pk__in=ids)
            .order_by("pk")
            .values_list("pk", "status", "has_dependents", "lease_expires_at")
        ):
            # Terminal with its lease kept: its timed-out handler still runs, so it has not
            # ended; its handler's return (or the lease's lapse) settles this dependent.
            found[pk] = status if lease is None else TaskStatus.RUNNING.value
            if not flagged:
                unflagged.append(pk)
        missing = [d for d in ids if d not in found]
        if missing:
            raise missing_error(task.task_id, missing)
        self._edges().bulk_create(
            [ReliableDependency(dependency_id=d, dependent_id=task.task_id) for d in ids]
        )
        if unflagged:
            # Under the lock just taken (SQLite: the write lock of the INSERT above), so a
            # completion of one of them either ended it before (read above) or reads the flag.
            self._tasks().filter(pk__in=unflagged).update(has_dependents=True)
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
            cancelled = row.update(
                status=TaskStatus.CANCELLED.value,
                available=False,
                finished_at=now,
                last_error=failure_message(*failed),
                waiting_for=None,
                deadline_at=None,
                lease_token=F("lease_token") + 1,
            )
            return "cancelled" if cancelled else None
        gone = {d for d, _ in ended}
        remaining = [d for d in waiting if d not in gone]
        if remaining:
            row.update(waiting_for=remaining)
            return None
        # Released: due now, its max duration counted from now.
        deadline = (
            now + dt.timedelta(milliseconds=max_duration_millis) if max_duration_millis else None
        )
        row.update(run_at=now, deadline_at=deadline, waiting_for=None, available=True)
        return "released"

    def _settle_dependents(self, ended: Mapping[str, str]) -> list[tuple[str | None, str, str]]:
        """Settle the dependents of the tasks in ``ended`` (id -> terminal status), which the
        caller's open transaction just ended: release those with nothing left to wait for,
        cancel those a failed dependency cancels, and theirs in turn (no signal is sent for
        such cascaded cancels). The cost is the edges of these tasks, not the waiting tasks:
        one indexed SELECT when they have no dependents (a completion of tasks never flagged
        has_dependents skips this, see Transitions._complete_span). Returns
        the cancelled ones, ``(batch_id, task_id, "CANCELLED")`` each, for their batches."""
        now: dt.datetime | None = None
        released_queues: list[str] = []
        cancelled: list[tuple[str | None, str, str]] = []
        todo = dict(ended)
        while todo:
            waiting, waiters = self._waiting_dependents(list(todo))
            if not waiting:
                break
            now = now or self.clock.now()
            releases: dict[int | None, list[tuple[str, str]]] = {}  # by max duration
            cascaded: dict[str, str] = {}
            for task_id, (
                awaited,
                on_failure,
                max_duration,
                queue,
                batch_id,
                causes,
            ) in waiting.items():
                here = [(d, todo[d]) for d in causes if d in awaited]
                if not here:
                    continue  # settled before (its dependency was retried and ended again)
                if task_id in waiters:  # a durable wait_for: woken, whatever they ended as
                    if self._wake_waiter(task_id, awaited, here, now):
                        released_queues.append(queue)
                    continue
                failed = any(status != TaskStatus.COMPLETED.value for _, status in here)
                if len(here) == len(awaited) and not (failed and on_failure != "run"):
                    releases.setdefault(max_duration, []).append((task_id, queue))
                    continue
                outcome = self._settle_one(task_id, awaited, here, on_failure, max_duration, now)
                if outcome == "cancelled":
                    cascaded[task_id] = TaskStatus.CANCELLED.value
                    cancelled.append((batch_id, task_id, TaskStatus.CANCELLED.value))
                elif outcome == "released":
                    released_queues.append(queue)
            for max_duration, released in releases.items():
                released_queues += self._release_all(released, max_duration, now)
            todo = cascaded
        self._work_committed(released_queues)
        return cancelled

    def _waiting_dependents(
        self, task_ids: Sequence[str]
    ) -> tuple[
        dict[str, tuple[list[str], str | None, int | None, str, str | None, list[str]]], set[str]
    ]:
        """The dependents of these tasks still waiting, read with a locking read in one
        statement: dependent id -> (ids it awaits, on-failure policy, max duration, queue,
        batch id, which of ``task_ids`` it depends on); and which of them are PENDING tasks
        in a durable ``wait_for`` (waits.py), not dependents waiting to start."""
        lock = {"postgresql": " FOR UPDATE OF t", "mysql": " FOR UPDATE"}.get(self.vendor, "")
        edges = connections[self.alias].ops.quote_name(ReliableDependency._meta.db_table)
        found: dict[str, tuple[list[str], str | None, int | None, str, str | None, list[str]]] = {}
        waiters: set[str] = set()
        for chunk in chunks(list(task_ids)):
            with connections[self.alias].cursor() as cursor:
                cursor.execute(
                    "SELECT d.dependent_id, d.dependency_id, t.waiting_for, "
                    "t.on_dependency_failure, t.max_duration_millis, t.queue, t.batch_id, "
                    f"t.status FROM {edges} d JOIN {self._table} t "
                    "ON t.task_id = d.dependent_id "
                    f"WHERE d.dependency_id IN ({', '.join(['%s'] * len(chunk))}) "
                    "AND t.status IN (%s, %s) AND t.waiting_for IS NOT NULL "
                    f"ORDER BY d.dependent_id{lock}",
                    [*chunk, TaskStatus.CREATED.value, TaskStatus.PENDING.value],
                )
                for (
                    dependent,
                    dependency,
                    awaited,
                    on_failure,
                    max_duration,
                    queue,
                    batch,
                    status,
                ) in cursor:
                    if status == TaskStatus.PENDING.value:
                        waiters.add(dependent)
                    entry = found.get(dependent)
                    if entry is None:
                        entry = found[dependent] = (
                            json_ids(awaited),
                            on_failure,
                            max_duration,
                            queue,
                            batch,
                            [],
                        )
                    entry[5].append(dependency)
        return found, waiters

    def _wake_waiter(
        self,
        task_id: str,
        awaited: list[str],
        ended: Sequence[tuple[str, str]],
        now: dt.datetime,
    ) -> bool:
        """Apply ``ended`` to a PENDING task whose ``wait_for`` awaits ``awaited``: due now
        once none is left (its deadline unchanged: it counts from creation through every
        wait), else waiting for the rest. True when it was woken."""
        gone = {d for d, _ in ended}
        remaining = [d for d in awaited if d not in gone]
        # Not a claimed resumption (its wait timed out): it runs already, and the claim
        # cleared waiting_for.
        row = self._tasks().filter(
            pk=task_id, status=TaskStatus.PENDING.value, lease_expires_at__isnull=True
        )
        if remaining:
            row.update(waiting_for=remaining)
            return False
        return bool(row.update(run_at=now, waiting_for=None))

    def _release_all(
        self, released: list[tuple[str, str]], max_duration: int | None, now: dt.datetime
    ) -> list[str]:
        """Make these waiting dependents (of one max duration), ``(task_id, queue)`` each, due
        now, in one UPDATE. Returns the queues whose idle workers are still to be woken (see
        ``_work_committed``): none on PostgreSQL, where the same statement notifies them."""
        deadline = now + dt.timedelta(milliseconds=max_duration) if max_duration else None
        postgresql = self.vendor == "postgresql"
        for chunk in chunks(released):
            sql = (
                f"UPDATE {self._table} SET run_at = %s, deadline_at = %s, waiting_for = NULL, "
                "available = TRUE "
                f"WHERE task_id IN ({', '.join(['%s'] * len(chunk))}) AND status = %s"
            )
            params = [
                self._dt(now),
                None if deadline is None else self._dt(deadline),
                *(task_id for task_id, _ in chunk),
                TaskStatus.CREATED.value,
            ]
            if postgresql:
                # One round trip less: the NOTIFY is sent on commit either way.
                sql = (
                    f"WITH released AS ({sql}) "
                    f"SELECT pg_notify({self._wakeups.channel}, q) FROM unnest(%s::text[]) AS q"
                )
                params.append(list(dict.fromkeys(queue for _, queue in chunk)))
            self._execute(sql, params)
        return [] if postgresql else [queue for _, queue in released]

    def _purge_dependencies(self, task_ids: Sequence[str]) -> None:
        """Forget the edges of purged tasks (either end)."""
        table = connections[self.alias].ops.quote_name(ReliableDependency._meta.db_table)
        for chunk in chunks(list(task_ids)):
            for column in ("dependent_id", "dependency_id"):
                ids_sql, params = self._in(column, chunk)
                self._execute(f"DELETE FROM {table} WHERE {ids_sql}", params)
