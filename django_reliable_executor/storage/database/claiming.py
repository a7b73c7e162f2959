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
from ...models import ReliableNameLock, ReliableRateLog
from .claim_ranges import EXAMINED, sort_stopped, stopped, waiting_priorities
from .claim_sql import ClaimSql
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


class Claiming(ClaimSql):
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
