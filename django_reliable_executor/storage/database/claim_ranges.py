"""MariaDB's claim beside many tasks due later (delayed, backing off, in a durable wait): the
first locking read is bounded, then the due tasks are read by priority ranges that skip those
not due yet."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, connections

# Why: the claim index orders a lane's waiting tasks by (priority, run_at), so "due now, in
# pickup order" is not one range of it. A claim that finds fewer due tasks than it asks for
# reads on through every task due later, and MariaDB locks each entry it reads (FOR UPDATE):
# 150 ms for a claim beside 100,000 sleeping tasks, against 1.5 ms without them. Per priority
# it is one range, (priority, run_at <= now): the waiting priorities are few, and each one
# costs an index dive to find.

#: Index entries the claim's first read may examine (MariaDB's LIMIT ... ROWS EXAMINED) before
#: it stops and the claim reads by priority ranges instead. A busy lane fills its LIMIT long
#: before; rows other workers hold (skipped) count too, so it leaves room for them.
EXAMINED = 1000
#: MariaDB's error number for a sort stopped by ROWS EXAMINED (ER_FILSORT_ABORT).
SORT_ABORTED = 1028
#: More distinct waiting priorities than this in a queue: the claim reads unbounded, as before.
MAX_PRIORITIES = 16


def stopped(alias: str) -> bool:
    """The last statement on ``alias`` left a warning, as a read stopped at ROWS EXAMINED does
    (any other warning only costs the claim its ranged read). Read from the reply already
    received: no round trip."""
    return bool(connections[alias].connection.warning_count())


def sort_stopped(exc: Exception) -> bool:
    """MariaDB's error for a read that sorts (a claim of several queues) stopped at ROWS
    EXAMINED: "Sort aborted". It ends that statement only, not the transaction."""
    return bool(exc.args) and exc.args[0] == SORT_ABORTED


def waiting_priorities(
    cursor: Any, table: str, lane: str, queues: Sequence[str]
) -> list[int] | None:
    """The distinct priorities of the waiting tasks (due or not) of ``queues`` in the claim
    index's ``lane``, highest first: one index dive each. None past MAX_PRIORITIES a queue."""
    found: set[int] = set()
    for queue in queues:
        below: list[int] = []
        for _ in range(MAX_PRIORITIES + 1):
            bound = "AND priority < %s " if below else ""
            cursor.execute(
                f"SELECT priority FROM {table} WHERE available = %s AND limited_name = %s "
                f"AND queue = %s {bound}ORDER BY priority DESC LIMIT 1",
                [True, lane, queue, *below],
            )
            row = cursor.fetchone()
            if row is None:
                break
            found.add(row[0])
            below = [row[0]]
        else:
            return None
    return sorted(found, reverse=True)


def rows_of(cursor: Any, sql: str, params: list[Any]) -> list[Any]:
    """The rows of ``sql`` (none for no SQL)."""
    if not sql:
        return []
    cursor.execute(sql, params)
    return list(cursor.fetchall())


def bounded_rows(
    cursor: Any, alias: str, sql: str, params: list[Any], mariadb: bool
) -> list[Any] | None:
    """The rows of ``sql``; on MariaDB (``mariadb``) None when the read stopped after EXAMINED
    index entries (its rows may then miss some)."""
    if not mariadb:
        return rows_of(cursor, sql, params)
    try:
        cursor.execute(f"{sql} LIMIT ROWS EXAMINED %s", [*params, EXAMINED])
    except DatabaseError as exc:
        if sort_stopped(exc):
            return None
        raise
    rows = list(cursor.fetchall())
    return None if stopped(alias) else rows
