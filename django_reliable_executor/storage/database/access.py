"""DatabaseAccess: the connection, table and SQL helpers every part of the database storage uses."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db import OperationalError, connections
from django.db.models import QuerySet

from ...clock import Clock
from ...models import ReliableTask
from ...records import Claim
from ...states import TaskStatus
from ..base import TaskStorage
from .rows import (
    MYSQL_RETRYABLE,
)

T = TypeVar("T")


class DatabaseAccess(TaskStorage):
    """Tasks in the ``reliable_executor_task`` table of one Django database connection."""

    def __init__(
        self,
        alias: str = "default",
        clock: Clock | None = None,
        backoff_cap_millis: int | None = None,
    ) -> None:
        super().__init__(clock)
        self.alias = alias
        self._backoff_cap_millis = backoff_cap_millis

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
                if self.vendor != "mysql" or code not in MYSQL_RETRYABLE or attempt == 4:
                    raise
                time.sleep(0.005 * 2**attempt)
        raise AssertionError("unreachable")
