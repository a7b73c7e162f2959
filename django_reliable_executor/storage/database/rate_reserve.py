"""SQLite's claim of a rate-limited name far below its limit, with no transaction: its tasks
reserved in the log by one statement that counts the window itself, then claimed by id
(rate_log.py's docstring; Claiming._claim calls claim_reserving)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import connections

from ...core.queries import ClaimRequest
from ...core.rate_limits import RateLimit
from ...core.records import Claim
from ...models import ReliableRateLog
from .rate_entries import entry_counts, entry_rows
from .rate_log import RateLog
from .rows import CLAIM_COLUMNS_SQL, CLAIM_FIELDS, RATE_KEY_SQL, Pick, claim_from_row


def claim_reserving(
    log: RateLog, request: ClaimRequest, whole: Pick, due: set[str | None]
) -> tuple[list[Sequence[Claim]], set[str | None]]:
    """SQLite: the claims of the rate-limited names of ``request`` found due that are far
    below their limits, each by ``_reserve_and_take`` (no transaction), a sequence per
    name; and ``due`` less those names, for the round's transaction. A capped name (by
    max_concurrency or max_concurrency_per_key), a fair one, and a name whose last claim here
    was not far below its limit, is left to the transaction."""
    parts: list[Sequence[Claim]] = []
    left = request.limit
    due = set(due)
    far_below = log.far_below
    for name, rate in request.rate_limits.items():
        if left <= 0:
            break
        capped = name in request.name_limits or name in request.key_limits
        # A fair name: its claim counts what its worker can start (core/fairness.FairRoom).
        fair = name in log.storage.flow_limits.fair()
        if name not in due or capped or fair or not far_below.get(name, True):
            continue
        pick = dataclasses.replace(whole, limit=left, name=name)
        claims = _reserve_and_take(log, pick, rate)
        far_below[name] = claims is not None
        if claims is not None:
            parts.append(claims)
            left -= len(claims)
            due.discard(name)
    return parts, due


def _reserve_and_take(log: RateLog, pick: Pick, rate: RateLimit) -> Sequence[Claim] | None:
    """SQLite: up to ``pick.limit`` due tasks of ``pick.name`` while the window stays at
    most half full with them, without a transaction: read the tasks to take and their
    keys (unless the round's first read did: ``RateLog.due_names``); log them ahead, in one
    statement that counts the window itself and writes nothing unless they leave it at
    most half full (None then: not far below its limit); claim them by id; and take out
    of the log the tasks another worker claimed meanwhile. Each statement holds the
    write lock only while it runs (a transaction held it from its BEGIN to its commit,
    and every start and completion of the worker waited for it). Safe: the log counts a
    claim before it exists, and an entry for a claim that never came (a worker gone
    between the two statements) only counts, for a window, room no task used."""
    assert pick.name is not None
    name, now = pick.name, pick.now
    connection = connections[log.storage.alias]
    table = connection.ops.quote_name(ReliableRateLog._meta.db_table)
    lead = now + dt.timedelta(seconds=rate.lead_seconds)
    with connection.cursor() as cursor:
        log.trim(cursor, table, name, now, rate)
        candidates = log.candidates.pop(name, None)
        if candidates is None:
            chosen, params = log.storage._pick_sql(pick)
            cursor.execute(f"SELECT task_id, {RATE_KEY_SQL} {chosen}", params)
            candidates = cursor.fetchall()
        candidates = candidates[: pick.limit]
        if not candidates:
            return []
        keys = [key for _, key in candidates]
        entries = entry_counts(keys, dict.fromkeys(keys, lead))
        rows_sql, values = entry_rows(log.storage, name, entries)
        cutoff = log.storage._dt(now - dt.timedelta(seconds=rate.log_window_seconds))
        cursor.execute(
            f"INSERT INTO {table} (name, rate_key, claims, claimed_at) "
            f"SELECT column1, column2, column3, column4 FROM (VALUES {rows_sql}) "
            f"WHERE (SELECT COALESCE(SUM(claims), 0) FROM {table} WHERE name = %s "
            "AND claimed_at > %s) * 2 + %s <= %s RETURNING id, rate_key, claims",
            [*values, name, cutoff, 2 * len(candidates), rate.count],
        )
        reserved = cursor.fetchall()
        if not reserved:
            return None
        ids = tuple(task_id for task_id, _ in candidates)
        ctes, claim_sql, params = log.storage._claim_update_sql(
            dataclasses.replace(pick, ids=ids, limit=len(ids)),
            f"{CLAIM_COLUMNS_SQL}, {RATE_KEY_SQL}",
        )
        assert not ctes  # SQLite's claim reads no CTE
        cursor.execute(claim_sql, params)
        rows = cursor.fetchall()
        if len(rows) < len(ids):
            taken = [str(row[len(CLAIM_FIELDS)]) for row in rows]
            _unreserve(cursor, table, reserved, taken)
    log.note_free_at(name, {}, rate, [], {}, now)  # no key near full
    width = len(CLAIM_FIELDS)
    return [
        claim_from_row(row[:width], rate_limit=rate, rate_logged_at=lead, rate_key=str(row[width]))
        for row in rows
    ]


def _unreserve(cursor: Any, table: str, reserved: list[tuple[Any, ...]], taken: list[str]) -> None:
    """Take out of the reserved log rows (id, rate key, claims) the claims not taken
    (``taken``: the keys of those taken), deleting a row left with none. A row another
    start took claims out of meanwhile (one logged at the same time) is left as it is:
    it counts a little more, for its window."""
    counts: dict[str, int] = {}
    for key in taken:
        counts[key] = counts.get(key, 0) + 1
    for row_id, key, n in reserved:
        extra = int(n) - counts.get(key, 0)
        if extra <= 0:
            continue
        if extra == n:
            cursor.execute(f"DELETE FROM {table} WHERE id = %s AND claims = %s", [row_id, n])
        else:
            cursor.execute(
                f"UPDATE {table} SET claims = claims - %s WHERE id = %s AND claims >= %s",
                [extra, row_id, extra],
            )
