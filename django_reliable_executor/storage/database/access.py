"""DatabaseAccess: the connection, table and SQL helpers every part of the database storage uses."""

from __future__ import annotations

import abc
import contextlib
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from django.db import DatabaseError, OperationalError, connections, transaction
from django.db.models import Q, QuerySet

from ...core.clock import Clock
from ...core.flow_limits import NO_FLOW_LIMITS, FlowLimits
from ...core.records import Claim, NewTask, TaskInfo, copy_with
from ...core.states import TaskStatus
from ...models import ReliableNameLock, ReliableSchedule, ReliableTask
from ..base import TaskStorage
from .rows import TERMINAL, lock_conflict, spans, to_info
from .step_rows import steps_of
from .waiting import Wakeups

logger = logging.getLogger("django_reliable_executor")
T = TypeVar("T")
# Bytes of values one batch statement carries at most: well under MariaDB's default
# max_allowed_packet (16 MiB since 10.2; MySQL 8: 64 MiB), which a larger statement overflows.
STATEMENT_BYTES = 4 * 1024 * 1024
PACKET_MARGIN = 64 * 1024  # room in a packet for the statement around one large value
# Runs of a transaction the database chose as a deadlock victim (about 0.6 s of waits in all).
RETRIES = 8


class DatabaseAccess(TaskStorage):
    """Tasks in the ``reliable_executor_task`` table of one Django database connection."""

    def __init__(
        self,
        alias: str = "default",
        clock: Clock | None = None,
        backoff_cap_millis: int | None = None,
        flow_limits: FlowLimits = NO_FLOW_LIMITS,
    ) -> None:
        super().__init__(clock, flow_limits)
        self.alias = alias
        self._backoff_cap_millis = backoff_cap_millis
        self._max_packet: int | None = None

    @property
    def transaction_alias(self) -> str | None:
        return self.alias

    @property
    def backoff_cap_millis(self) -> int:
        if self._backoff_cap_millis is None:
            from ...conf import get_settings

            return get_settings().DEFAULT_RETRY_BACKOFF_MAX
        return self._backoff_cap_millis

    @functools.cached_property
    def vendor(self) -> str:
        # Read once: an alias keeps its engine, and each look-up of the connection goes
        # through the handler's thread-local storage (a submit asked several times).
        return connections[self.alias].vendor

    def _tasks(self) -> QuerySet[ReliableTask]:
        return ReliableTask.objects.using(self.alias)

    def get(self, task_id: str) -> TaskInfo | None:
        # Here rather than in Reading: submitting and the transitions read a task back too.
        row = self._tasks().filter(pk=task_id).first()
        if row is None:
            return None
        info = to_info(row)
        steps = steps_of(self.alias, [task_id]).get(task_id)  # durable steps: one more query
        return copy_with(info, steps=steps) if steps else info

    @property
    def _table(self) -> str:
        return connections[self.alias].ops.quote_name(ReliableTask._meta.db_table)

    def _dt(self, value: dt.datetime) -> Any:
        """A datetime as this backend's driver wants it in hand-written SQL."""
        return connections[self.alias].ops.adapt_datetimefield_value(value)

    def _max_packet_bytes(self) -> int | None:
        """MySQL/MariaDB's max_allowed_packet, read once (None on other backends, which bind
        values apart from the statement text)."""
        if self.vendor != "mysql":
            return None
        if self._max_packet is None:
            with connections[self.alias].cursor() as cursor:
                cursor.execute("SELECT @@max_allowed_packet")
                self._max_packet = int(cursor.fetchone()[0])
        return self._max_packet

    def _spans(
        self, texts: Sequence[str | None], refuse: Callable[[int, str], Exception]
    ) -> Iterator[slice]:
        """Split values (JSON texts, None for SQL NULL) into runs one batch statement each can
        carry: a few MiB of values at most (one statement over MariaDB's max_allowed_packet
        fails whole). Raises ``refuse(index, why)`` for the first value larger than the server
        takes in any statement, before any run is handed out."""
        mysql = self.vendor == "mysql"  # read once: each read looks the connection up
        packet = self._max_packet_bytes()
        sizes = [4 if text is None else len(text) for text in texts]  # the common case: ASCII
        if mysql or not all(map(str.isascii, filter(None, texts))):
            sizes = [value_bytes(text, mysql) for text in texts]
        if packet is not None:
            for index, size in enumerate(sizes):
                if size > packet - PACKET_MARGIN:
                    raise refuse(
                        index,
                        f"{size} bytes as JSON in the statement, more than the database server "
                        f"takes in one (max_allowed_packet = {packet} bytes)",
                    )
        limit = STATEMENT_BYTES if packet is None else min(STATEMENT_BYTES, packet // 4)
        return spans(sizes, limit)

    def _in(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``column`` IN ``values`` as hand-written SQL and its parameters: one array parameter
        on PostgreSQL, a placeholder each elsewhere. Cheaper than a queryset's ``__in`` for
        long lists: no expression tree to compile, no placeholder per value to convert on
        PostgreSQL."""
        if self.vendor == "postgresql":
            return f"{column} = ANY(%s)", [list(values)]
        return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)

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

    # -- waking idle workers (waiting.py) -----------------------------------------------------
    #: time.time() at which the earliest window that held back a due task frees (set by each
    #: claim, rate_log.py; ``wait_for_work`` ends then at the latest).
    rate_free_at: float | None = None

    @functools.cached_property
    def _wakeups(self) -> Wakeups:
        return Wakeups(self.alias, self.vendor, ReliableTask._meta.db_table)

    def _work_committed(self, queues: Sequence[str]) -> None:
        """Work due now in ``queues`` was just written (a retry, a hand-back): wake idle
        workers once it is committed. PostgreSQL: a NOTIFY per queue in the open transaction
        (sent on its commit); elsewhere on_commit touches the marker file (SQLite) and wakes
        this process's waiters. Submits wake from their INSERT (Submitting)."""
        if not queues:
            return
        if self.vendor == "postgresql":
            sql = f"SELECT pg_notify({self._wakeups.channel}, q) FROM unnest(%s::text[]) AS q"
            params = [list(dict.fromkeys(queues))]
            if transaction.get_connection(self.alias).in_atomic_block:
                self._execute(sql, params)
                return
            try:
                self._execute(sql, params)
            except DatabaseError:
                # The change itself is committed: an idle worker still sees it at its next poll.
                logger.warning("could not notify idle workers; they poll within POLL_INTERVAL")
        else:
            transaction.on_commit(self._wakeups.committed, using=self.alias)

    @abc.abstractmethod
    def _enqueue(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        """Store new tasks in the open transaction (Submitting); schedule fires use it too."""

    @abc.abstractmethod
    def _take_unique_key(self, task: NewTask) -> TaskInfo | None:
        """Take a unique task's key in the open transaction, or return the live task holding
        it (UniqueKeys)."""

    @abc.abstractmethod
    def _enqueue_one(self, task: NewTask) -> tuple[TaskInfo, bool]:
        """Store one task in the open transaction, or return the stored one (Submitting)."""

    @abc.abstractmethod
    def _enqueue_unique(
        self, task: NewTask, store: Callable[[], tuple[TaskInfo, bool]]
    ) -> tuple[TaskInfo, bool]:
        """A unique task: the stored task of its id, or the key's live holder, or ``store()``
        with the key taken (Submitting)."""

    @abc.abstractmethod
    def _start_at(
        self, claims: Sequence[Claim], lease_seconds: float, now: dt.datetime
    ) -> list[Claim | None]:
        """Start the claims with ``now`` as their start time (Transitions)."""

    @abc.abstractmethod
    def _enqueue_waiting(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        """Store a batch holding dependents, in order, all or nothing (Dependencies)."""

    @abc.abstractmethod
    def _settle_dependents(self, ended: Mapping[str, str]) -> list[tuple[str | None, str, str]]:
        """Release or cancel the dependents of tasks the open transaction just ended (id ->
        terminal status), in that transaction (Dependencies). Returns the dependents it
        cancelled, ``(batch_id, task_id, "CANCELLED")`` each: endings too."""

    def _settle_endings(self, ended: Sequence[tuple[str | None, str, str]]) -> None:
        """What every ending write does in its transaction after it ended tasks,
        ``(batch_id, task_id, terminal status)`` each: settle their dependents, then count
        them and the dependents this cancelled in their batches (one locking pass, batches
        in id order)."""
        cascaded = self._settle_dependents({task_id: status for _, task_id, status in ended})
        self._settle_batches([*ended, *cascaded])

    def _handler_ended(self, match: Q) -> bool:
        """The task ``match`` finds ended while its handler ran (terminal, its holder kept the
        lease: see Chores.expire_overdue) and that handler has now returned, or its lease
        lapsed: let the lease go and settle what its ending left for this moment (its
        dependents, its batch), in one transaction. Until then the task has not *ended*
        (docs/guarantees.md). False when there was nothing to let go (a second report)."""
        held = Q(status__in=TERMINAL, lease_expires_at__isnull=False)

        def end() -> bool:
            row = self._tasks().filter(match, held).values_list("pk", "status", "batch_id").first()
            if row is None:
                return False
            task_id, status, batch_id = row
            if (
                not self._tasks()
                .filter(match, held, pk=task_id, status=status)
                .update(lease_expires_at=None)
            ):
                return False
            self._settle_endings([(batch_id, task_id, status)])
            return True

        return self._ending(end)

    def _alone(self, write: Callable[[], T]) -> T:
        """Run a one-statement write in autocommit (or in the caller's transaction), again
        after a deadlock when it is not inside the caller's transaction."""
        if transaction.get_connection(self.alias).in_atomic_block:
            return write()
        return self._retrying(write)

    def _ending(self, write: Callable[[], T]) -> T:
        """Run a write that ends tasks (and settles their dependents and batches) as one
        transaction, again after a deadlock when it is not inside the caller's transaction."""

        def atomically() -> T:
            with transaction.atomic(using=self.alias):
                return write()

        if transaction.get_connection(self.alias).in_atomic_block:
            return atomically()
        return self._retrying(atomically)

    @abc.abstractmethod
    def _purge_dependencies(self, task_ids: Sequence[str]) -> None:
        """Delete the dependency edges of purged tasks (Dependencies)."""

    @abc.abstractmethod
    def _purge_unique_keys(self, now: dt.datetime) -> int:
        """Delete key rows whose window has passed, a batch at a time (UniqueKeys)."""

    def _counted(self, batch_ids: Iterable[str | None]) -> AbstractContextManager[Any]:
        """The transaction an ending write runs in: its own where it ends a batch member (the
        batch's counters change with it, see Batches), none for other tasks (the hot path)."""
        if any(batch_ids):
            return transaction.atomic(using=self.alias)
        return contextlib.nullcontext()

    @abc.abstractmethod
    def _settle_batches(self, ended: Sequence[tuple[str | None, str, str]]) -> None:
        """Count tasks that just ended, ``(batch_id, task_id, status)`` each (batch_id None:
        no batch), in their batches, in the open transaction; submit the callbacks of a batch
        that this finishes (Batches)."""

    @abc.abstractmethod
    def _reopen_batch_member(self, batch_id: str, task_id: str, status: str) -> None:
        """Take a member retried by hand out of its batch's ``status`` counter, in the open
        transaction (Batches)."""

    def close(self) -> None:
        self.stop_waiting()
        connections[self.alias].close()

    # -- serialising on a task name (max_concurrency, rate_limit) --------------------------
    def _lock_name(self, cursor: Any, table: str, name: str) -> None:
        """Hold the name's lock row until the transaction ends, creating it on first use. On
        SQLite with ``transaction_mode`` IMMEDIATE or EXCLUSIVE, nothing: the transaction's
        BEGIN took the database's write lock, which serialises more than the row would."""
        connection = connections[self.alias]
        if self.vendor == "sqlite" and self._begins_writing(connection):
            return
        column = connection.ops.quote_name("name")
        for _ in range(2):
            if self.vendor == "sqlite":
                # SQLite: the first write of the transaction takes the database's write lock,
                # so everything read after it is read alone.
                cursor.execute(
                    f"UPDATE {table} SET {column} = {column} WHERE {column} = %s", [name]
                )
                if cursor.rowcount:
                    return
            else:
                cursor.execute(
                    f"SELECT {column} FROM {table} WHERE {column} = %s FOR UPDATE", [name]
                )
                if cursor.fetchone() is not None:
                    return
            ReliableNameLock.objects.using(self.alias).bulk_create(
                [ReliableNameLock(name=name)], ignore_conflicts=True
            )
            if self.vendor == "sqlite":
                return  # the INSERT (or the conflict it ignored) took the write lock
        raise AssertionError(f"the lock row of task name {name!r} cannot be created")

    @staticmethod
    def _begins_writing(connection: Any) -> bool:
        """SQLite: the open transaction took the write lock at its BEGIN (Django 5.1's
        ``transaction_mode`` IMMEDIATE or EXCLUSIVE, which ``atomic`` begins with under
        autocommit), so everything it reads is read alone."""
        mode = getattr(connection, "transaction_mode", None)
        return (
            connection.in_atomic_block
            and mode in ("IMMEDIATE", "EXCLUSIVE")
            and connection.settings_dict.get("AUTOCOMMIT", True)
        )

    def _retrying(self, operation: Callable[[], T]) -> T:
        """Run a short transaction again when the database rolled it back as a deadlock
        victim or after a lock wait timeout (MySQL/MariaDB, PostgreSQL): nothing of it was
        kept, so running it again is safe."""
        for attempt in range(RETRIES):
            try:
                return operation()
            except OperationalError as exc:
                if attempt == RETRIES - 1 or not lock_conflict(exc, self.vendor):
                    raise
                time.sleep(0.005 * 2**attempt)
        raise AssertionError("unreachable")

    def _schedules(self) -> QuerySet[ReliableSchedule]:
        return ReliableSchedule.objects.using(self.alias)

    @property
    def _schedule_table(self) -> str:
        return connections[self.alias].ops.quote_name(ReliableSchedule._meta.db_table)


def value_bytes(text: str | None, mysql: bool) -> int:
    """Bytes a JSON text takes in a statement. MySQL's driver writes values into the
    statement with quotes and backslashes escaped, each one byte more."""
    if text is None:
        return 4
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if mysql:
        size += text.count('"') + text.count("\\") + text.count("'")
    return size
