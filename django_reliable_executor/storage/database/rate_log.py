"""rate_limit on the database storage: a sliding log of claims per name and rate key.

Each rate-limited name is claimed in its own short transaction serialised on the name's row of
``reliable_executor_name_lock`` (FOR UPDATE), like max_concurrency; on SQLite in the claim
round's one write transaction, serialised on the database's write lock (taken by BEGIN
IMMEDIATE, else by a write of the name's row). It counts the name's entries of
``reliable_executor_rate_log`` in the limit's log window (window + margin, see
``core/rate_limits.py``) — every key together first, the sum over an index range, and per rate key
only when a key could pass half full — claims at most the room of each key and logs them,
before committing: one row per key and time, counting its claims (so a count reads a row per
claim round, not one per task). Two workers never count the same free room. When every key
has room for the whole batch, the tasks are claimed in one statement that reads their keys
too (no candidates read first; on PostgreSQL the same statement writes their log rows).

On SQLite a name far below its limit (its last claim here found the window at most half full
with its batch) takes no transaction (rate_reserve.py): its tasks are read, logged by one
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

Where each part lives: the claim under the lock here (``RateLog``, which Claiming calls by
name and which takes the tasks with Claiming's statements); SQLite's claim far below the
limit in rate_reserve.py; the start's move in rate_starts.py (Transitions.start_many); the
log rows' times and writes in rate_entries.py; ``rate_use`` in reading.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

from django.db import connections, transaction

from ...core.fairness import FairRoom
from ...core.queries import ClaimRequest
from ...core.rate_limits import RateLimit
from ...core.records import Claim, copy_with
from ...models import ReliableNameLock, ReliableRateLog
from .claim_ranges import bounded_rows, rows_of, waiting_priorities
from .claim_statements import ClaimStatements
from .rate_entries import aware, entry_counts, insert_entries, other_keys_sql, stamp_times
from .rows import RATE_KEY_SQL, Pick

T = TypeVar("T")
# How many due tasks of a rate-limited name one claim looks at per task it may take: with rate
# keys, tasks of keys out of room are passed over in the same read.
CANDIDATES_PER_CLAIM = 4
# Most keys a claim leaves out as known full (beyond, it reads the log under the lock).
MAX_KNOWN_FULL = 100
# How often a claim's trim of the rate log reads the whole of a name's range (see trim).
WHOLE_TRIM_EVERY = dt.timedelta(seconds=60)


def _one_row(vendor: str) -> str:
    """What a SELECT with a WHERE and no table needs: MariaDB wants a FROM for a WHERE; DUAL
    is its table of one row."""
    return " FROM DUAL" if vendor == "mysql" else ""


class RateLog:
    """The claim's rate_limit part (see the module docstring), one per storage object: what
    the claims of this process last found (keys full, names far below their limits, the
    last trims) is kept here between rounds."""

    def __init__(self, storage: ClaimStatements) -> None:
        self.storage = storage
        #: SQLite: the tasks the round's first read found for each name far below its limit
        #: to take, with their keys, in pickup order (``due_names``; rate_reserve.py uses
        #: them).
        self.candidates: dict[str, list[tuple[str, str]]] = {}
        #: ``{name: whether its last claim here found its window far below the limit}``
        #: (SQLite: such a name is claimed by rate_reserve.py first; unknown: True).
        self.far_below: dict[str, bool] = {}
        # {name: {rate key: time.time() its window frees}}, see full_keys
        self._full: dict[str, dict[str, float]] = {}
        # {name: (the last trim, the last trim of the whole range)}, see trim
        self._trims: dict[str, tuple[dt.datetime, dt.datetime]] = {}

    def claim_rate_limited(
        self,
        request: ClaimRequest,
        whole: Pick,
        due: Collection[str | None],
        fair_room: FairRoom,
        *,
        joined: bool = False,
    ) -> list[Sequence[Claim]]:
        """Claims of the rate-limited names of ``request`` that ``due_names`` found due, each
        name within its limit (and its cap, and for a fair name ``fair_room``), a sequence per
        name; ``joined``: in the caller's transaction."""
        claims: list[Sequence[Claim]] = []
        taken = 0
        for name, rate in request.rate_limits.items():
            if request.limit - taken <= 0:
                break
            budget = fair_room.of(name, request.limit - taken)
            if budget <= 0 or name not in due:
                continue
            pick = dataclasses.replace(whole, limit=budget, name=name)
            caps = (request.name_limits.get(name), request.key_limits.get(name))
            claim = functools.partial(self._claim_rated, pick, rate, caps, joined=joined)
            claims.append(self.storage._retrying(claim))
            taken += len(claims[-1])
            fair_room.took(name, len(claims[-1]))
        return claims

    def due_names(
        self, pick: Pick, request: ClaimRequest, fair: Sequence[str] = ()
    ) -> set[str | None]:
        """The rate-limited and capped names of ``request`` (and the ``fair`` names: see
        Claiming._fair_only) with a task due in the pick's
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
        (rate_reserve.py's candidates, kept in ``candidates``): one statement fewer."""
        names = list(
            dict.fromkeys([*request.rate_limits, *request.name_limits, *request.key_limits, *fair])
        )
        known_full: dict[str, dict[str, float]] = {}
        selects, params = [], []
        one_row = _one_row(self.storage.vendor)
        self.candidates = {}
        for index, name in enumerate(names):
            select, select_params = self._probe(pick, request, index, name, known_full)
            selects.append(select)
            params += select_params
        rest = dataclasses.replace(pick, limit=1, excluded=tuple(names))
        rest_sql, rest_params = self.storage._pick_sql(rest)
        rest_select = f"SELECT -1, NULL, NULL{one_row} WHERE EXISTS (SELECT 1 "
        due: set[str | None] = set()
        with connections[self.storage.alias].cursor() as cursor:
            every = [*selects, rest_select + rest_sql + ")"]
            sql, bound = " UNION ALL ".join(every), self.storage._mariadb
            rows = bounded_rows(cursor, self.storage.alias, sql, [*params, *rest_params], bound)
            if rows is None:
                # MariaDB stopped it among tasks due later: the names' selects alone, then
                # whether another name's task is due, read by priority ranges.
                rows = rows_of(cursor, " UNION ALL ".join(selects), params)
                table, queues = self.storage._table, pick.queues
                priorities = waiting_priorities(cursor, table, "", queues) or None
                ranged_sql, ranged_params = self.storage._pick_sql(rest, priorities)
                rows += rows_of(cursor, rest_select + ranged_sql + ")", ranged_params)
            for index, task_id, key in rows:
                if index < 0:
                    due.add(None)
                    continue
                due.add(names[int(index)])
                if task_id is not None:
                    self.candidates[names[int(index)]].append((task_id, key))
        for name, known in known_full.items():
            if name not in due and known:
                first = min(known.values())
                self.storage.rate_free_at = min(first, self.storage.rate_free_at or first)
        return due

    def _probe(
        self,
        pick: Pick,
        request: ClaimRequest,
        index: int,
        name: str,
        known_full: dict[str, dict[str, float]],
    ) -> tuple[str, list[Any]]:
        """``due_names``' select of ``name``, row ``index`` of its read: on SQLite, of a name
        far below its limit, the tasks it would take (``candidates``); else one row when a
        task of the name is due, leaving out its keys known full (noted in ``known_full``)."""
        now = pick.now.timestamp()
        due_sql, due_params = self._due_of_name(pick, name, probe=True)
        reserving = (
            self.storage.vendor == "sqlite"
            and name in request.rate_limits
            and name not in request.name_limits
            and name not in request.key_limits
            and self.far_below.get(name, True)
            # fairness: the claim of the name counts what its worker can start (FairRoom)
            and name not in self.storage.flow_limits.fair()
            and not any(t > now for t in self.full_keys(name).values())
        )
        if reserving:
            # Every row a task: its id and key (the name's index names the row).
            chosen, chosen_params = self.storage._pick_sql(dataclasses.replace(pick, name=name))
            self.candidates[name] = []
            return (
                f"SELECT {index}, task_id, log_key FROM (SELECT task_id, {RATE_KEY_SQL} {chosen})",
                chosen_params,
            )
        if name in request.rate_limits:
            known = {k: t for k, t in self.full_keys(name).items() if t > now}
            known_full[name] = known
            if known and len(known) <= MAX_KNOWN_FULL:
                keys_sql, keys_params = other_keys_sql(list(known))
                due_sql += keys_sql
                due_params += keys_params
        # The name's index as a literal: it names the row without a typed parameter.
        one_row = _one_row(self.storage.vendor)
        return f"SELECT {index}, NULL, NULL{one_row} WHERE EXISTS (SELECT 1 {due_sql})", due_params

    def _claim_rated(
        self,
        pick: Pick,
        rate: RateLimit,
        caps: tuple[int | None, int | None],
        *,
        joined: bool = False,
    ) -> Sequence[Claim]:
        """Up to ``pick.limit`` due tasks of ``pick.name`` within its rate limit (and ``caps``:
        its max_concurrency, its max_concurrency_per_key, each None for none),
        serialised on the name's lock row, in a transaction of its own or, ``joined``, in the
        caller's (no savepoint: a failure rolls the caller's back)."""
        assert pick.name is not None
        name, now = pick.name, pick.now
        connection = connections[self.storage.alias]
        quote = connection.ops.quote_name
        with transaction.atomic(using=self.storage.alias, savepoint=not joined):
            with connection.cursor() as cursor:
                self.storage._lock_name(cursor, quote(ReliableNameLock._meta.db_table), name)
                self.trim(cursor, quote(ReliableRateLog._meta.db_table), name, now, rate)
                used = self._window_use(cursor, name, now, rate, pick.limit)
                # SQLite: the next round tries rate_reserve.py first only if this one is
                # far below the limit.
                self.far_below[name] = used is None
                limit = pick.limit
                cap, key_cap = caps
                if cap is not None:
                    limit = min(limit, cap - self.storage._held(cursor, name, now))
                if key_cap is not None and limit > 0:
                    # Only tasks of keys with free slots, chosen (and the others parked) by
                    # key_parking.py; the rate limit then takes those within its room.
                    ids = self.storage._key_parking.choose(cursor, pick, key_cap, limit)
                    pick = dataclasses.replace(pick, ids=ids)
                    limit = len(ids)
                claims, keys, logged = self._take_within(cursor, pick, rate, used, limit)
            stamps = stamp_times(rate, used, keys, now) if claims else {}
            if claims and not logged:
                self._log(name, claims, keys, stamps)
        self.note_free_at(name, used or {}, rate, keys, stamps, now)
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
        whether their log rows are written already (at ``stamp_times``). ``used`` None:
        every key stays at most half full with the whole batch (``_window_use``)."""
        if limit <= 0:
            return [], [], False
        busiest = max((n for n, _ in (used or {}).values()), default=0)
        if used is None or busiest + limit <= rate.count:
            # Every key has room for the whole batch (the limit far above its use): claimed
            # in one statement, as a capped name is, reading the keys with the claims.
            whole = dataclasses.replace(pick, limit=limit)
            leads = used is None or rate.has_room_to_lead(busiest + limit)
            if self.storage.vendor == "postgresql" and leads:
                # Every key's entries are logged ahead (stamp_times): by the same statement.
                lead = pick.now + dt.timedelta(seconds=rate.lead_seconds)
                return (*self.storage._take_logged(whole, lead), True)
            return (*self.storage._take_keyed(whole), False)
        assert used is not None
        full = [key for key, (n, _) in used.items() if n >= rate.count]
        chosen = self._choose(cursor, pick, rate, used, full, limit)
        if not chosen:
            return [], [], False
        claims = self.storage._take(dataclasses.replace(pick, limit=len(chosen), ids=tuple(chosen)))
        return claims, [chosen[claim.task_id] for claim in claims], False

    def _log(
        self, name: str, claims: list[Claim], keys: list[str], stamps: dict[str, dt.datetime]
    ) -> None:
        """The log entries of ``claims`` (of rate keys ``keys``, logged at ``stamps``)."""
        with connections[self.storage.alias].cursor() as cursor:
            insert_entries(self.storage, cursor, name, entry_counts(keys, stamps))

    def _due_of_name(
        self, pick: Pick, name: str | None = None, *, probe: bool = False
    ) -> tuple[str, list[Any]]:
        """The due tasks of ``name`` (default ``pick.name``) in the pick's queues (FROM on).
        ``probe`` (whether one is due): on MariaDB read by (name, available), the name's
        waiting tasks first; left to itself it read the queue's index, whose finished tasks
        of the name come first, and stopped at ROWS EXAMINED after a thousand of them."""
        marks = ", ".join(["%s"] * len(pick.queues))
        hint = " FORCE INDEX (rexec_held_idx)" if probe and self.storage._mariadb else ""
        return (
            f"FROM {self.storage._table}{hint} WHERE available = %s AND task_name = %s "
            f"AND queue IN ({marks}) AND run_at <= %s {self.storage._not_paused_sql.rstrip()}",
            [True, name or pick.name, *pick.queues, self.storage._dt(pick.now)],
        )

    def _window_use(
        self, cursor: Any, name: str, now: dt.datetime, rate: RateLimit, limit: int
    ) -> dict[str, tuple[int, dt.datetime]] | None:
        """Per rate key, the claims of the name in its log's window and the earliest of them;
        None when the window's entries of every key together leave it at most half full with
        ``limit`` claims more (then so does each key: a claim far below its limit counts the
        index range, and reads no keys). Read under the name's lock, which every write of
        the name's log holds (claims, and starts moving entries): the count is exact."""
        table = connections[self.storage.alias].ops.quote_name(ReliableRateLog._meta.db_table)
        cutoff = self.storage._dt(now - dt.timedelta(seconds=rate.log_window_seconds))
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
        return {key: (int(n), aware(oldest)) for key, n, oldest in cursor.fetchall()}

    def trim(self, cursor: Any, table: str, name: str, now: dt.datetime, rate: RateLimit) -> None:
        """Delete the name's entries out of the window, at most once per margin in this
        process: housekeeping only (every count reads the window's range), so a claim does
        not pay a DELETE each time. Each trim reads only the range since the last one (less
        a margin, for entries stamped by a worker whose clock lags), not the index entries
        of every row deleted since the last vacuum (PostgreSQL keeps them until then); once
        a minute it reads the whole range, for any entry left older."""
        trims = self._trims
        margin = dt.timedelta(seconds=rate.margin_seconds)
        window = dt.timedelta(seconds=rate.log_window_seconds)
        last, last_whole = trims.get(name, (None, None))
        if last is not None and dt.timedelta(0) <= now - last < margin:
            return
        sql = f"DELETE FROM {table} WHERE name = %s AND claimed_at <= %s"
        params = [name, self.storage._dt(now - window)]
        if last_whole is not None and dt.timedelta(0) <= now - last_whole < WHOLE_TRIM_EVERY:
            assert last is not None
            sql += " AND claimed_at > %s"
            params.append(self.storage._dt(last - window - margin))
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
            keys_sql, keys_params = other_keys_sql(full)
            due_sql += keys_sql
            params += keys_params
        if pick.ids:  # chosen by key_parking.py (max_concurrency_per_key)
            due_sql += f" AND task_id IN ({', '.join(['%s'] * len(pick.ids))})"
            params += list(pick.ids)
        lock = " FOR UPDATE SKIP LOCKED" if self.storage.vendor != "sqlite" else ""
        cursor.execute(
            f"SELECT task_id, COALESCE(rate_key, '') {due_sql} "
            f"ORDER BY priority DESC, flow_round ASC, run_at ASC LIMIT %s{lock}",
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

    def full_keys(self, name: str) -> dict[str, float]:
        """``{rate key: time.time() its window frees}`` of the keys of ``name`` the last
        claim of it here found full."""
        return self._full.get(name, {})

    def note_free_at(
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
        self._full[name] = full
        if full:
            first = min(full.values())
            self.storage.rate_free_at = min(first, self.storage.rate_free_at or first)
