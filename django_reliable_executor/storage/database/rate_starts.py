"""The start of claims of rate-limited names that waited long in their worker: each one's
log entry moved to the start's time first, under the name's lock, or the claim handed back
(rate_log.py's docstring; Transitions.start_many calls start_many)."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence

from django.db import connections, transaction

from ...core.records import Claim
from ...models import ReliableNameLock, ReliableRateLog
from .access import DatabaseAccess
from .rate_entries import entry_counts, insert_entries, is_stale, take_out


def start_many(
    storage: DatabaseAccess, claims: Sequence[Claim], lease_seconds: float
) -> list[Claim | None]:
    """Claims of rate-limited names that waited here longer than their limit's
    ``fresh_seconds`` start only while their logged claim is in the window, moved to now
    first; the others are handed back. The rest as before, in the same start write."""
    now = storage.clock.now()
    if not any(is_stale(claim, now) for claim in claims):
        # The start time is the one just judged fresh: stored, it is within fresh_seconds
        # of its entry, as the limit's margin assumes.
        return storage._start_at(claims, lease_seconds, now)
    late, started = storage._retrying(
        functools.partial(_start_with_stale, storage, claims, lease_seconds)
    )
    if late:
        # Waited in its worker longer than the window: claimed again later, within the
        # limit (as handed back, no attempt counted).
        storage.release(late)
    return [started.get(claim.task_id) for claim in claims]


def _start_with_stale(
    storage: DatabaseAccess, claims: Sequence[Claim], lease_seconds: float
) -> tuple[list[Claim], dict[str, Claim | None]]:
    """The stale claims' entries moved and every claim still in its window started: the
    late claims, and the start of the others by id. On SQLite in one transaction (one
    write lock taken); elsewhere the moves commit before the start write, so that the
    name locks they take are not held through it (a start that then fails leaves its
    entry moved: counting a little longer for a start that did not happen)."""
    rated = [claim for claim in claims if claim.rate_limit is not None]
    with transaction.atomic(using=storage.alias):
        stale, moved, now = _restamp(storage, rated)
        late = [claim for claim in stale if claim.task_id not in moved]
        late_ids = {claim.task_id for claim in late}
        going = [claim for claim in claims if claim.task_id not in late_ids]
        if storage.vendor == "sqlite":
            return late, _started(storage, going, lease_seconds, now)
    return late, _started(storage, going, lease_seconds, now)


def _started(
    storage: DatabaseAccess, claims: list[Claim], lease_seconds: float, now: dt.datetime
) -> dict[str, Claim | None]:
    results = storage._start_at(claims, lease_seconds, now) if claims else []
    return dict(zip((claim.task_id for claim in claims), results, strict=True))


def _restamp(
    storage: DatabaseAccess, rated: list[Claim]
) -> tuple[list[Claim], set[str], dt.datetime]:
    """Move the logged claims of those of ``rated`` that are stale now and still in their
    window to now; return the stale ones, the task ids of those moved, and that now,
    which the start write then stores as every claim's start time.

    Under the lock of each of their names (taken in name order, so two starts never wait
    for each other): a claim of the name counts its window before the move or after it,
    never during it. Now is read once the locks are held: a start that waited for them
    under contention, stamped with the time before, would be stored that wait later than
    its entry, and two such starts could come closer than the window plus half the
    margin (seen: 6 stored starts of a "5/s" name within 1.032 s). The claims of one
    name, key and logged time come out of that time's rows (which count claims, not
    tasks: any claim logged then is as good as another), and go into one row at now per
    name and key."""
    connection = connections[storage.alias]
    table = connection.ops.quote_name(ReliableRateLog._meta.db_table)
    with connection.cursor() as cursor:
        for name in sorted({claim.task.task_name for claim in rated}):
            storage._lock_name(
                cursor, connection.ops.quote_name(ReliableNameLock._meta.db_table), name
            )
    now = storage.clock.now()
    claims = [claim for claim in rated if is_stale(claim, now)]
    groups: dict[tuple[str, str, dt.datetime, float], list[Claim]] = {}
    for claim in claims:
        assert claim.rate_limit is not None and claim.rate_logged_at is not None
        at = (claim.task.task_name, claim.rate_key, claim.rate_logged_at)
        groups.setdefault((*at, claim.rate_limit.log_window_seconds), []).append(claim)
    moved: list[Claim] = []
    with connections[storage.alias].cursor() as cursor:
        for (name, key, logged_at, window), group in groups.items():
            if logged_at <= now - dt.timedelta(seconds=window):
                continue  # out of the window: counted no more, nothing to move
            taken = take_out(storage, cursor, table, (name, key, logged_at), len(group))
            moved += group[:taken]
        keys_by_name: dict[str, list[str]] = {}
        for claim in moved:
            keys_by_name.setdefault(claim.task.task_name, []).append(claim.rate_key)
        for name, keys in keys_by_name.items():
            insert_entries(storage, cursor, name, entry_counts(keys, dict.fromkeys(keys, now)))
    return claims, {claim.task_id for claim in moved}, now
