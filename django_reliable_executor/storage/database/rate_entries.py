"""The rate log's rows: when a claim is logged, the rows its claims make, and taking claims
out of them (rate_log.py, rate_reserve.py, rate_starts.py write them)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Protocol

from django.db import connections
from django.utils.dateparse import parse_datetime

from ...core.rate_limits import RateLimit
from ...core.records import Claim
from ...models import ReliableRateLog


class LogDatabase(Protocol):
    """The rate log's database, as the writes here use it (DatabaseAccess)."""

    alias: str

    def _dt(self, value: dt.datetime) -> Any: ...


def is_stale(claim: Claim, now: dt.datetime) -> bool:
    """A claim of a rate-limited name logged longer ago than its limit's fresh_seconds (never
    one whose entry is still ahead of ``now``)."""
    rate, logged_at = claim.rate_limit, claim.rate_logged_at
    if rate is None or logged_at is None:
        return False
    return (now - logged_at).total_seconds() > rate.fresh_seconds


def stamp_times(
    rate: RateLimit,
    used: Mapping[str, tuple[int, dt.datetime]] | None,
    keys: list[str],
    now: dt.datetime,
) -> dict[str, dt.datetime]:
    """The time each rate key's new entries are logged at: ``lead_seconds`` ahead of ``now``
    while the key's window stays at most half full with them (their tasks wait in the
    worker's local queue for about that long, so their starts need not move them), else
    ``now``. An entry later than its start only counts longer, never shorter: the limit holds;
    a window half empty has the room to spare. ``used`` None: every key stays half empty."""
    lead = now + dt.timedelta(seconds=rate.lead_seconds)
    if used is None:
        return {key: lead for key in keys}
    taken: dict[str, int] = {}
    for key in keys:
        taken[key] = taken.get(key, 0) + 1
    return {
        key: lead if rate.has_room_to_lead(used.get(key, (0, now))[0] + n) else now
        for key, n in taken.items()
    }


def entry_counts(
    keys: list[str], stamps: Mapping[str, dt.datetime]
) -> dict[tuple[str, dt.datetime], int]:
    """``{(rate key, time): claims}``: the log rows of claims of ``keys`` logged at ``stamps``."""
    entries: dict[tuple[str, dt.datetime], int] = {}
    for key in keys:
        at = (key, stamps[key])
        entries[at] = entries.get(at, 0) + 1
    return entries


def other_keys_sql(keys: list[str]) -> tuple[str, list[Any]]:
    """SQL leaving out the tasks of rate keys ``keys`` ("" the tasks without a key), written
    so that the index on (task_name, rate_key) skips them (no COALESCE)."""
    named = [key for key in keys if key]
    not_named = f"rate_key NOT IN ({', '.join(['%s'] * len(named))})" if named else ""
    if "" in keys:
        return f" AND rate_key IS NOT NULL{' AND ' + not_named if named else ''}", named
    return f" AND (rate_key IS NULL OR {not_named})", named


def aware(value: Any) -> dt.datetime:
    """A raw datetime column value (text on SQLite, naive UTC on MySQL) as an aware one."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value  # type: ignore[no-any-return]


def insert_entries(
    storage: LogDatabase, cursor: Any, name: str, entries: Mapping[tuple[str, dt.datetime], int]
) -> None:
    """One log row per (rate key, time) of ``entries``, counting its claims, in one
    multi-row INSERT (hand-written: building it through the ORM cost more CPU than the
    rest of the claim). A round far below its limit writes one row, whatever its size."""
    table = connections[storage.alias].ops.quote_name(ReliableRateLog._meta.db_table)
    rows, params = entry_rows(storage, name, entries)
    cursor.execute(
        f"INSERT INTO {table} (name, rate_key, claims, claimed_at) VALUES {rows}", params
    )


def entry_rows(
    storage: LogDatabase, name: str, entries: Mapping[tuple[str, dt.datetime], int]
) -> tuple[str, list[Any]]:
    """The rows of ``entries`` as SQL ``(name, rate_key, claims, claimed_at), ...`` and its
    parameters."""
    params: list[Any] = []
    for (key, stamp), n in entries.items():
        params += [name, key, n, storage._dt(stamp)]
    return ", ".join(["(%s, %s, %s, %s)"] * len(entries)), params


def take_out(
    storage: LogDatabase, cursor: Any, table: str, at: tuple[str, str, dt.datetime], n: int
) -> int:
    """Take up to ``n`` claims out of the log rows of (name, rate key, time) ``at``; how
    many there were. A row left with none is deleted."""
    cursor.execute(
        f"SELECT id, claims FROM {table} WHERE name = %s AND rate_key = %s "
        "AND claimed_at = %s ORDER BY id",
        [at[0], at[1], storage._dt(at[2])],
    )
    taken = 0
    for row_id, claims in cursor.fetchall():
        if taken == n:
            break
        out = min(int(claims), n - taken)
        if out == claims:
            cursor.execute(f"DELETE FROM {table} WHERE id = %s", [row_id])
        else:
            cursor.execute(f"UPDATE {table} SET claims = claims - %s WHERE id = %s", [out, row_id])
        taken += out
    return taken
