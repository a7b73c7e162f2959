"""Submitting to the database storage: batched, idempotent, in the caller's transaction."""

from __future__ import annotations

import datetime as dt
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from django.db import IntegrityError, connections, transaction

from ...core.records import NewTask, TaskInfo, new_info
from ...core.serialization import dumps
from ...exceptions import ParameterTooLargeError, TaskSubmitConflictError
from ...models import ReliableTask, ReliableTaskTag
from .access import DatabaseAccess
from .fair_rounds import FairRounds
from .parameter_rows import insert_task_entries, keeps_rows
from .rows import (
    chunks,
    to_info,
)
from .waiting import due_queues


class Adapted(dict[dt.datetime | None, Any]):
    """Datetimes as the driver wants them, each adapted once (None stays None)."""

    def __init__(self, adapt: Callable[[dt.datetime], Any]) -> None:
        super().__init__()
        self.adapt = adapt

    def __missing__(self, value: dt.datetime | None) -> Any:
        self[value] = adapted = None if value is None else self.adapt(value)
        return adapted


class _StoredMeanwhile(Exception):
    """A unique submit's id was stored by another submitter while this one took the key."""

    def __init__(self, info: TaskInfo) -> None:
        super().__init__(info.task_id)
        self.info = info


class Submitting(DatabaseAccess):
    """enqueue: multi-row INSERTs, existing ids returned unchanged."""

    def enqueue(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        if transaction.get_connection(self.alias).in_atomic_block:
            # A deadlock aborts the caller's whole transaction: only the caller can retry it.
            return self._enqueue(tasks)
        # Racing submitters of overlapping ids can deadlock on MySQL: run the batch again.
        return self._retrying(lambda: self._enqueue(tasks))

    def _enqueue(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        if any(task.depends_on for task in tasks):
            return self._enqueue_waiting(tasks)
        if any(task.unique_key is not None for task in tasks):
            return self._enqueue_keyed(tasks)
        if len(tasks) == 1:
            return [self._enqueue_one(tasks[0])]
        unique: dict[str, NewTask] = {}
        for task in tasks:
            unique.setdefault(task.task_id, task)
        ids = list(unique)
        existing: dict[str, TaskInfo] = {}
        for id_chunk in chunks(ids):
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
            existing.update((row.pk, to_info(row)) for row in found)
        # Inserted in id order: concurrent batches with overlapping ids then wait for each
        # other instead of deadlocking (each would hold a row the other one needs).
        fresh = sorted(
            (task for task_id, task in unique.items() if task_id not in existing),
            key=lambda task: task.task_id,
        )
        created: dict[str, TaskInfo] = {}
        try:
            with transaction.atomic(using=self.alias):
                self._insert(fresh)
            created = {t.task_id: new_info(t) for t in fresh}
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

    def _enqueue_keyed(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        """A batch holding unique tasks: one at a time, each unique one in a transaction (a
        savepoint in the caller's) taking its key with the insert, so a later task of the
        batch meets the key an earlier one took, and a failed insert gives the key back."""
        results: list[tuple[TaskInfo, bool]] = []
        for task in tasks:
            if task.unique_key is None:
                results.append(self._enqueue_one(task))
                continue
            results.append(self._enqueue_unique(task, functools.partial(self._enqueue_one, task)))
        return results

    def _enqueue_unique(
        self, task: NewTask, store: Callable[[], tuple[TaskInfo, bool]]
    ) -> tuple[TaskInfo, bool]:
        """A unique task: the stored task of its id, unchanged (it never takes the key, nor
        answers with the key's holder: only a task stored as unique holds a key), else the
        key's live holder, else ``store()`` with the key taken in one savepoint."""
        stored = self.get(task.task_id)
        if stored is not None:
            return stored, False
        try:
            with transaction.atomic(using=self.alias):
                holder = self._take_unique_key(task)
                if holder is not None:
                    return holder, False
                info, created = store()
                if not created:
                    # Stored by another submitter since the read above: roll the key back.
                    raise _StoredMeanwhile(info)
                return info, True
        except _StoredMeanwhile as meanwhile:
            return meanwhile.info, False

    def _insert(self, tasks: Sequence[NewTask]) -> None:
        """Multi-row INSERTs, split by rows and by bytes (a few MiB of parameters each: one
        statement over MariaDB's max_allowed_packet fails whole). Raises ParameterTooLargeError,
        inserting nothing, when one parameter is larger than the database takes in a statement.
        """
        texts = [None if task.parameter is None else dumps(task.parameter) for task in tasks]

        def refuse(index: int, why: str) -> Exception:
            return ParameterTooLargeError(
                f"task_parameter of task {tasks[index].task_id!r} is {why}",
                field="task_parameter",
            )

        fair = self.flow_limits.fair()
        if fair and any(task.task_name in fair for task in tasks):
            # fairness="round_robin": the rounds numbered with the insert, all or nothing.
            with transaction.atomic(using=self.alias):
                rounds = self._fair_rounds.number(tasks)
                for span in self._spans(texts, refuse):
                    self._insert_rows(tasks[span], texts[span], rounds[span])
        elif any(task.tags or (task.indexed and keeps_rows(self.vendor)) for task in tasks):
            # The index rows of the tags and parameters with the tasks, all or nothing.
            with transaction.atomic(using=self.alias):
                for span in self._spans(texts, refuse):
                    self._insert_rows(tasks[span], texts[span])
        else:
            for span in self._spans(texts, refuse):
                self._insert_rows(tasks[span], texts[span])
        if self.vendor != "postgresql" and any(t.run_at <= t.created_at for t in tasks):
            # Idle workers learn of it once committed (on PostgreSQL the INSERT notifies).
            transaction.on_commit(self._wakeups.committed, using=self.alias)

    @functools.cached_property
    def _fair_rounds(self) -> FairRounds:
        return FairRounds(self)

    def _insert_rows(
        self,
        tasks: Sequence[NewTask],
        texts: Sequence[str | None],
        rounds: Sequence[int] | None = None,
    ) -> None:
        """One multi-row INSERT (``rounds``: each task's flow_round, else 0). Hand-written:
        preparing 24 model fields per row through bulk_create cost several times the
        database's own work."""
        if rounds is None:
            rounds = [0] * len(tasks)
        when = Adapted(self._dt)  # a batch shares created_at, and mostly run_at
        limited = self.flow_limits.names()
        rows = [
            (
                task.task_id,
                task.task_name,
                task.queue,
                task.priority,
                text,  # JSON text, serialised once
                task.retry_limit,
                task.retry_interval,
                task.retry_backoff,
                task.max_duration_millis,
                when[task.created_at],
                when[task.run_at],
                when[task.deadline_at],
                task.rate_key,
                None if task.trace_context is None else dumps(task.trace_context),
                task.batch_id,
                task.batch_generation,
                task.task_name if task.task_name in limited else "",
                task.attempt_timeout,
                task.concurrency_key,
                flow_round,
                dumps(list(task.tags)) if task.tags else None,
            )
            for task, text, flow_round in zip(tasks, texts, rounds, strict=True)
        ]
        postgresql = self.vendor == "postgresql"
        if postgresql and len(rows) > 1:
            due = due_queues((task.queue, task.run_at <= task.created_at) for task in tasks)
            self._insert_columns(rows, due)
            self._insert_tags(tasks)
            insert_task_entries(self.alias, tasks)
            return
        parameter_sql = "CAST(%s AS jsonb)" if postgresql else "%s"
        values = (
            f"(%s, %s, 'CREATED', %s, %s, {parameter_sql}, 0, 0, %s, %s, %s, %s, %s, %s, %s, "
            f"FALSE, TRUE, 0, %s, {parameter_sql}, %s, %s, %s, %s, %s, %s, {parameter_sql})"
        )
        params = list(itertools.chain.from_iterable(rows))
        sql = self._insert_sql() + f"VALUES {', '.join([values] * len(rows))}"
        if postgresql and tasks[0].run_at <= tasks[0].created_at:
            # Wake idle workers in the same statement: PostgreSQL sends it on commit only.
            sql = f"WITH inserted AS ({sql}) SELECT pg_notify({self._wakeups.channel}, %s)"
            params.append(tasks[0].queue)
        self._execute(sql, params)
        self._insert_tags(tasks)
        insert_task_entries(self.alias, tasks)

    def _insert_tags(self, tasks: Sequence[NewTask]) -> None:
        """The index rows of the tasks' tags (none: no statement), in the transaction that
        inserted the tasks (``_insert`` opens one when any task has tags)."""
        rows = [(tag, task.task_id) for task in tasks for tag in task.tags]
        if not rows:
            return
        table = connections[self.alias].ops.quote_name(ReliableTaskTag._meta.db_table)
        for chunk in chunks(rows, 500):
            values = ", ".join(["(%s, %s)"] * len(chunk))
            self._execute(
                f"INSERT INTO {table} (tag, task_id) VALUES {values}",
                list(itertools.chain.from_iterable(chunk)),
            )

    def _insert_columns(self, rows: Sequence[tuple[Any, ...]], due: list[str]) -> None:
        """PostgreSQL: the rows as one array per column, which keeps the statement short:
        psycopg parses a statement with thousands of placeholders again on every call, which
        cost more than the INSERT. The same statement notifies idle workers of the ``due``
        queues: one NOTIFY per queue, which PostgreSQL sends on commit, once per transaction
        however many statements repeat it."""
        columns: list[Any] = [list(column) for column in zip(*rows, strict=True)]
        notify = ""
        if due:
            notify = f"SELECT pg_notify({self._wakeups.channel}, q) FROM unnest(%s::text[]) AS q"
            columns.append(due)
        insert = (
            self._insert_sql() + "SELECT t.id, t.name, 'CREATED', t.queue, t.priority, "
            "t.parameter, 0, 0, t.retry_limit, t.retry_interval, t.backoff, t.max_duration, "
            "t.created, t.run_at, t.deadline, FALSE, TRUE, 0, t.rate_key, t.trace_context, "
            "t.batch_id, t.batch_generation, t.limited_name, t.attempt_timeout, t.ckey, "
            "t.flow_round, t.tags "
            "FROM unnest(%s::varchar[], %s::varchar[], %s::varchar[], %s::int[], %s::jsonb[], "
            "%s::int[], %s::bigint[], "
            "%s::varchar[], %s::bigint[], %s::timestamptz[], %s::timestamptz[], "
            "%s::timestamptz[], %s::varchar[], %s::jsonb[], %s::varchar[], %s::varchar[], "
            "%s::varchar[], %s::float8[], %s::varchar[], %s::bigint[], %s::jsonb[]) "
            "AS t(id, name, queue, priority, parameter, retry_limit, retry_interval, backoff, "
            "max_duration, created, run_at, deadline, rate_key, trace_context, batch_id, "
            "batch_generation, limited_name, attempt_timeout, ckey, flow_round, tags)"
        )
        self._execute(f"WITH inserted AS ({insert}) {notify}" if notify else insert, columns)

    def _insert_sql(self) -> str:
        return (
            f"INSERT INTO {self._table} (task_id, task_name, status, queue, priority, "
            "parameter, attempts, budget_attempts, retry_limit, retry_interval, retry_backoff, "
            "max_duration_millis, created_at, run_at, deadline_at, cancel_requested, available, "
            "lease_token, rate_key, trace_context, batch_id, batch_generation, limited_name, "
            "attempt_timeout, concurrency_key, flow_round, tags) "
        )

    def _enqueue_one(self, task: NewTask) -> tuple[TaskInfo, bool]:
        try:
            if transaction.get_connection(self.alias).in_atomic_block:
                # A savepoint, so a duplicate id does not abort the caller's transaction.
                with transaction.atomic(using=self.alias):
                    self._insert([task])
            else:
                self._insert([task])
            return new_info(task), True
        except IntegrityError as error:
            existing = self._stored(task.task_id)
            if existing is not None:
                return existing, False
            if not transaction.get_connection(self.alias).in_atomic_block:
                raise  # not a duplicate id, or the stored task was deleted meanwhile
            # PostgreSQL REPEATABLE READ/SERIALIZABLE: the duplicate was committed after the
            # caller's snapshot, so no statement of this transaction can ever read it.
            raise TaskSubmitConflictError(
                f"task_id {task.task_id!r} was stored by another transaction after this "
                "transaction's snapshot (REPEATABLE READ or SERIALIZABLE isolation), so the "
                "stored task cannot be read in it: roll back and retry the transaction",
                field="task_id",
            ) from error

    def _stored(self, task_id: str) -> TaskInfo | None:
        """The stored task after a duplicate-key error, as committed by the other submitter."""
        if self.vendor != "mysql":
            return self.get(task_id)
        # A plain read under REPEATABLE READ sees the transaction's snapshot, taken before the
        # duplicate was committed; a locking read sees the latest committed row. A shared lock
        # adds nothing: InnoDB already holds one on the duplicate key after the failed INSERT
        # (an exclusive one could deadlock two submitters that both hold it).
        rows = ReliableTask.objects.db_manager(self.alias).raw(
            f"SELECT * FROM {self._table} WHERE task_id = %s LOCK IN SHARE MODE", [task_id]
        )
        return next((to_info(row) for row in rows), None)
