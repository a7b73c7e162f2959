"""The database storage's count of automatic retries per minute (the admin's throughput chart)."""

from __future__ import annotations

import datetime as dt
import logging
from contextlib import nullcontext

from django.db import DatabaseError, connections, transaction

from ...core.minute_counts import COUNTER_RETENTION_SECONDS, epoch_minute
from ...models import ReliableRetryCount

logger = logging.getLogger("django_reliable_executor")


def add_retries(alias: str, now: dt.datetime, retried: int) -> None:
    """Add ``retried`` automatic retries to the minute of ``now``: one upsert, in a savepoint of
    its own. The count is statistics: when it cannot be written (a deadlock, a locked SQLite
    file) it is logged and dropped, never failing the transition that was already made."""
    if retried <= 0:
        return
    connection = connections[alias]
    table = connection.ops.quote_name(ReliableRetryCount._meta.db_table)
    if connection.vendor == "mysql":
        sql = (
            f"INSERT INTO {table} (minute, retried) VALUES (%s, %s) "
            "ON DUPLICATE KEY UPDATE retried = retried + VALUES(retried)"
        )
    else:  # PostgreSQL, SQLite 3.24+
        sql = (
            f"INSERT INTO {table} (minute, retried) VALUES (%s, %s) "
            f"ON CONFLICT (minute) DO UPDATE SET retried = {table}.retried + EXCLUDED.retried"
        )
    # In the caller's transaction, a savepoint: a failed count must not break it (PostgreSQL
    # refuses every later statement of a transaction after an error). Outside, the statement
    # alone is atomic.
    savepoint = transaction.atomic(using=alias) if connection.in_atomic_block else nullcontext()
    try:
        with savepoint, connection.cursor() as cursor:
            cursor.execute(sql, [epoch_minute(now), retried])
    except DatabaseError as exc:
        logger.info("retry count of minute %s not written: %s", epoch_minute(now), exc)


def purge_retry_counts(alias: str, now: dt.datetime) -> int:
    """Delete the retry counts older than COUNTER_RETENTION_SECONDS."""
    oldest = epoch_minute(now - dt.timedelta(seconds=COUNTER_RETENTION_SECONDS))
    return ReliableRetryCount.objects.using(alias).filter(minute__lt=oldest).delete()[0]
