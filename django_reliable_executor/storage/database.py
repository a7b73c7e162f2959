"""DatabaseStorage: tasks as rows of reliable_executor_task, every transition a conditional UPDATE.

Claiming takes a batch with ``SELECT ... FOR UPDATE SKIP LOCKED`` (MariaDB/MySQL, PostgreSQL) or
with one ``UPDATE ... WHERE task_id IN (SELECT ... LIMIT n) RETURNING`` (SQLite, PostgreSQL), so
concurrent workers never block on, or take, the same rows. A claim bumps ``lease_token``; every
later write by that worker carries the token in its WHERE clause (the fencing token), so a worker
whose lease expired cannot overwrite what the next holder recorded.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils.dateparse import parse_datetime

from ..clock import Clock
from ..models import ReliableLock, ReliableTask, ReliableWorker
from ..records import CancelResult, Claim, NewTask, TaskInfo, Transition
from ..retries import after_failure
from ..serialization import dumps
from ..states import TERMINAL_STATUSES, WAITING_STATUSES, TaskStatus
from .base import TaskStorage

T = TypeVar("T")
WAITING = [s.value for s in WAITING_STATUSES]
LIVE = [*WAITING, TaskStatus.RUNNING.value]
TERMINAL = [s.value for s in TERMINAL_STATUSES]
_NOT_WAITING = [TaskStatus.RUNNING.value, *TERMINAL]
# MySQL error codes worth retrying: deadlock found, lock wait timeout.
_MYSQL_RETRYABLE = {1213, 1205}
_CHUNK = 500  # ids per IN (...) list: well under every backend's parameter limit


def _to_info(row: ReliableTask) -> TaskInfo:
    return TaskInfo(
        task_id=row.task_id,
        task_name=row.task_name,
        status=TaskStatus(row.status),
        queue=row.queue,
        priority=row.priority,
        parameter=row.parameter,
        attempts=row.attempts,
        retry_limit=row.retry_limit,
        retry_interval=row.retry_interval,
        retry_backoff=row.retry_backoff,
        max_duration_millis=row.max_duration_millis,
        created_at=row.created_at,
        run_at=row.run_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_error=row.last_error,
        result=row.result,
        worker_id=row.worker_id,
        cancel_requested=row.cancel_requested,
    )


def _claims_match(claims: Sequence[Claim]) -> Q:
    """Rows still held under these claims' fencing tokens."""
    match = Q()
    for claim in claims:
        match |= Q(pk=claim.task_id, lease_token=claim.token)
    return match


def _held(claims: Sequence[Claim]) -> tuple[str, list[Any]]:
    """SQL for "rows still held under these claims' fencing tokens". The leading primary-key
    IN list steers every planner to the primary key: left to itself, PostgreSQL sometimes
    chose the claim index for ``available = false`` and scanned every claimed row."""
    marks = ", ".join(["%s"] * len(claims))
    tokens = " OR ".join(["(task_id = %s AND lease_token = %s)"] * len(claims))
    params: list[Any] = [claim.task_id for claim in claims]
    for claim in claims:
        params += [claim.task_id, claim.token]
    return f"task_id IN ({marks}) AND ({tokens})", params


_INFO_FIELDS = [f.name for f in dataclasses.fields(TaskInfo)]
_CLAIM_FIELDS = [*_INFO_FIELDS, "lease_token", "budget_attempts", "deadline_at"]
_CLAIM_COLUMNS_SQL = ", ".join(_CLAIM_FIELDS)  # the model's column names are its field names
_DATETIME_FIELDS = ["created_at", "run_at", "started_at", "finished_at", "deadline_at"]


