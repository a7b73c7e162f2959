"""Unique tasks on the database storage: the key rows of reliable_executor_unique_key."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connections

from ...core.debouncing import KEY_HOLD, debounced_run_at
from ...core.records import NewTask, TaskInfo, copy_with
from ...core.states import LIVE_STATUSES, TaskStatus
from ...models import ReliableTask, ReliableUniqueKey
from .access import DatabaseAccess
from .parameter_rows import replace_entries
from .rows import to_info

PURGE_BATCH = 1000  # expired key rows deleted per statement
PURGE_BATCHES = 100  # statements per purge at most: 100,000 rows a minute (the purge's pace)


class UniqueKeys(DatabaseAccess):
    """_take_unique_key, unique_holder, _purge_unique_keys.

    A submit takes its key in the transaction that stores its task: first an INSERT that does
    nothing when the key exists (it waits for another open transaction inserting the same key,
    then sees its outcome), then a locking read of the row, so concurrent submits of one key
    run one after the other whatever their isolation level. A rolled-back transaction takes
    its key row with it."""

    @property
    def _keys_table(self) -> str:
        return connections[self.alias].ops.quote_name(ReliableUniqueKey._meta.db_table)

    def _take_unique_key(self, task: NewTask) -> TaskInfo | None:
        """Within the open transaction: the live task holding ``task``'s key within its
        window (then nothing is written), or None once ``task`` holds the key (its row
        inserted, or taken over from a finished or expired holder)."""
        assert task.unique_key is not None and task.unique_until is not None
        key, until = task.unique_key, self._dt(task.unique_until)
        with connections[self.alias].cursor() as cursor:
            cursor.execute(self._insert_key_sql(), [key, task.task_id, until])
            lock = "" if self.vendor == "sqlite" else " FOR UPDATE"
            cursor.execute(
                f"SELECT task_id, expires_at > %s FROM {self._keys_table} WHERE {self._key} = %s"
                + lock,
                [self._dt(task.created_at), key],
            )
            holder_id, in_window = cursor.fetchone()
            if holder_id == task.task_id:
                return None  # inserted now (or by this very submit sent again)
            if task.debounce is not None:
                joined = self._join_debounced(cursor, holder_id, task)
                if joined is not None:
                    return joined
            else:
                holder = self._latest(holder_id) if in_window else None
                live = holder is not None and holder.status in LIVE_STATUSES
                if holder is not None and (live or holder.handler_running):
                    return holder  # not ended: live, or its timed-out handler still runs
            cursor.execute(
                f"UPDATE {self._keys_table} SET task_id = %s, expires_at = %s "
                f"WHERE {self._key} = %s",
                [task.task_id, until, key],
            )
        return None

    def _join_debounced(self, cursor: Any, holder_id: str, task: NewTask) -> TaskInfo | None:
        """Debounce (core/debouncing.py), under the key row's lock: the key's task, given
        ``task``'s parameter and its new due time, when it still waits unclaimed and never
        started; else None (the key then passes to ``task``, which opens a new window)."""
        holder = self._latest(holder_id, for_update=True)
        if holder is None or holder.status is not TaskStatus.CREATED or holder.attempts:
            return None
        assert task.debounce is not None
        run_at = debounced_run_at(
            task.created_at, holder.created_at, task.debounce, task.debounce_max_wait
        )
        ms = holder.max_duration_millis
        deadline = run_at + dt.timedelta(milliseconds=ms) if ms else None  # counted from due
        joined = (
            self._tasks()
            .filter(pk=holder_id, available=True, status=TaskStatus.CREATED.value, attempts=0)
            .update(parameter=task.parameter, run_at=run_at, deadline_at=deadline)
        )
        if not joined:
            return None  # claimed meanwhile (the claim does not take the key row's lock)
        cursor.execute(
            f"UPDATE {self._keys_table} SET expires_at = %s WHERE {self._key} = %s",
            [self._dt(run_at + KEY_HOLD), task.unique_key],
        )
        replace_entries(self.alias, holder_id, task.indexed)  # those of its new parameter
        return copy_with(holder, parameter=task.parameter, run_at=run_at, debounced=True)

    @property
    def _key(self) -> str:
        return connections[self.alias].ops.quote_name("key")

    def _insert_key_sql(self) -> str:
        """INSERT of a key row that changes nothing when the key exists."""
        insert = f"INSERT INTO {self._keys_table} ({self._key}, task_id, expires_at) "
        if self.vendor == "mysql":
            # Not INSERT IGNORE: on a duplicate that takes a shared lock, and two submitters
            # both holding one deadlock when each then locks the row for update. This takes
            # the exclusive lock at once.
            return insert + "VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE task_id = task_id"
        return insert + f"VALUES (%s, %s, %s) ON CONFLICT ({self._key}) DO NOTHING"

    def _latest(self, task_id: str, *, for_update: bool = False) -> TaskInfo | None:
        """The task as last committed. On MySQL/MariaDB a plain read under REPEATABLE READ
        sees the transaction's snapshot, which may predate the holder: read with a lock (an
        exclusive one ``for_update``, for a row the caller then writes: a shared lock that
        must grow into an exclusive one deadlocks with another writer waiting for it)."""
        if self.vendor != "mysql":
            return self.get(task_id)
        lock = "FOR UPDATE" if for_update else "LOCK IN SHARE MODE"
        rows = ReliableTask.objects.db_manager(self.alias).raw(
            f"SELECT * FROM {self._table} WHERE task_id = %s {lock}", [task_id]
        )
        return next((to_info(row) for row in rows), None)

    def _purge_unique_keys(self, now: dt.datetime) -> int:
        """Delete the key rows whose window has passed, PURGE_BATCH at a time (short
        statements: a submit of one of them waits for none for long), up to PURGE_BATCHES."""
        keys = ReliableUniqueKey.objects.using(self.alias)
        deleted = 0
        for _ in range(PURGE_BATCHES):
            expired = list(
                keys.filter(expires_at__lte=now).values_list("pk", flat=True)[:PURGE_BATCH]
            )
            if expired:
                deleted += keys.filter(pk__in=expired, expires_at__lte=now).delete()[0]
            if len(expired) < PURGE_BATCH:
                break
        return deleted
