"""rate_limit on the database storage: a sliding log of claims per name and rate key.

Each rate-limited name is claimed in its own short transaction serialised on the name's row of
``reliable_executor_name_lock`` (FOR UPDATE), like max_concurrency; on SQLite in the claim
round's one write transaction, serialised on the database's write lock (taken by BEGIN
IMMEDIATE, else by a write of the name's row). It counts the name's entries of
``reliable_executor_rate_log`` in the limit's log window (window + margin, see
``rate_limits.py``) — every key together first, the sum over an index range, and per rate key
only when a key could pass half full — claims at most the room of each key and logs them,
before committing: one row per key and time, counting its claims (so a count reads a row per
claim round, not one per task). Two workers never count the same free room. When every key
has room for the whole batch, the tasks are claimed in one statement that reads their keys
too (no candidates read first; on PostgreSQL the same statement writes their log rows).

On SQLite a name far below its limit (its last claim here found the window at most half full
with its batch) takes no transaction (``_reserve_and_take``): its tasks are read, logged by one
statement that counts the window itself and logs nothing unless they leave it at most half
full, then claimed by id. The log counts them before they are claimed, which is safe.

A claim that leaves its key's window at most half full logs its claims ``lead_seconds`` (half
the window, at most a second) ahead of its ``now`` — about when they start at the latest after
waiting in the worker's local queue — else at its ``now``: an entry later than its start only
counts longer. Entries out of the window count for nothing; a claim deletes them at most once
per margin in each process (housekeeping).

A claim waits in its worker's pool before it starts. A claim started within its limit's
``fresh_seconds`` (half the margin) of its logged time starts as any other: its handler begins
within the margin of it. The start of one that waited longer (``start_many``) first moves its
claim out of its row to one at the start's time, under the name's lock (committed before
the start write; on SQLite with it), so the limit counts the start; a claim whose row has left
the window meanwhile (it waited longer than the window) is not started but handed back, to be
claimed again within the limit. Moving a claim that every claim since has counted, to a later
time, keeps it counted: at no time was there room that a start later took twice.

Tasks over their limit are not touched: they stay waiting, and the claim notes when the
earliest full window frees, so that an idle worker's ``wait_for_work`` ends then rather than
at POLL_INTERVAL.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.utils.dateparse import parse_datetime

from ...core.queries import ClaimRequest, RateUse
from ...core.rate_limits import RateLimit
from ...core.records import Claim, copy_with
from ...models import ReliableNameLock, ReliableRateLog
from .access import DatabaseAccess
from .rows import CLAIM_COLUMNS_SQL, CLAIM_FIELDS, RATE_KEY_SQL, claim_from_row

if TYPE_CHECKING:
    from .claiming import Pick

# How many due tasks of a rate-limited name one claim looks at per task it may take: with rate
# keys, tasks of keys out of room are passed over in the same read.
CANDIDATES_PER_CLAIM = 4
# Most keys a claim leaves out as known full (beyond, it reads the log under the lock).
MAX_KNOWN_FULL = 100
# How often a claim's trim of the rate log reads the whole of a name's range (see _trim).
WHOLE_TRIM_EVERY = dt.timedelta(seconds=60)


def _stale(claim: Claim, now: dt.datetime) -> bool:
    """A claim of a rate-limited name logged longer ago than its limit's fresh_seconds (never
    one whose entry is still ahead of ``now``)."""
    rate, logged_at = claim.rate_limit, claim.rate_logged_at
    if rate is None or logged_at is None:
        return False
    return (now - logged_at).total_seconds() > rate.fresh_seconds


def _stamps(
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


def _entries(
    keys: list[str], stamps: Mapping[str, dt.datetime]
) -> dict[tuple[str, dt.datetime], int]:
    """``{(rate key, time): claims}``: the log rows of claims of ``keys`` logged at ``stamps``."""
    entries: dict[tuple[str, dt.datetime], int] = {}
    for key in keys:
        at = (key, stamps[key])
        entries[at] = entries.get(at, 0) + 1
    return entries


def _other_keys(keys: list[str]) -> tuple[str, list[Any]]:
    """SQL leaving out the tasks of rate keys ``keys`` ("" the tasks without a key), written
    so that the index on (task_name, rate_key) skips them (no COALESCE)."""
    named = [key for key in keys if key]
    not_named = f"rate_key NOT IN ({', '.join(['%s'] * len(named))})" if named else ""
    if "" in keys:
        return f" AND rate_key IS NOT NULL{' AND ' + not_named if named else ''}", named
    return f" AND (rate_key IS NULL OR {not_named})", named


def _aware(value: Any) -> dt.datetime:
    """A raw datetime column value (text on SQLite, naive UTC on MySQL) as an aware one."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value  # type: ignore[no-any-return]


