"""Claiming due tasks from the database storage without two workers ever taking one row."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import time
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import F

from ...core.fairness import FairRoom
from ...core.queries import ClaimRequest
from ...core.records import Claim, copy_with
from ...core.states import TaskStatus
from ...models import ReliableNameLock, ReliablePausedQueue, ReliableRateLog
from .access import DatabaseAccess
from .claim_ranges import EXAMINED, sort_stopped, stopped, waiting_priorities
from .key_parking import KeyParking
from .rate_log import RateLog
from .rate_reserve import claim_reserving
from .rows import (
    CLAIM_COLUMNS_SQL,
    CLAIM_FIELDS,
    HELD_SQL,
    RATE_KEY_SQL,
    Pick,
    claim_from_row,
)

# PostgreSQL: a claim commits without waiting for its WAL flush (synchronous_commit off for
# this transaction alone), which saves a disk flush per claim round. Safe: a claim lost in a
# server crash only frees the task again, and nothing follows from a claim before its start,
# whose own (synchronous) commit flushes the WAL up to and past the claim's; a start after a
# lost claim fails its token check. The one-row CTE runs before the first row is claimed.
ASYNC_COMMIT_CTE = (
    "relaxed AS MATERIALIZED "
    "(SELECT set_config('synchronous_commit', 'off', true) AS relaxed_commit)"
)


class Claiming(DatabaseAccess):
    """claim: SKIP LOCKED batches, or one UPDATE ... RETURNING on SQLite.

    With ``name_limits``, the tasks of each capped name are claimed first, each name in its
    own short transaction that locks the name's row of ``reliable_executor_name_lock`` (FOR
    UPDATE; on SQLite a write, which takes the database's write lock), counts the held tasks
    of the name and claims at most the free slots: two workers never count the same free
    slot. The rest of the batch is claimed as before with the capped names left out, so a
    capped name never holds up the others. On SQLite, a round with rate-limited names due
    runs whole in one write transaction (see ``_claim``).

    The rate-limited names are claimed by the storage's RateLog (rate_log.py; on SQLite, the
    names far below their limits by rate_reserve.py), which takes the tasks with the
    statements here.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Made here, not on first use: the worker's threads share the storage object.
        self._rate_log = RateLog(self)
        self._key_parking = KeyParking(self, self._lane)

    def _claim(self, request: ClaimRequest) -> list[Claim]:
        now = self.clock.now()
        whole = Pick(
            request.worker_id,
            request.queues,
            request.limit,
            now,
            now + dt.timedelta(seconds=request.lease_seconds),
        )
        self.rate_free_at = None
        # fairness="round_robin" without a limit: a name claimed on its own too, from its
        # range of the claim index, in round order (core/fairness.py).
        fair = self._fair_only(request)
        probed = request.rate_limits or request.name_limits or request.key_limits or fair
        # The names with tasks due, None standing for every other name (not probed: no
        # limited name, so only the others, claimed in one statement).
        due: set[str | None] = self._rate_log.due_names(whole, request, fair) if probed else {None}
        parts: list[Sequence[Claim]] = []
        if self.vendor == "sqlite" and due & request.rate_limits.keys():
            # SQLite: the rate-limited names far below their limits first, each without a
            # transaction (rate_reserve.claim_reserving).
            parts, due = claim_reserving(self._rate_log, request, whole, due)
            request = dataclasses.replace(request, limit=request.limit - sum(map(len, parts)))
        if request.limit > 0 and self.vendor == "sqlite" and due & request.rate_limits.keys():
            # SQLite, a rate-limited name left: the rest of the round is one write
            # transaction (one BEGIN IMMEDIATE, one commit, the write lock taken once) rather
            # than one per name and a statement of its own for the rest: every other write of
            # the worker (its starts, its completions) waits for that lock meanwhile. The
            # read that finds which names have tasks due goes first, outside it.
            with transaction.atomic(using=self.alias):
                parts += self._claim_names(request, whole, due, joined=True)
        elif request.limit > 0:
            parts += self._claim_names(request, whole, due)
        claims = [claim for part in parts for claim in part]
        if claims:
            claims.sort(key=lambda c: (-c.task.priority, c.task.run_at))
            self._wakeups.found_at = time.monotonic()  # idle waits grow from here (polling)
        return claims

    def _claim_names(
        self,
        request: ClaimRequest,
        whole: Pick,
        due: set[str | None],
        *,
        joined: bool = False,
    ) -> list[Sequence[Claim]]:
        """The claims of a round, a sequence per statement: the rate-limited and capped names
        ``RateLog.due_names`` found due, then, when it found them due (None), the rest in one
        statement; ``joined``: all in the caller's transaction."""
        fair_room = FairRoom(request.fair_limit, frozenset(self.flow_limits.fair()))
        parts = self._rate_log.claim_rate_limited(request, whole, due, fair_room, joined=joined)
        taken = sum(map(len, parts))
        capped = dict.fromkeys([*request.name_limits, *request.key_limits])
        fair = self._fair_only(request)
        for name in [*capped, *fair]:
            if request.limit - taken <= 0:
                break
            room = fair_room.of(name, request.limit - taken)
            if room <= 0 or name in request.rate_limits or name not in due:
                continue  # no thread free for it; claimed by claim_rate_limited; none due
            pick = dataclasses.replace(whole, limit=room, name=name)
            cap = request.name_limits.get(name)
            if name in fair:
                claim = functools.partial(self._take, pick)
            elif name in request.key_limits:
                keyed = self._key_parking.claim
                claim = functools.partial(keyed, pick, request.key_limits[name], cap, joined=joined)
            else:
                assert cap is not None
                claim = functools.partial(self._claim_capped, pick, cap, joined=joined)
            parts.append(self._retrying(claim))
            taken += len(parts[-1])
            fair_room.took(name, len(parts[-1]))
        left = request.limit - taken
        if left > 0 and None in due:
            excluded = tuple(dict.fromkeys([*capped, *fair, *request.rate_limits]))
            pick = dataclasses.replace(whole, limit=left, excluded=excluded)
            parts.append(self._retrying(functools.partial(self._take, pick)))
        return parts

    def _fair_only(self, request: ClaimRequest) -> list[str]:
        """The names with fairness and no limit in ``request``, sorted: each is claimed from
        its own range of the claim index (the limited names' claims order theirs by round
        already)."""
        limited = {*request.name_limits, *request.key_limits, *request.rate_limits}
        return sorted(name for name in self.flow_limits.fair() if name not in limited)

    def _take(self, pick: Pick) -> list[Claim]:
        """Claim what ``pick`` chooses, the way this database does it best."""
        return self._take_rows(pick)[0]

    def _take_keyed(self, pick: Pick) -> tuple[list[Claim], list[str]]:
        """``_take``, with the rate key of each claim ("" for none) read in the same statement."""
        claims, keys = self._take_rows(pick, f", {RATE_KEY_SQL}")
        return claims, [str(key) for (key,) in keys]

    def _take_rows(
        self, pick: Pick, extra_columns: str = ""
    ) -> tuple[list[Claim], list[tuple[Any, ...]]]:
        """The claims, and per claim the values of ``extra_columns`` (SQL after the claim's
        columns, starting with a comma)."""
        if self.vendor in ("sqlite", "postgresql"):
            rows = self._claim_returning(pick, extra_columns)
        else:
            rows = self._claim_skip_locked(pick, extra_columns)
        width = len(CLAIM_FIELDS)
        return [claim for claim, _ in rows], [tuple(extra[width:]) for _, extra in rows]

    def _take_logged(self, pick: Pick, logged_at: dt.datetime) -> tuple[list[Claim], list[str]]:
        """PostgreSQL: ``_take_keyed`` that writes the claims' rate log rows (one per key, at
        ``logged_at``) in the same statement, a data-modifying CTE over the claimed rows: no
        second round trip, and no row values passed from here."""
        assert self.vendor == "postgresql" and pick.name is not None
        log_table = connections[self.alias].ops.quote_name(ReliableRateLog._meta.db_table)
        ctes, update, params = self._claim_update_sql(pick, f"{CLAIM_COLUMNS_SQL}, {RATE_KEY_SQL}")
        sql = (
            f"WITH {ctes}, claimed AS ({update}), logged AS ("
            f"INSERT INTO {log_table} (name, rate_key, claims, claimed_at) "
            "SELECT %s, log_key, COUNT(*), %s FROM claimed GROUP BY log_key) "
            f"SELECT {CLAIM_COLUMNS_SQL}, log_key FROM claimed"
        )
        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql, [*params, pick.name, self._dt(logged_at)])
            rows = cursor.fetchall()
        width = len(CLAIM_FIELDS)
        return [claim_from_row(row[:width]) for row in rows], [str(row[width]) for row in rows]

    def _lane(self, pick: Pick) -> str | None:
        """The claim index's range (``limited_name``) the pick reads, or None: the name's tasks
        wherever they are."""
        if pick.name is None:
            return ""
        if pick.name in self.flow_limits.names():
            # A limited name's claim reads its own range of the claim index. (Its tasks stored
            # without it, by a process that did not know the limits, wait for the master's
            # chores to move them there: mark_limited.)
            return pick.name
        # Limits the registry does not know (given to claim() directly): the name's tasks
        # wherever they are, found by name.
        return None

    def _pick_sql(
        self,
        pick: Pick,
        priorities: Sequence[int] | None = None,
        examined: int | None = None,
    ) -> tuple[str, list[Any]]:
        """The due, unclaimed rows the pick chooses, in pickup order (served by the claim
        index); only of ``priorities`` (each one range of the index: see claim_ranges.py),
        the read stopped after ``examined`` index entries (MariaDB)."""
        marks = ", ".join(["%s"] * len(pick.queues))
        names_sql, names = "", []
        lane_sql, lane = "", list[Any]()
        lane_value, hint = self._lane(pick), ""
        if lane_value is not None:
            lane_sql, lane, hint = "AND limited_name = %s ", [lane_value], self._claim_index
        elif pick.name is not None:
            # A name's tasks wherever they wait, but parked (key_parking.py): in its own range,
            # or not marked yet.
            lane_sql, lane = "AND limited_name IN (%s, %s) ", ["", pick.name]
        if priorities:
            lane_sql += f"AND priority IN ({', '.join(['%s'] * len(priorities))}) "
            lane += list(priorities)
        if pick.name is not None:
            names_sql, names = "AND task_name = %s ", [pick.name]
        else:
            # The claim of all other names: the limited names' waiting tasks are out of its
            # range of the index, and those stored without their name are left out by name.
            if pick.excluded:
                names_sql = f"AND task_name NOT IN ({', '.join(['%s'] * len(pick.excluded))}) "
                names = list(pick.excluded)
        if pick.ids:
            names_sql += f"AND task_id IN ({', '.join(['%s'] * len(pick.ids))}) "
            names += list(pick.ids)
        sql = (
            f"FROM {self._table}{hint} WHERE available = %s {lane_sql}"
            f"AND queue IN ({marks}) "
            f"AND run_at <= %s {names_sql}{self._not_paused_sql}"
            "ORDER BY priority DESC, flow_round ASC, run_at ASC LIMIT %s"
        )
        params = [True, *lane, *pick.queues, self._dt(pick.now), *names, pick.limit]
        if examined is not None:
            sql += " ROWS EXAMINED %s"
            params.append(examined)
        return sql, params

    @functools.cached_property
    def _mariadb(self) -> bool:
        """MariaDB, not MySQL: ROWS EXAMINED (claim_ranges.py) is MariaDB's alone."""
        connection: Any = connections[self.alias]  # a MySQL backend's wrapper knows which
        return self.vendor == "mysql" and bool(connection.mysql_is_mariadb)

    @functools.cached_property
    def _claim_index(self) -> str:
        """MariaDB: a lane's read goes by the claim index, whose order is the pickup order.
        Left to itself, it read an EXISTS of due_names by the queue's index, through the
        finished tasks, and its read stopped at ROWS EXAMINED (claim_ranges.py) with nothing
        due later."""
        return " FORCE INDEX (rexec_claim_idx)" if self._mariadb else ""

    @functools.cached_property
    def _not_paused_sql(self) -> str:
        """Leaves out the paused queues (executor.pause_queue), read in the claiming statement
        itself: a pause holds from the next claim of every worker, and the small table's
        subquery is read once per statement. No database locks its rows for the claim's FOR
        UPDATE (PostgreSQL and MariaDB lock only the rows of the outer FROM)."""
        paused = connections[self.alias].ops.quote_name(ReliablePausedQueue._meta.db_table)
        return f"AND queue NOT IN (SELECT queue FROM {paused}) "

    def _claim_capped(self, pick: Pick, cap: int, *, joined: bool = False) -> list[Claim]:
        """Up to ``pick.limit`` due tasks of ``pick.name`` (which ``RateLog.due_names`` found due),
        never more than its free slots, serialised on the name's lock row, in a transaction of
        its own or, ``joined``, in the caller's (no savepoint: a failure rolls the caller's
        back)."""
        assert pick.name is not None
        name, now = pick.name, pick.now
        connection = connections[self.alias]
        quote = connection.ops.quote_name
        table = quote(ReliableNameLock._meta.db_table)
        with transaction.atomic(using=self.alias, savepoint=not joined):
            with connection.cursor() as cursor:
                self._lock_name(cursor, table, name)
                held = self._held(cursor, name, now)
            free = min(cap - held, pick.limit)
            if free <= 0:
                return []
            return self._take(dataclasses.replace(pick, limit=free))

    def _held(self, cursor: Any, name: str, now: dt.datetime) -> int:
        """How many tasks of ``name`` are held: claimed or running, and timed out with the
        handler still running (its holder keeps the lease while it runs, see expire_overdue).
        Called under the name's lock."""
        cursor.execute(
            f"SELECT (SELECT COUNT(*) FROM {self._table} WHERE task_name = %s "
            f"AND {HELD_SQL}) + (SELECT COUNT(*) FROM {self._table} WHERE "
            "task_name = %s AND status = %s AND available = %s AND lease_expires_at > %s)",
            [name, name, TaskStatus.TIMEOUT.value, False, self._dt(now)],
        )
        (held,) = cursor.fetchone()
        return int(held)

    def _claim_update_sql(self, pick: Pick, returning: str) -> tuple[str, str, list[Any]]:
        """The claiming UPDATE ... RETURNING ``returning``: (the common table expressions it
        reads, "" on SQLite; the UPDATE; the parameters of both, in that order).

        On PostgreSQL the chosen rows are a MATERIALIZED CTE, read once. Inside ``IN (...)``
        the LIMIT did not bind: the planner may run that subquery again for each row it
        joins (a nested-loop semi-join, chosen once the table's statistics say so), and each
        run skips the rows this statement has already claimed (SKIP LOCKED, and a row this
        command updated is not locked again) so it returns the next ones: one claim for 1
        took every due task (tests/contract/test_claim_limit.py; the chaos soak's max_concurrency
        excess on PostgreSQL)."""
        postgresql = self.vendor == "postgresql"
        chosen, chosen_params = self._pick_sql(pick)
        # available is re-checked outside too: a row may change between pick and lock. On
        # SQLite as ``+available``, which no index serves: else its planner walked the claim
        # index over every waiting task (a held backlog included) to match the few chosen,
        # instead of looking them up by key (4.6 ms against 0.13 with 20 000 waiting).
        # (SQLite runs an uncorrelated IN subquery once, into a temporary index.)
        # A durable wait's fields go with the claim: the task is resumed now (a wait_for
        # whose timeout passed keeps waiting_for, which would make it look unheld).
        set_claimed = (
            f"UPDATE {self._table} SET available = %s, worker_id = %s, "
            "lease_token = lease_token + 1, lease_expires_at = %s, "
            "waiting = NULL, waiting_for = NULL "
        )
        claimed = [False, pick.worker_id, self._dt(pick.lease_until)]
        if postgresql:
            ctes = (
                f"{ASYNC_COMMIT_CTE}, chosen AS MATERIALIZED "
                f"(SELECT task_id AS chosen_id {chosen} FOR UPDATE SKIP LOCKED)"
            )
            update = (
                f"{set_claimed}FROM relaxed, chosen WHERE task_id = chosen_id "
                f"AND available = %s RETURNING {returning}"
            )
            return ctes, update, [*chosen_params, *claimed, True]
        update = (
            f"{set_claimed}WHERE task_id IN (SELECT task_id {chosen}) AND +available = %s "
            f"RETURNING {returning}"
        )
        return "", update, [*claimed, *chosen_params, True]

    def _claim_returning(self, pick: Pick, extra_columns: str) -> list[tuple[Claim, Any]]:
        """One statement: safe on SQLite (writers serialise) and PostgreSQL (SKIP LOCKED)."""
        ctes, sql, params = self._claim_update_sql(pick, f"{CLAIM_COLUMNS_SQL}{extra_columns}")
        if ctes:
            sql = f"WITH {ctes} {sql}"
        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql, params)
            width = len(CLAIM_FIELDS)
            return [(claim_from_row(row[:width]), row) for row in cursor.fetchall()]

    def _claim_skip_locked(self, pick: Pick, extra_columns: str) -> list[tuple[Claim, Any]]:
        """MariaDB/MySQL have no UPDATE ... RETURNING: lock a batch (reading it whole), then
        mark it by primary key, in one short transaction."""
        lane = self._lane(pick)
        # Inside a rate-limited claim's transaction: joined, no savepoint (two round trips
        # less per claim; a failure rolls the whole claim back anyway).
        with transaction.atomic(using=self.alias, savepoint=False):
            with connections[self.alias].cursor() as cursor:
                rows, short = self._lock_bounded(cursor, pick, extra_columns, lane)
                if short:
                    # Stopped among tasks due later (claim_ranges.py): by priority ranges, or
                    # unbounded past MAX_PRIORITIES (None).
                    assert lane is not None
                    priorities = waiting_priorities(cursor, self._table, lane, pick.queues)
                    if priorities != []:
                        more = self._lock_chosen(cursor, pick, extra_columns, priorities)
                        seen = {row[0] for row in rows}
                        rows += [row for row in more if row[0] not in seen]
                        rows = rows[: pick.limit]
            if not rows:
                return []
            ids = [row[0] for row in rows]
            self._tasks().filter(pk__in=ids).update(
                available=False,
                worker_id=pick.worker_id,
                lease_token=F("lease_token") + 1,
                lease_expires_at=pick.lease_until,
                waiting=None,  # resumed now (see _claim_update_sql)
                waiting_for=None,
            )
        width = len(CLAIM_FIELDS)
        claims = [claim_from_row(row[:width]) for row in rows]
        # The rows were read before the UPDATE: give them the values it wrote.
        return [
            (
                copy_with(
                    claim,
                    token=claim.token + 1,
                    task=copy_with(claim.task, worker_id=pick.worker_id),
                ),
                row,
            )
            for claim, row in zip(claims, rows, strict=True)
        ]

    def _lock_bounded(
        self, cursor: Any, pick: Pick, extra_columns: str, lane: str | None
    ) -> tuple[list[Any], bool]:
        """``_lock_chosen``, on MariaDB stopped after EXAMINED index entries where the claim
        index's order is the pickup order (a lane, one queue): the rows, and whether the read
        was stopped short of the pick's limit."""
        if lane is None or len(pick.queues) != 1 or not self._mariadb:
            return self._lock_chosen(cursor, pick, extra_columns), False
        try:
            rows = self._lock_chosen(cursor, pick, extra_columns, examined=EXAMINED)
        except DatabaseError as exc:
            if not sort_stopped(exc):  # a plan that sorts: stopped with an error instead
                raise
            return [], True
        return rows, len(rows) < pick.limit and stopped(self.alias)

    def _lock_chosen(
        self,
        cursor: Any,
        pick: Pick,
        extra_columns: str,
        priorities: Sequence[int] | None = None,
        examined: int | None = None,
    ) -> list[Any]:
        """MariaDB: lock and read the rows the pick chooses (see ``_pick_sql``)."""
        chosen, params = self._pick_sql(pick, priorities, examined)
        cursor.execute(
            f"SELECT {CLAIM_COLUMNS_SQL}{extra_columns} {chosen} FOR UPDATE SKIP LOCKED", params
        )
        return list(cursor.fetchall())

    def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until a commit of new work in ``queues`` may have happened (a NOTIFY on
        PostgreSQL, the marker file on SQLite; after a short wait that grows with idleness on
        MariaDB), ``wake`` is called, or ``timeout`` passes. True when woken early."""
        return self._wakeups.wait(queues, self._rate_timeout(timeout, self.clock.now().timestamp()))

    def _rate_timeout(self, timeout: float, now: float) -> float:
        """rate_limit (rate_log.py): ``timeout`` shortened to end when a window that held a
        task back in the last claim frees."""
        free_at = self.rate_free_at
        if free_at is None:
            return timeout
        return max(0.001, min(timeout, free_at - now))

    def wake(self, queues: Sequence[str]) -> None:
        # Local: every waiting thread of this process looks again (stop, a freed slot).
        self._wakeups.wake()

    def stop_waiting(self) -> None:
        self._wakeups.stop_waiting()