def _chunks(items: Sequence[T], size: int = _CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class DatabaseStorage(TaskStorage):
    """Tasks in the ``reliable_executor_task`` table of one Django database connection."""

    supports_transactional_enqueue = True

    def __init__(
        self,
        alias: str = "default",
        clock: Clock | None = None,
        backoff_cap_millis: int | None = None,
    ) -> None:
        super().__init__(clock)
        self.alias = alias
        self._backoff_cap_millis = backoff_cap_millis

    # -- helpers --------------------------------------------------------------------------
    @property
    def backoff_cap_millis(self) -> int:
        if self._backoff_cap_millis is None:
            from ..conf import get_settings

            return get_settings().DEFAULT_RETRY_BACKOFF_MAX
        return self._backoff_cap_millis

    @property
    def vendor(self) -> str:
        return connections[self.alias].vendor

    def _tasks(self) -> QuerySet[ReliableTask]:
        return ReliableTask.objects.using(self.alias)

    @property
    def _table(self) -> str:
        return connections[self.alias].ops.quote_name(ReliableTask._meta.db_table)

    def _dt(self, value: dt.datetime) -> Any:
        """A datetime as this backend's driver wants it in hand-written SQL."""
        return connections[self.alias].ops.adapt_datetimefield_value(value)

    def _execute(self, sql: str, params: Sequence[Any]) -> int:
        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount

    def _hits(
        self,
        claims: Sequence[Claim],
        changed: int,
        status: TaskStatus,
        stamp_column: str,
        now: dt.datetime,
        held_sql: str,
        held_params: Sequence[Any],
    ) -> set[str]:
        """Which claims a batch UPDATE changed. Read back only on a partial hit: the new status
        with this exact timestamp under this token can only be that UPDATE's doing."""
        if changed == len(claims):
            return {c.task_id for c in claims}
        if not changed:
            return set()
        with connections[self.alias].cursor() as cursor:
            cursor.execute(
                f"SELECT task_id FROM {self._table} "
                f"WHERE status = %s AND {stamp_column} = %s AND ({held_sql})",
                [status.value, self._dt(now), *held_params],
            )
            return {row[0] for row in cursor.fetchall()}

    def _retrying(self, operation: Callable[[], T]) -> T:
        """Run a short transaction again when MySQL reports a deadlock or lock wait timeout."""
        for attempt in range(5):
            try:
                return operation()
            except OperationalError as exc:
                code = exc.args[0] if exc.args else None
                if self.vendor != "mysql" or code not in _MYSQL_RETRYABLE or attempt == 4:
                    raise
                time.sleep(0.005 * 2**attempt)
        raise AssertionError("unreachable")

    # -- submitting -----------------------------------------------------------------------
    def enqueue(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        if transaction.get_connection(self.alias).in_atomic_block:
            # A deadlock aborts the caller's whole transaction: only the caller can retry it.
            return self._enqueue(tasks)
        # Racing submitters of overlapping ids can deadlock on MySQL: run the batch again.
        return self._retrying(lambda: self._enqueue(tasks))

    def _enqueue(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        if len(tasks) == 1:
            return [self._enqueue_one(tasks[0])]
        unique: dict[str, NewTask] = {}
        for task in tasks:
            unique.setdefault(task.task_id, task)
        ids = list(unique)
        existing: dict[str, TaskInfo] = {}
        for id_chunk in _chunks(ids):
            if self.vendor == "postgresql":
                # One array parameter: psycopg re-parses long placeholder lists on every call.
                with connections[self.alias].cursor() as cursor:
                    cursor.execute(
                        f"SELECT task_id FROM {self._table} WHERE task_id = ANY(%s)",
                        [list(id_chunk)],
                    )
                    id_chunk = [row[0] for row in cursor.fetchall()]  # usually none
                if not id_chunk:
                    continue
            found = self._tasks().filter(pk__in=id_chunk)
            existing.update((row.pk, _to_info(row)) for row in found)
        # Inserted in id order: concurrent batches with overlapping ids then wait for each
        # other instead of deadlocking (each would hold a row the other one needs).
        fresh = sorted(
            (task for task_id, task in unique.items() if task_id not in existing),
            key=lambda task: task.task_id,
        )
        created: dict[str, TaskInfo] = {}
        try:
            with transaction.atomic(using=self.alias):
                for chunk in _chunks(fresh):
                    self._insert(chunk)
            created = {t.task_id: self._new_info(t) for t in fresh}
        except IntegrityError:
            # Another submitter inserted some of the same ids meanwhile: go one by one.
            for task in fresh:
                info, was_created = self._enqueue_one(task)
                (created if was_created else existing)[task.task_id] = info
        results: list[tuple[TaskInfo, bool]] = []
        announced: set[str] = set()
        for task in tasks:
            if task.task_id in created and task.task_id not in announced:
                announced.add(task.task_id)
                results.append((created[task.task_id], True))
            else:
                results.append((existing.get(task.task_id) or created[task.task_id], False))
        return results

    def _insert(self, tasks: Sequence[NewTask]) -> None:
        """One multi-row INSERT. Hand-written: preparing 24 model fields per row through
        bulk_create cost several times the database's own work."""
        connection = connections[self.alias]
        adapted: dict[dt.datetime, Any] = {}  # a batch shares created_at, and mostly run_at

        def when(value: dt.datetime | None) -> Any:
            if value is None:
                return None
            if value not in adapted:
                adapted[value] = self._dt(value)
            return adapted[value]

        rows = [
            (
                task.task_id,
                task.task_name,
                task.queue,
                task.priority,
                task.parameter,
                task.retry_limit,
                task.retry_interval,
                task.retry_backoff,
                task.max_duration_millis,
                when(task.created_at),
                when(task.run_at),
                when(task.deadline_at),
            )
            for task in tasks
        ]
        insert = (
            f"INSERT INTO {self._table} (task_id, task_name, status, queue, priority, "
            "parameter, attempts, budget_attempts, retry_limit, retry_interval, retry_backoff, "
            "max_duration_millis, created_at, run_at, deadline_at, cancel_requested, available, "
            "lease_token) "
        )
        if self.vendor == "postgresql" and len(rows) > 1:
            # One array per column keeps the statement short: psycopg parses a statement with
            # thousands of placeholders again on every call, which cost more than the INSERT.
            columns = [list(column) for column in zip(*rows, strict=True)]
            columns[4] = [None if v is None else dumps(v) for v in columns[4]]
            self._execute(
                insert + "SELECT t.id, t.name, 'CREATED', t.queue, t.priority, t.parameter, "
                "0, 0, t.retry_limit, t.retry_interval, t.backoff, t.max_duration, t.created, "
                "t.run_at, t.deadline, FALSE, TRUE, 0 FROM unnest(%s::varchar[], "
                "%s::varchar[], %s::varchar[], %s::int[], %s::jsonb[], %s::int[], %s::bigint[], "
                "%s::varchar[], %s::bigint[], %s::timestamptz[], %s::timestamptz[], "
                "%s::timestamptz[]) AS t(id, name, queue, priority, parameter, retry_limit, "
                "retry_interval, backoff, max_duration, created, run_at, deadline)",
                columns,
            )
            return
        parameter_field = ReliableTask._meta.get_field("parameter")
        params: list[Any] = []
        for row in rows:
            prepared = list(row)
            prepared[4] = parameter_field.get_db_prep_save(row[4], connection)
            params += prepared
        values = "(%s, %s, 'CREATED', %s, %s, %s, 0, 0, %s, %s, %s, %s, %s, %s, %s, FALSE, TRUE, 0)"
        self._execute(insert + f"VALUES {', '.join([values] * len(rows))}", params)

    def _enqueue_one(self, task: NewTask) -> tuple[TaskInfo, bool]:
        try:
            if transaction.get_connection(self.alias).in_atomic_block:
                # A savepoint, so a duplicate id does not abort the caller's transaction.
                with transaction.atomic(using=self.alias):
                    self._insert([task])
            else:
                self._insert([task])
            return self._new_info(task), True
        except IntegrityError:
            existing = self.get(task.task_id)
            if existing is None:
                raise
            return existing, False

    @staticmethod
    def _new_info(task: NewTask) -> TaskInfo:
        return TaskInfo(
            task_id=task.task_id,
            task_name=task.task_name,
            status=TaskStatus.CREATED,
            queue=task.queue,
            priority=task.priority,
            parameter=task.parameter,
            attempts=0,
            retry_limit=task.retry_limit,
            retry_interval=task.retry_interval,
            retry_backoff=task.retry_backoff,
            max_duration_millis=task.max_duration_millis,
            created_at=task.created_at,
            run_at=task.run_at,
            started_at=None,
            finished_at=None,
            last_error=None,
            result=None,
            worker_id=None,
            cancel_requested=False,
        )

    # -- the worker's path ----------------------------------------------------------------
    def claim(
        self, worker_id: str, queues: Sequence[str], limit: int, lease_seconds: float
    ) -> list[Claim]:
        if limit <= 0 or not queues:
            return []
        now = self.clock.now()
        lease_until = now + dt.timedelta(seconds=lease_seconds)
        if self.vendor in ("sqlite", "postgresql"):
            claims = self._claim_returning(worker_id, list(queues), limit, now, lease_until)
        else:
            claims = self._retrying(
                lambda: self._claim_skip_locked(worker_id, list(queues), limit, now, lease_until)
            )
        claims.sort(key=lambda c: (-c.task.priority, c.task.run_at))
        return claims

    def _pick_sql(self, queues: list[str], limit: int, now: dt.datetime) -> tuple[str, list[Any]]:
        """The due, unclaimed rows of these queues in pickup order (served by the claim index)."""
        marks = ", ".join(["%s"] * len(queues))
        sql = (
            f"FROM {self._table} WHERE available = %s AND queue IN ({marks}) AND run_at <= %s "
            "ORDER BY priority DESC, run_at ASC LIMIT %s"
        )
        return sql, [True, *queues, self._dt(now), limit]

    def _claim_returning(
        self,
        worker_id: str,
        queues: list[str],
        limit: int,
        now: dt.datetime,
        lease_until: dt.datetime,
    ) -> list[Claim]:
        """One statement: safe on SQLite (writers serialise) and PostgreSQL (SKIP LOCKED)."""
        skip_locked = " FOR UPDATE SKIP LOCKED" if self.vendor == "postgresql" else ""
        pick, pick_params = self._pick_sql(queues, limit, now)
        sql = (
            f"UPDATE {self._table} SET available = %s, worker_id = %s, "
            "lease_token = lease_token + 1, lease_expires_at = %s "
            # available is re-checked outside too: a row may change between pick and lock.
            f"WHERE available = %s AND task_id IN (SELECT task_id {pick}{skip_locked}) "
            f"RETURNING {_CLAIM_COLUMNS_SQL}"
        )
        params = [False, worker_id, self._dt(lease_until), True, *pick_params]
        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql, params)
            return [self._claim_from_row(row) for row in cursor.fetchall()]

    def _claim_skip_locked(
        self,
        worker_id: str,
        queues: list[str],
        limit: int,
        now: dt.datetime,
        lease_until: dt.datetime,
    ) -> list[Claim]:
        """MariaDB/MySQL have no UPDATE ... RETURNING: lock a batch (reading it whole), then
        mark it by primary key, in one short transaction."""
        pick, pick_params = self._pick_sql(queues, limit, now)
        with transaction.atomic(using=self.alias):
            with connections[self.alias].cursor() as cursor:
                cursor.execute(
                    f"SELECT {_CLAIM_COLUMNS_SQL} {pick} FOR UPDATE SKIP LOCKED", pick_params
                )
                rows = cursor.fetchall()
            if not rows:
                return []
            ids = [row[0] for row in rows]
            self._tasks().filter(pk__in=ids).update(
                available=False,
                worker_id=worker_id,
                lease_token=F("lease_token") + 1,
                lease_expires_at=lease_until,
            )
        claims = [self._claim_from_row(row) for row in rows]
        # The rows were read before the UPDATE: give them the values it wrote.
        return [
            dataclasses.replace(
                claim,
                token=claim.token + 1,
                task=dataclasses.replace(claim.task, worker_id=worker_id),
            )
            for claim in claims
        ]

    def _claim_from_row(self, row: Sequence[Any]) -> Claim:
        """A claim from raw column values, converted the way each driver needs."""
        values = dict(zip(_CLAIM_FIELDS, row, strict=True))
        for key in ("parameter", "result"):
            # Every driver hands JSON back as text here (Django sets psycopg up that way too).
            if isinstance(values[key], str):
                values[key] = json.loads(values[key])
        values["cancel_requested"] = bool(values["cancel_requested"])  # 0/1 on MySQL, SQLite
        for key in _DATETIME_FIELDS:
            value = values[key]
            if isinstance(value, str):
                value = parse_datetime(value)
            if value is not None and value.tzinfo is None:
                value = value.replace(tzinfo=dt.timezone.utc)  # stored as naive UTC
            values[key] = value
        token = values.pop("lease_token")
        budget_attempts = values.pop("budget_attempts")
        deadline_at = values.pop("deadline_at")
        values["status"] = TaskStatus(values["status"])
        return Claim(
            task=TaskInfo(**values),
            token=token,
            budget_attempts=budget_attempts,
            deadline_at=deadline_at,
        )

    def start(self, claim: Claim, lease_seconds: float) -> Claim | None:
        return self.start_many([claim], lease_seconds)[0]

    def start_many(self, claims: Sequence[Claim], lease_seconds: float) -> list[Claim | None]:
        """One UPDATE for the batch; which rows it changed is read back only on a partial hit.

        Hand-written SQL: this runs once per task, and building the same statement through the
        ORM cost more CPU than the round trip itself.
        """
        if not claims:
            return []
        now = self.clock.now()
        held_sql, held_params = _held(claims)
        changed = self._execute(
            f"UPDATE {self._table} SET status = %s, attempts = attempts + 1, "
            "budget_attempts = budget_attempts + 1, started_at = %s, lease_expires_at = %s "
            # The token alone proves the claim is still held (releasing and recovering bump it);
            # "not yet started" is written as NOT IN so that no planner is tempted by the
            # status index on stale statistics: the primary key must drive this.
            f"WHERE status NOT IN ({', '.join(['%s'] * len(_NOT_WAITING))}) AND ({held_sql})",
            [
                TaskStatus.RUNNING.value,
                self._dt(now),
                self._dt(now + dt.timedelta(seconds=lease_seconds)),
                *_NOT_WAITING,
                *held_params,
            ],
        )
        started = self._hits(
            claims, changed, TaskStatus.RUNNING, "started_at", now, held_sql, held_params
        )
        return [
            dataclasses.replace(
                claim,
                task=dataclasses.replace(
                    claim.task,
                    status=TaskStatus.RUNNING,
                    attempts=claim.task.attempts + 1,
                    started_at=now,
                ),
                budget_attempts=claim.budget_attempts + 1,
            )
            if claim.task_id in started
            else None
            for claim in claims
        ]

    def heartbeat(
        self, worker_id: str, task_ids: Sequence[str], lease_seconds: float
    ) -> dict[str, tuple[int, bool]]:
        held: dict[str, tuple[int, bool]] = {}
        lease_until = self.clock.now() + dt.timedelta(seconds=lease_seconds)
        for chunk in _chunks(list(task_ids)):
            mine = self._tasks().filter(
                pk__in=chunk, worker_id=worker_id, available=False, status__in=LIVE
            )
            mine.update(lease_expires_at=lease_until)
            for pk, token, cancel in mine.values_list("pk", "lease_token", "cancel_requested"):
                held[pk] = (token, cancel)
        return held

    def complete(self, claim: Claim, result: object) -> Transition | None:
        return self.complete_many([(claim, result)])[0]

    def complete_many(self, outcomes: Sequence[tuple[Claim, object]]) -> list[Transition | None]:
        """One UPDATE for the batch (results picked per row with CASE when they differ)."""
        if not outcomes:
            return []
        now = self.clock.now()
        claims = [claim for claim, _ in outcomes]
        results = [result for _, result in outcomes]
        connection = connections[self.alias]
        result_field = ReliableTask._meta.get_field("result")
        texts = [dumps(result) for result in results]  # JSON equality: 1 and True differ
        if all(text == texts[0] for text in texts):
            result_sql = "%s"
            result_params = [result_field.get_db_prep_save(results[0], connection)]
        else:
            result_sql = "CASE task_id " + "WHEN %s THEN %s " * len(outcomes) + "END"
            result_params = []
            for claim, result in outcomes:
                result_params += [claim.task_id, result_field.get_db_prep_save(result, connection)]
        held_sql, held_params = _held(claims)
        changed = self._execute(
            f"UPDATE {self._table} SET status = %s, result = {result_sql}, finished_at = %s, "
            f"lease_expires_at = NULL, deadline_at = NULL WHERE status = %s AND ({held_sql})",
            [
                TaskStatus.COMPLETED.value,
                *result_params,
                self._dt(now),
                TaskStatus.RUNNING.value,
                *held_params,
            ],
        )
        done = self._hits(
            claims, changed, TaskStatus.COMPLETED, "finished_at", now, held_sql, held_params
        )
        return [
            Transition(
                task=dataclasses.replace(
                    claim.task, status=TaskStatus.COMPLETED, result=result, finished_at=now
                ),
                previous=TaskStatus.RUNNING,
            )
            if claim.task_id in done
            else None
            for claim, result in outcomes
        ]

    def fail(
        self, claim: Claim, error: str, *, retryable: bool, is_error: bool = False
    ) -> Transition | None:
        now = self.clock.now()
        if is_error:
            # ERROR does not depend on the cancel flag: one CAS on state and token.
            return self._record_failure(claim, TaskStatus.ERROR, None, error, now, None)
        # Optimistic: assume no cancel was requested; if the CAS misses, decide again with it.
        for cancel_requested in (False, True):
            status, run_at = after_failure(
                budget_attempts=claim.budget_attempts,
                retry_limit=claim.task.retry_limit,
                retryable=retryable,
                cancel_requested=cancel_requested,
                deadline_at=claim.deadline_at,
                now=now,
                retry_interval=claim.task.retry_interval,
                retry_backoff=claim.task.retry_backoff,
                backoff_cap_millis=self.backoff_cap_millis,
            )
            transition = self._record_failure(claim, status, run_at, error, now, cancel_requested)
            if transition is not None:
                return transition
        return None

    def _record_failure(
        self,
        claim: Claim,
        status: TaskStatus,
        run_at: dt.datetime | None,
        error: str,
        now: dt.datetime,
        cancel_requested: bool | None,
    ) -> Transition | None:
        """CAS RUNNING (with this token, and this cancel flag unless None) -> ``status``."""
        changes = self._failure_changes(status, run_at, error, now)
        match = Q(pk=claim.task_id, lease_token=claim.token, status=TaskStatus.RUNNING.value)
        if cancel_requested is not None:
            match &= Q(cancel_requested=cancel_requested)
        if not self._tasks().filter(match).update(**changes):
            return None
        task = dataclasses.replace(
            claim.task,
            status=status,
            last_error=error,
            run_at=run_at or claim.task.run_at,
            finished_at=changes.get("finished_at"),
            cancel_requested=bool(cancel_requested),
        )
        return Transition(task=task, previous=TaskStatus.RUNNING)

    @staticmethod
    def _failure_changes(
        status: TaskStatus, run_at: dt.datetime | None, error: str, now: dt.datetime
    ) -> dict[str, Any]:
        if status is TaskStatus.PENDING:
            assert run_at is not None
            return {
                "status": status.value,
                "available": True,
                "run_at": run_at,
                "last_error": error,
                "lease_expires_at": None,
            }
        return {
            "status": status.value,
            "available": False,
            "last_error": error,
            "finished_at": now,
            "lease_expires_at": None,
            "deadline_at": None,
        }

    def expire_claim(self, claim: Claim) -> Transition | None:
        now = self.clock.now()
        error = _timeout_message(claim.task.max_duration_millis, claim.task.last_error)
        changed = (
            self._tasks()
            .filter(pk=claim.task_id, lease_token=claim.token, available=False, status__in=WAITING)
            .update(**self._failure_changes(TaskStatus.TIMEOUT, None, error, now))
        )
        if not changed:
            return None
        task = dataclasses.replace(
            claim.task, status=TaskStatus.TIMEOUT, last_error=error, finished_at=now
        )
        return Transition(task=task, previous=claim.task.status)

    def release(self, claims: Sequence[Claim]) -> int:
        released = 0
        for chunk in _chunks(list(claims), 100):
            released += (
                self._tasks()
                .filter(_claims_match(chunk), available=False, status__in=WAITING)
                .update(
                    available=True,
                    worker_id=None,
                    lease_expires_at=None,
                    lease_token=F("lease_token") + 1,  # the old holder can no longer start it
                )
            )
        return released

    # -- operating ------------------------------------------------------------------------
    def cancel(self, task_id: str) -> CancelResult:
        now = self.clock.now()
        changed = (
            self._tasks()
            .filter(pk=task_id, status__in=WAITING)
            .update(
                status=TaskStatus.CANCELLED.value,
                available=False,
                finished_at=now,
                lease_expires_at=None,
                deadline_at=None,
            )
        )
        if changed:
            return CancelResult(changed=True, task=self.get(task_id))
        requested = (
            self._tasks()
            .filter(pk=task_id, status=TaskStatus.RUNNING.value)
            .update(cancel_requested=True)
        )
        if requested:
            return CancelResult(changed=True, task=self.get(task_id), requested_only=True)
        return CancelResult(changed=False, task=self.get(task_id))

    def retry(self, task_id: str) -> Transition | None:
        row = self._tasks().filter(pk=task_id).first()
        if row is None or TaskStatus(row.status) not in {
            TaskStatus.FAILED,
            TaskStatus.TIMEOUT,
            TaskStatus.ERROR,
            TaskStatus.CANCELLED,
        }:
            return None
        now = self.clock.now()
        deadline = (
            now + dt.timedelta(milliseconds=row.max_duration_millis)
            if row.max_duration_millis
            else None
        )
        changed = (
            self._tasks()
            .filter(pk=task_id, status=row.status)
            .update(
                status=TaskStatus.PENDING.value,
                available=True,
                run_at=now,
                deadline_at=deadline,
                budget_attempts=0,
                cancel_requested=False,
                finished_at=None,
                result=None,
                lease_expires_at=None,
            )
        )
        if not changed:
            return None
        previous = TaskStatus(row.status)
        row.status, row.run_at, row.finished_at = TaskStatus.PENDING.value, now, None
        row.cancel_requested, row.result = False, None
        return Transition(task=_to_info(row), previous=previous)

    # -- leader-only chores ---------------------------------------------------------------
    def recover_expired(self, limit: int) -> list[Transition]:
        now = self.clock.now()
        rows = list(
            self._tasks()
            .filter(available=False, lease_expires_at__lt=now, status__in=LIVE)
            .order_by("lease_expires_at")[:limit]
        )
        transitions = []
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
                held.update(
                    available=True,
                    worker_id=None,
                    lease_expires_at=None,
                    lease_token=F("lease_token") + 1,  # the old holder can no longer start it
                )
                continue
            error = f"worker lost: {row.worker_id} stopped renewing its lease"
            status, run_at = after_failure(
                budget_attempts=row.budget_attempts,
                retry_limit=row.retry_limit,
                retryable=True,
                cancel_requested=row.cancel_requested,
                deadline_at=row.deadline_at,
                now=now,
                retry_interval=row.retry_interval,
                retry_backoff=row.retry_backoff,
                backoff_cap_millis=self.backoff_cap_millis,
            )
            changes = self._failure_changes(status, run_at, error, now)
            if held.update(**changes):
                for key, value in changes.items():
                    setattr(row, key, value)
                transitions.append(Transition(task=_to_info(row), previous=TaskStatus.RUNNING))
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
            error = _timeout_message(row.max_duration_millis, row.last_error)
            changes = self._failure_changes(TaskStatus.TIMEOUT, None, error, now)
            changed = (
                self._tasks()
                .filter(
                    pk=row.pk, status=row.status, lease_token=row.lease_token, deadline_at__lte=now
                )
                .update(**changes)
            )
            if changed:
                previous = TaskStatus(row.status)
                for key, value in changes.items():
                    setattr(row, key, value)
                transitions.append(Transition(task=_to_info(row), previous=previous))
        return transitions

    def purge_finished(self, finished_before: dt.datetime, limit: int) -> int:
        ids = list(
            self._tasks()
            .filter(finished_at__lt=finished_before, status__in=TERMINAL)
            .values_list("pk", flat=True)[:limit]
        )
        deleted = 0
        for chunk in _chunks(ids):
            deleted += self._tasks().filter(pk__in=chunk, status__in=TERMINAL).delete()[0]
        return deleted

    # -- reading --------------------------------------------------------------------------
    def get(self, task_id: str) -> TaskInfo | None:
        row = self._tasks().filter(pk=task_id).first()
        return _to_info(row) if row is not None else None

    def list(
        self,
        *,
        status: TaskStatus | None = None,
        task_name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[TaskInfo]:
        qs = self._tasks()
        if status is not None:
            qs = qs.filter(status=TaskStatus(status).value)
        if task_name is not None:
            qs = qs.filter(task_name=task_name)
        if queue is not None:
            qs = qs.filter(queue=queue)
        qs = qs.order_by("-created_at", "-task_id")[offset : offset + limit]
        return [_to_info(row) for row in qs]

    def count(self, queue: str | None = None) -> dict[TaskStatus, int]:
        qs = self._tasks()
        if queue is not None:
            qs = qs.filter(queue=queue)
        counts = {status: 0 for status in TaskStatus}
        for row in qs.order_by().values("status").annotate(n=Count("pk")):
            counts[TaskStatus(row["status"])] = row["n"]
        return counts

    def has_work(self, queues: Sequence[str], horizon_seconds: float) -> bool:
        horizon = self.clock.now() + dt.timedelta(seconds=horizon_seconds)
        qs = self._tasks().filter(queue__in=list(queues))
        return (
            qs.filter(status=TaskStatus.RUNNING.value).exists()
            or qs.filter(status__in=WAITING, run_at__lte=horizon).exists()
        )

    # -- leadership and workers -----------------------------------------------------------
    def acquire_lock(self, name: str, owner: str, ttl_seconds: float) -> bool:
        now = self.clock.now()
        expires = now + dt.timedelta(seconds=ttl_seconds)
        locks = ReliableLock.objects.using(self.alias)
        if locks.filter(Q(owner=owner) | Q(expires_at__lt=now), name=name).update(
            owner=owner, expires_at=expires
        ):
            return True
        try:
            with transaction.atomic(using=self.alias):
                locks.create(name=name, owner=owner, expires_at=expires)
            return True
        except IntegrityError:
            return False

    def release_lock(self, name: str, owner: str) -> None:
        ReliableLock.objects.using(self.alias).filter(name=name, owner=owner).update(
            owner="", expires_at=self.clock.now() - dt.timedelta(seconds=1)
        )

    def lock_owner(self, name: str) -> str | None:
        row = ReliableLock.objects.using(self.alias).filter(name=name).first()
        if row is None or not row.owner or row.expires_at < self.clock.now():
            return None
        return row.owner

    def worker_seen(self, worker_id: str, info: dict[str, object]) -> None:
        now = self.clock.now()
        workers = ReliableWorker.objects.using(self.alias)
        if workers.filter(pk=worker_id).update(last_seen_at=now):
            return
        try:
            with transaction.atomic(using=self.alias):
                workers.create(
                    worker_id=worker_id,
                    hostname=str(info.get("hostname", "")),
                    pid=int(info.get("pid", 0)),  # type: ignore[call-overload]
                    queues=",".join(info.get("queues", [])),  # type: ignore[arg-type]
                    started_at=now,
                    last_seen_at=now,
                )
        except IntegrityError:
            workers.filter(pk=worker_id).update(last_seen_at=now)

    def worker_gone(self, worker_id: str) -> None:
        ReliableWorker.objects.using(self.alias).filter(pk=worker_id).delete()

    def forget_workers(self, seen_before: dt.datetime) -> int:
        workers = ReliableWorker.objects.using(self.alias)
        return workers.filter(last_seen_at__lt=seen_before).delete()[0]

    def close(self) -> None:
        connections[self.alias].close()


def _timeout_message(max_duration_millis: int | None, previous_error: str | None) -> str:
    message = f"max duration of {max_duration_millis} ms since creation exceeded"
    if previous_error:
        message += f"\nLast failure before the deadline:\n{previous_error}"
    return message