class RateLimiting(DatabaseAccess):
    """The claim's rate_limit part (see the module docstring)."""

    #: time.time() at which the earliest window that held back a due task frees (set by each
    #: claim; ``wait_for_work`` ends then at the latest).
    rate_free_at: float | None = None
    #: SQLite: the tasks the round's first read found for each name far below its limit to
    #: take, with their keys, in pickup order (``_due_names``; ``_reserve_and_take`` uses them).
    _candidates: dict[str, list[tuple[str, str]]]

    def _claim_rate_limited(
        self,
        request: ClaimRequest,
        whole: Pick,
        due: Collection[str | None],
        *,
        joined: bool = False,
    ) -> list[Sequence[Claim]]:
        """Claims of the rate-limited names of ``request`` that ``_due_names`` found due, each
        name within its limit (and its cap), a sequence per name; ``joined``: in the caller's
        transaction."""
        claims: list[Sequence[Claim]] = []
        taken = 0
        for name, rate in request.rate_limits.items():
            budget = request.limit - taken
            if budget <= 0:
                break
            if name not in due:
                continue
            pick = dataclasses.replace(whole, limit=budget, name=name)
            cap = request.name_limits.get(name)
            claim = functools.partial(self._claim_rated, pick, rate, cap, joined=joined)
            claims.append(self._retrying(claim))
            taken += len(claims[-1])
        return claims

    def _claim_reserving(
        self, request: ClaimRequest, whole: Pick, due: set[str | None]
    ) -> tuple[list[Sequence[Claim]], set[str | None]]:
        """SQLite: the claims of the rate-limited names of ``request`` found due that are far
        below their limits, each by ``_reserve_and_take`` (no transaction), a sequence per
        name; and ``due`` less those names, for the round's transaction. A capped name, and a
        name whose last claim here was not far below its limit, is left to the transaction."""
        parts: list[Sequence[Claim]] = []
        left = request.limit
        due = set(due)
        far_below = self._far_below()
        for name, rate in request.rate_limits.items():
            if left <= 0:
                break
            if name not in due or name in request.name_limits or not far_below.get(name, True):
                continue
            pick = dataclasses.replace(whole, limit=left, name=name)
            claims = self._reserve_and_take(pick, rate)
            far_below[name] = claims is not None
            if claims is not None:
                parts.append(claims)
                left -= len(claims)
                due.discard(name)
        return parts, due

    def _reserve_and_take(self, pick: Pick, rate: RateLimit) -> Sequence[Claim] | None:
        """SQLite: up to ``pick.limit`` due tasks of ``pick.name`` while the window stays at
        most half full with them, without a transaction: read the tasks to take and their
        keys (unless the round's first read did: ``_due_names``); log them ahead, in one
        statement that counts the window itself and writes nothing unless they leave it at
        most half full (None then: not far below its limit); claim them by id; and take out
        of the log the tasks another worker claimed meanwhile. Each statement holds the
        write lock only while it runs (a transaction held it from its BEGIN to its commit,
        and every start and completion of the worker waited for it). Safe: the log counts a
        claim before it exists, and an entry for a claim that never came (a worker gone
        between the two statements) only counts, for a window, room no task used."""
        assert pick.name is not None
        name, now = pick.name, pick.now
        connection = connections[self.alias]
        table = connection.ops.quote_name(ReliableRateLog._meta.db_table)
        lead = now + dt.timedelta(seconds=rate.lead_seconds)
        with connection.cursor() as cursor:
            self._trim(cursor, table, name, now, rate)
            candidates = self.__dict__.get("_candidates", {}).pop(name, None)
            if candidates is None:
                chosen, params = self._pick_sql(pick)
                cursor.execute(f"SELECT task_id, {RATE_KEY_SQL} {chosen}", params)
                candidates = cursor.fetchall()
            candidates = candidates[: pick.limit]
            if not candidates:
                return []
            keys = [key for _, key in candidates]
            entries = _entries(keys, dict.fromkeys(keys, lead))
            rows_sql, values = self._entry_rows(name, entries)
            cutoff = self._dt(now - dt.timedelta(seconds=rate.log_window_seconds))
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
            ctes, claim_sql, params = self._claim_update_sql(
                dataclasses.replace(pick, ids=ids, limit=len(ids)),
                f"{CLAIM_COLUMNS_SQL}, {RATE_KEY_SQL}",
            )
            assert not ctes  # SQLite's claim reads no CTE
            cursor.execute(claim_sql, params)
            rows = cursor.fetchall()
            if len(rows) < len(ids):
                taken = [str(row[len(CLAIM_FIELDS)]) for row in rows]
                self._unreserve(cursor, table, reserved, taken)
        self._note_free_at(name, {}, rate, [], {}, now)  # no key near full
        width = len(CLAIM_FIELDS)
        return [
            claim_from_row(
                row[:width], rate_limit=rate, rate_logged_at=lead, rate_key=str(row[width])
            )
            for row in rows
        ]

    def _unreserve(
        self, cursor: Any, table: str, reserved: list[tuple[Any, ...]], taken: list[str]
    ) -> None:
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

    def _due_names(self, pick: Pick, request: ClaimRequest) -> set[str | None]:
        """The rate-limited and capped names of ``request`` with a task due in the pick's
        queues, and None when a task of any other name is due, found by one read before any
        lock: when nothing of them is due (the common case of an idle name) the claim takes
        no lock, and a round pays one round trip for all of them, not one per name; when no
        other name has a task due, the round writes no claim of them (on SQLite, an idle
        round takes no write lock, and a round of limited names only no statement more).

        A rate-limited name's keys this process saw full are left out until their window
        frees (no room can appear there sooner: entries leave only once out of the window,
        and a start only moves one later), so that their waiting tasks need no lock and no
        log read until then; the earliest such window of a name found not due is noted, for
        ``wait_for_work``.

        On SQLite the same read returns the tasks a name far below its limit would take
        (``_reserve_and_take``'s candidates, kept in ``_candidates``): one statement fewer."""
        now = pick.now.timestamp()
        names = list(dict.fromkeys([*request.rate_limits, *request.name_limits]))
        known_full: dict[str, dict[str, float]] = {}
        selects, params = [], []
        # MariaDB wants a FROM for a WHERE; DUAL is its table of one row.
        one_row = " FROM DUAL" if self.vendor == "mysql" else ""
        far_below = self._far_below()
        self._candidates = {}
        for index, name in enumerate(names):
            due_sql, due_params = self._due_of_name(pick, name)
            reserving = (
                self.vendor == "sqlite"
                and name in request.rate_limits
                and name not in request.name_limits
                and far_below.get(name, True)
                and not any(t > now for t in self._full_keys(name).values())
            )
            if reserving:
                # Every row a task: its id and key (the name's index names the row).
                chosen, chosen_params = self._pick_sql(dataclasses.replace(pick, name=name))
                selects.append(
                    f"SELECT {index}, task_id, log_key FROM (SELECT task_id, {RATE_KEY_SQL} "
                    f"{chosen})"
                )
                params += chosen_params
                self._candidates[name] = []
                continue
            if name in request.rate_limits:
                known = {k: t for k, t in self._full_keys(name).items() if t > now}
                known_full[name] = known
                if known and len(known) <= MAX_KNOWN_FULL:
                    keys_sql, keys_params = _other_keys(list(known))
                    due_sql += keys_sql
                    due_params += keys_params
            # The name's index as a literal: it names the row without a typed parameter.
            selects.append(f"SELECT {index}, NULL, NULL{one_row} WHERE EXISTS (SELECT 1 {due_sql})")
            params += due_params
        rest = dataclasses.replace(pick, limit=1, excluded=tuple(names))
        rest_sql, rest_params = self._pick_sql(rest)
        selects.append(f"SELECT -1, NULL, NULL{one_row} WHERE EXISTS (SELECT 1 {rest_sql})")
        params += rest_params
        due: set[str | None] = set()
        with connections[self.alias].cursor() as cursor:
            cursor.execute(" UNION ALL ".join(selects), params)
            for index, task_id, key in cursor.fetchall():
                if index < 0:
                    due.add(None)
                    continue
                due.add(names[int(index)])
                if task_id is not None:
                    self._candidates[names[int(index)]].append((task_id, key))
        for name, known in known_full.items():
            if name not in due and known:
                first = min(known.values())
                self.rate_free_at = min(first, self.rate_free_at or first)
        return due

    def _claim_rated(
        self, pick: Pick, rate: RateLimit, cap: int | None, *, joined: bool = False
    ) -> Sequence[Claim]:
        """Up to ``pick.limit`` due tasks of ``pick.name`` within its rate limit (and ``cap``),
        serialised on the name's lock row, in a transaction of its own or, ``joined``, in the
        caller's (no savepoint: a failure rolls the caller's back)."""
        assert pick.name is not None
        name, now = pick.name, pick.now
        connection = connections[self.alias]
        quote = connection.ops.quote_name
        with transaction.atomic(using=self.alias, savepoint=not joined):
            with connection.cursor() as cursor:
                self._lock_name(cursor, quote(ReliableNameLock._meta.db_table), name)
                self._trim(cursor, quote(ReliableRateLog._meta.db_table), name, now, rate)
                used = self._window_use(cursor, name, now, rate, pick.limit)
                # SQLite: the next round tries _claim_reserving first only if this one is
                # far below the limit.
                self._far_below()[name] = used is None
                limit = pick.limit
                if cap is not None:
                    limit = min(limit, cap - self._held(cursor, name, now))
                claims, keys, logged = self._take_within(cursor, pick, rate, used, limit)
            stamps = _stamps(rate, used, keys, now) if claims else {}
            if claims and not logged:
                self._log(name, claims, keys, stamps)
        self._note_free_at(name, used or {}, rate, keys, stamps, now)
        return [
            copy_with(claim, rate_limit=rate, rate_logged_at=stamps[key], rate_key=key)
            for claim, key in zip(claims, keys, strict=True)
        ]

    def _take_within(
        self,
        cursor: Any,
        pick: Pick,
        rate: RateLimit,
        used: dict[str, tuple[int, dt.datetime]] | None,
        limit: int,
    ) -> tuple[list[Claim], list[str], bool]:
        """Up to ``limit`` claims of ``pick.name`` within each key's room, their keys, and
        whether their log rows are written already (at ``_stamps``' times). ``used`` None:
        every key stays at most half full with the whole batch (``_window_use``)."""
        if limit <= 0:
            return [], [], False
        busiest = max((n for n, _ in (used or {}).values()), default=0)
        if used is None or busiest + limit <= rate.count:
            # Every key has room for the whole batch (the limit far above its use): claimed
            # in one statement, as a capped name is, reading the keys with the claims.
            whole = dataclasses.replace(pick, limit=limit)
            leads = used is None or rate.has_room_to_lead(busiest + limit)
            if self.vendor == "postgresql" and leads:
                # Every key's entries are logged ahead (_stamps): by the same statement.
                lead = pick.now + dt.timedelta(seconds=rate.lead_seconds)
                return (*self._take_logged(whole, lead), True)
            return (*self._take_keyed(whole), False)
        assert used is not None
        full = [key for key, (n, _) in used.items() if n >= rate.count]
        chosen = self._choose(cursor, pick, rate, used, full, limit)
        if not chosen:
            return [], [], False
        claims = self._take(dataclasses.replace(pick, limit=len(chosen), ids=tuple(chosen)))
        return claims, [chosen[claim.task_id] for claim in claims], False

    def _log(
        self, name: str, claims: list[Claim], keys: list[str], stamps: dict[str, dt.datetime]
    ) -> None:
        """The log entries of ``claims`` (of rate keys ``keys``, logged at ``stamps``)."""
        with connections[self.alias].cursor() as cursor:
            self._log_entries(cursor, name, _entries(keys, stamps))

    def _log_entries(
        self, cursor: Any, name: str, entries: Mapping[tuple[str, dt.datetime], int]
    ) -> None:
        """One log row per (rate key, time) of ``entries``, counting its claims, in one
        multi-row INSERT (hand-written: building it through the ORM cost more CPU than the
        rest of the claim). A round far below its limit writes one row, whatever its size."""
        table = connections[self.alias].ops.quote_name(ReliableRateLog._meta.db_table)
        rows, params = self._entry_rows(name, entries)
        cursor.execute(
            f"INSERT INTO {table} (name, rate_key, claims, claimed_at) VALUES {rows}", params
        )

    def _entry_rows(
        self, name: str, entries: Mapping[tuple[str, dt.datetime], int]
    ) -> tuple[str, list[Any]]:
        """The rows of ``entries`` as SQL ``(name, rate_key, claims, claimed_at), ...`` and its
        parameters."""
        params: list[Any] = []
        for (key, stamp), n in entries.items():
            params += [name, key, n, self._dt(stamp)]
        return ", ".join(["(%s, %s, %s, %s)"] * len(entries)), params

    def start_many(self, claims: Sequence[Claim], lease_seconds: float) -> list[Claim | None]:
        """Claims of rate-limited names that waited here longer than their limit's
        ``fresh_seconds`` start only while their logged claim is in the window, moved to now
        first; the others are handed back. The rest as before, in the same start write."""
        now = self.clock.now()
        if not any(_stale(claim, now) for claim in claims):
            # The start time is the one just judged fresh: stored, it is within fresh_seconds
            # of its entry, as the limit's margin assumes.
            return self._start_at(claims, lease_seconds, now)
        late, started = self._retrying(
            functools.partial(self._start_with_stale, claims, lease_seconds)
        )
        if late:
            # Waited in its worker longer than the window: claimed again later, within the
            # limit (as handed back, no attempt counted).
            self.release(late)
        return [started.get(claim.task_id) for claim in claims]

    def _start_with_stale(
        self, claims: Sequence[Claim], lease_seconds: float
    ) -> tuple[list[Claim], dict[str, Claim | None]]:
        """The stale claims' entries moved and every claim still in its window started: the
        late claims, and the start of the others by id. On SQLite in one transaction (one
        write lock taken); elsewhere the moves commit before the start write, so that the
        name locks they take are not held through it (a start that then fails leaves its
        entry moved: counting a little longer for a start that did not happen)."""
        rated = [claim for claim in claims if claim.rate_limit is not None]
        with transaction.atomic(using=self.alias):
            stale, moved, now = self._restamp(rated)
            late = [claim for claim in stale if claim.task_id not in moved]
            late_ids = {claim.task_id for claim in late}
            going = [claim for claim in claims if claim.task_id not in late_ids]
            if self.vendor == "sqlite":
                return late, self._started(going, lease_seconds, now)
        return late, self._started(going, lease_seconds, now)

    def _started(
        self, claims: list[Claim], lease_seconds: float, now: dt.datetime
    ) -> dict[str, Claim | None]:
        results = self._start_at(claims, lease_seconds, now) if claims else []
        return dict(zip((claim.task_id for claim in claims), results, strict=True))

    def _restamp(self, rated: list[Claim]) -> tuple[list[Claim], set[str], dt.datetime]:
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
        connection = connections[self.alias]
        table = connection.ops.quote_name(ReliableRateLog._meta.db_table)
        with connection.cursor() as cursor:
            for name in sorted({claim.task.task_name for claim in rated}):
                self._lock_name(
                    cursor, connection.ops.quote_name(ReliableNameLock._meta.db_table), name
                )
        now = self.clock.now()
        claims = [claim for claim in rated if _stale(claim, now)]
        groups: dict[tuple[str, str, dt.datetime, float], list[Claim]] = {}
        for claim in claims:
            assert claim.rate_limit is not None and claim.rate_logged_at is not None
            at = (claim.task.task_name, claim.rate_key, claim.rate_logged_at)
            groups.setdefault((*at, claim.rate_limit.log_window_seconds), []).append(claim)
        moved: list[Claim] = []
        with connections[self.alias].cursor() as cursor:
            for (name, key, logged_at, window), group in groups.items():
                if logged_at <= now - dt.timedelta(seconds=window):
                    continue  # out of the window: counted no more, nothing to move
                taken = self._take_out(cursor, table, (name, key, logged_at), len(group))
                moved += group[:taken]
            keys_by_name: dict[str, list[str]] = {}
            for claim in moved:
                keys_by_name.setdefault(claim.task.task_name, []).append(claim.rate_key)
            for name, keys in keys_by_name.items():
                self._log_entries(cursor, name, _entries(keys, dict.fromkeys(keys, now)))
        return claims, {claim.task_id for claim in moved}, now

    def _take_out(self, cursor: Any, table: str, at: tuple[str, str, dt.datetime], n: int) -> int:
        """Take up to ``n`` claims out of the log rows of (name, rate key, time) ``at``; how
        many there were. A row left with none is deleted."""
        cursor.execute(
            f"SELECT id, claims FROM {table} WHERE name = %s AND rate_key = %s "
            "AND claimed_at = %s ORDER BY id",
            [at[0], at[1], self._dt(at[2])],
        )
        taken = 0
        for row_id, claims in cursor.fetchall():
            if taken == n:
                break
            out = min(int(claims), n - taken)
            if out == claims:
                cursor.execute(f"DELETE FROM {table} WHERE id = %s", [row_id])
            else:
                cursor.execute(
                    f"UPDATE {table} SET claims = claims - %s WHERE id = %s", [out, row_id]
                )
            taken += out
        return taken

    def _due_of_name(self, pick: Pick, name: str | None = None) -> tuple[str, list[Any]]:
        """The due tasks of ``name`` (default ``pick.name``) in the pick's queues (FROM on)."""
        marks = ", ".join(["%s"] * len(pick.queues))
        return (
            f"FROM {self._table} WHERE available = %s AND task_name = %s "
            f"AND queue IN ({marks}) AND run_at <= %s {self._not_paused_sql.rstrip()}",
            [True, name or pick.name, *pick.queues, self._dt(pick.now)],
        )

    def _window_use(
        self, cursor: Any, name: str, now: dt.datetime, rate: RateLimit, limit: int
    ) -> dict[str, tuple[int, dt.datetime]] | None:
        """Per rate key, the claims of the name in its log's window and the earliest of them;
        None when the window's entries of every key together leave it at most half full with
        ``limit`` claims more (then so does each key: a claim far below its limit counts the
        index range, and reads no keys). Read under the name's lock, which every write of
        the name's log holds (claims, and starts moving entries): the count is exact."""
        table = connections[self.alias].ops.quote_name(ReliableRateLog._meta.db_table)
        cutoff = self._dt(now - dt.timedelta(seconds=rate.log_window_seconds))
        # claimed_at in the condition: the index range of the window only, not the entries
        # out of it (on PostgreSQL, deleted rows stay in the index until a vacuum).
        cursor.execute(
            f"SELECT COALESCE(SUM(claims), 0) FROM {table} WHERE name = %s AND claimed_at > %s",
            [name, cutoff],
        )
        (total,) = cursor.fetchone()
        if rate.has_room_to_lead(int(total) + limit):
            return None
        cursor.execute(
            f"SELECT rate_key, SUM(claims), MIN(claimed_at) FROM {table} WHERE name = %s "
            "AND claimed_at > %s GROUP BY rate_key",
            [name, cutoff],
        )
        return {key: (int(n), _aware(oldest)) for key, n, oldest in cursor.fetchall()}

    def _trim(self, cursor: Any, table: str, name: str, now: dt.datetime, rate: RateLimit) -> None:
        """Delete the name's entries out of the window, at most once per margin in this
        process: housekeeping only (every count reads the window's range), so a claim does
        not pay a DELETE each time. Each trim reads only the range since the last one (less
        a margin, for entries stamped by a worker whose clock lags), not the index entries
        of every row deleted since the last vacuum (PostgreSQL keeps them until then); once
        a minute it reads the whole range, for any entry left older."""
        trims: dict[str, tuple[dt.datetime, dt.datetime]] = self.__dict__.setdefault(
            "_rate_trims", {}
        )
        margin = dt.timedelta(seconds=rate.margin_seconds)
        window = dt.timedelta(seconds=rate.log_window_seconds)
        last, last_whole = trims.get(name, (None, None))
        if last is not None and dt.timedelta(0) <= now - last < margin:
            return
        sql = f"DELETE FROM {table} WHERE name = %s AND claimed_at <= %s"
        params = [name, self._dt(now - window)]
        if last_whole is not None and dt.timedelta(0) <= now - last_whole < WHOLE_TRIM_EVERY:
            assert last is not None
            sql += " AND claimed_at > %s"
            params.append(self._dt(last - window - margin))
        else:
            last_whole = now
        cursor.execute(sql, params)
        trims[name] = (now, last_whole)

    def _choose(
        self,
        cursor: Any,
        pick: Pick,
        rate: RateLimit,
        used: dict[str, tuple[int, dt.datetime]],
        full: list[str],
        limit: int,
    ) -> dict[str, str]:
        """``{task_id: rate key}`` of the due tasks to claim, in pickup order, within each
        key's room; tasks of full keys are left out in the query itself."""
        if limit <= 0:
            return {}
        due_sql, params = self._due_of_name(pick)
        if full:
            keys_sql, keys_params = _other_keys(full)
            due_sql += keys_sql
            params += keys_params
        lock = " FOR UPDATE SKIP LOCKED" if self.vendor != "sqlite" else ""
        cursor.execute(
            f"SELECT task_id, COALESCE(rate_key, '') {due_sql} "
            f"ORDER BY priority DESC, run_at ASC LIMIT %s{lock}",
            [*params, limit * CANDIDATES_PER_CLAIM],
        )
        chosen: dict[str, str] = {}
        room = {key: rate.count - n for key, (n, _) in used.items()}
        for task_id, key in cursor.fetchall():
            if len(chosen) >= limit:
                break
            if room.setdefault(key, rate.count) > 0:
                room[key] -= 1
                chosen[task_id] = key
        return chosen

    def _far_below(self) -> dict[str, bool]:
        """``{name: whether its last claim here found its window far below the limit}``
        (SQLite: such a name is claimed by ``_reserve_and_take`` first; unknown: True)."""
        hints: dict[str, bool] = self.__dict__.setdefault("_rate_far_below", {})
        return hints

    def _full_keys(self, name: str) -> dict[str, float]:
        """``{rate key: time.time() its window frees}`` of the keys of ``name`` the last
        claim of it here found full."""
        cache: dict[str, dict[str, float]] = self.__dict__.setdefault("_rate_full", {})
        return cache.get(name, {})

    def _note_free_at(
        self,
        name: str,
        used: dict[str, tuple[int, dt.datetime]],
        rate: RateLimit,
        keys: list[str],
        stamps: Mapping[str, dt.datetime],
        now: dt.datetime,
    ) -> None:
        """Remember when the earliest full window of the name frees (a key full before this
        claim or filled by it), for ``wait_for_work``: a window after the key's oldest entry,
        which may be one this claim logged at ``now`` (``stamps``), older than entries logged
        ahead before it. A wake-up for a key with nothing left waiting costs one claim that
        finds nothing."""
        taken: dict[str, int] = {}
        for key in keys:
            taken[key] = taken.get(key, 0) + 1
        window = dt.timedelta(seconds=rate.log_window_seconds)
        full: dict[str, float] = {}
        for key in set(used) | set(taken):
            n, oldest = used.get(key, (0, now))
            if key in taken:
                oldest = min(oldest, stamps[key]) if key in used else stamps[key]
            if n + taken.get(key, 0) >= rate.count:
                full[key] = (oldest + window).timestamp()
        self.__dict__.setdefault("_rate_full", {})[name] = full
        if full:
            first = min(full.values())
            self.rate_free_at = min(first, self.rate_free_at or first)

    def _rate_timeout(self, timeout: float, now: float) -> float:
        """``timeout`` shortened to end when a window noted by the last claim frees."""
        free_at = self.rate_free_at
        if free_at is None:
            return timeout
        return max(0.001, min(timeout, free_at - now))

    def rate_use(self, limits: Mapping[str, RateLimit]) -> list[RateUse]:
        now = self.clock.now()
        table = connections[self.alias].ops.quote_name(ReliableRateLog._meta.db_table)
        uses = []
        with connections[self.alias].cursor() as cursor:
            for name, rate in limits.items():
                window_start = now - dt.timedelta(seconds=rate.window_seconds)
                log_start = now - dt.timedelta(seconds=rate.log_window_seconds)
                cursor.execute(
                    "SELECT rate_key, SUM(CASE WHEN claimed_at > %s THEN claims ELSE 0 END), "
                    f"SUM(claims) FROM {table} WHERE name = %s AND claimed_at > %s "
                    "GROUP BY rate_key",
                    [self._dt(window_start), name, self._dt(log_start)],
                )
                rows = [(key, int(recent or 0), int(n)) for key, recent, n in cursor.fetchall()]
                full = [key for key, _, n in rows if n >= rate.count]
                held = 0
                if full:
                    cursor.execute(
                        f"SELECT COUNT(*) FROM {self._table} WHERE available = %s "
                        "AND task_name = %s AND run_at <= %s AND COALESCE(rate_key, '') "
                        f"IN ({', '.join(['%s'] * len(full))})",
                        [True, name, self._dt(now), *full],
                    )
                    (held,) = cursor.fetchone()
                recent = [r for _, r, _ in rows]
                busiest = max(recent, default=0)
                keys = sum(1 for r in recent if r)
                uses.append(RateUse(name, rate, sum(recent), busiest, keys, int(held)))
        return uses

    # Provided by Claiming (which builds on this class).
    @property
    def _not_paused_sql(self) -> str:
        raise NotImplementedError

    def _lock_name(self, cursor: Any, table: str, name: str) -> None:
        raise NotImplementedError

    def _held(self, cursor: Any, name: str, now: dt.datetime) -> int:
        raise NotImplementedError

    def _take(self, pick: Pick) -> list[Claim]:
        raise NotImplementedError

    def _pick_sql(self, pick: Pick) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def _take_keyed(self, pick: Pick) -> tuple[list[Claim], list[str]]:
        raise NotImplementedError

    def _take_logged(self, pick: Pick, logged_at: dt.datetime) -> tuple[list[Claim], list[str]]:
        raise NotImplementedError

    def _claim_update_sql(self, pick: Pick, returning: str) -> tuple[str, str, list[Any]]:
        raise NotImplementedError
