"""The database claim of a name with ``max_concurrency_per_key``: a full key's waiting tasks parked
out of the claim's way, and brought back as the key's slots free.

A claim of such a name runs under the name's lock row, as ``max_concurrency`` does. One read
under the lock returns the held tasks of each key (claimed or running, and timed out with the
handler still running: docs/guarantees.md, "ended"), the name's parked keys, and the first due
tasks of the name's range of the claim index in pickup order. Parked tasks of keys with free
slots come back first; then a task of a key with a free slot is taken, a task of a full key is
parked. Parking moves a task's ``limited_name`` to a range of its own per name, key and queue
(``parked_lane``), which no claim reads, and notes it in ``reliable_executor_parked_key``: a
key's backlog is read once, by the claim that parks it, not by every claim while the key stays
full, and its first tasks are read in index order when its slots free. Other keys and names
are not held up behind it.

The lock and the read go to the server together where it allows (``_locked_read``): on
MariaDB/MySQL as one statement whose first part locks the row, on PostgreSQL (psycopg binding
parameters client-side, Django's default) as two statements in one round trip.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, transaction

from ...core.records import Claim
from ...core.states import TaskStatus
from ...models import ReliableNameLock, ReliableParkedKey
from .claim_statements import ClaimStatements
from .rows import HELD_SQL, LIVE, Pick, chunks

# Most tasks one walk parks, and walks one claim makes: a claim stays short however long a
# key's backlog is (the next claim parks the next ones).
PARK_MAX = 1000
PARK_PASSES = 10
# A parked range's value of ``limited_name``: this prefix, then a digest of the name, key and
# queue (a key may be as long as the column). No registered task name starts with a control
# character in practice; the chores (mark_limited) leave the ranges a parked key names alone.
LANE_PREFIX = "\x1f"
# The statuses of the held tasks, written as literals into the read (as HELD_SQL writes LIVE),
# the timed out with their handler still running among them.
TIMEOUT = TaskStatus.TIMEOUT.value
HELD_STATUSES_SQL = ", ".join(f"'{status}'" for status in [*LIVE, TIMEOUT])


def parked_lane(name: str, key: str, queue: str) -> str:
    """The ``limited_name`` of the parked tasks of ``name`` and ``key`` in ``queue``."""
    digest = hashlib.sha256(f"{name}\x00{key}\x00{queue}".encode()).hexdigest()[:48]
    return LANE_PREFIX + digest


def is_parked_lane(lane: str) -> bool:
    return lane.startswith(LANE_PREFIX)


def _one_round_trip(cursor: Any) -> bool:
    """Does this PostgreSQL cursor send several statements in one execute? psycopg 3 binding
    parameters client-side does (Django's cursor unless OPTIONS server_side_binding), in
    the simple query protocol; server-side binding and psycopg2 (which keeps only the last
    result) are left the two round trips."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(cursor.cursor, psycopg.ClientCursor)


@dataclasses.dataclass(frozen=True)
class _Candidate:
    """A due task of the name's range, as the claim reads it."""

    task_id: str
    key: str | None
    queue: str


@dataclasses.dataclass(frozen=True)
class _Parked:
    """A row of reliable_executor_parked_key: a parked range and its key and queue."""

    lane: str
    key: str
    queue: str


@dataclasses.dataclass
class _State:
    """What a claim reads under the name's lock (``KeyParking._read``)."""

    held: Counter[str | None] = dataclasses.field(default_factory=Counter)
    parked: list[_Parked] = dataclasses.field(default_factory=list)
    candidates: list[_Candidate] = dataclasses.field(default_factory=list)  # pickup order
    locked: bool = False  # read with the name's lock row, found (``_locked_read``)


@dataclasses.dataclass
class _Choice:
    """What one walk of the name's range chose to park, by (key, queue)."""

    parked: dict[tuple[str, str], list[str]] = dataclasses.field(
        default_factory=lambda: defaultdict(list)
    )
    parked_count: int = 0


def _batch(room: int) -> int:
    """How many of the name's due tasks the first read takes, to find ``room`` of free keys."""
    return max(room * 2, 16)


class KeyParking:
    """The per-key claim of one storage object (see the module docstring)."""

    def __init__(self, storage: ClaimStatements, lane_of: Callable[[Pick], str | None]) -> None:
        self.storage = storage
        # Claiming._lane: the range of the claim index a name's tasks wait in when unparked.
        self._lane_of = lane_of

    def claim(
        self, pick: Pick, key_cap: int, name_cap: int | None, *, joined: bool = False
    ) -> list[Claim]:
        """Up to ``pick.limit`` due tasks of ``pick.name``, never more than ``key_cap`` held
        per key nor (``name_cap``) in all, under the name's lock, in a transaction of its
        own or, ``joined``, in the caller's (no savepoint)."""
        storage = self.storage
        assert pick.name is not None
        with transaction.atomic(using=storage.alias, savepoint=not joined):
            with connections[storage.alias].cursor() as cursor:
                state = self._locked_read(cursor, pick, _batch(pick.limit))
                room = pick.limit
                if name_cap is not None:
                    room = min(room, name_cap - sum(state.held.values()))
                if room <= 0:
                    return []
                chosen = self._decide(cursor, pick, key_cap, room, state)
            if not chosen:
                return []
            return storage._take(dataclasses.replace(pick, limit=len(chosen), ids=chosen))

    def choose(self, cursor: Any, pick: Pick, key_cap: int, room: int) -> tuple[str, ...]:
        """Under the name's lock: the ids of up to ``room`` due tasks of ``pick.name`` whose
        keys have free slots, in pickup order, once the parked tasks of keys with free slots
        are back and the tasks passed over (of full keys) parked (the rate limit's claim)."""
        return self._decide(cursor, pick, key_cap, room, self._read(cursor, pick, _batch(room)))

    def _decide(
        self, cursor: Any, pick: Pick, key_cap: int, room: int, state: _State
    ) -> tuple[str, ...]:
        """``choose`` from the state read under the lock. A walk that parked PARK_MAX tasks
        without filling ``room`` walks on (up to PARK_PASSES times): the tasks of other keys
        behind a long new backlog are found by this claim, not by claims a poll apart."""
        assert pick.name is not None
        if self._unpark(cursor, pick, state, key_cap):
            # Back in the name's range, they compete in pickup order: read it again.
            state.candidates = self._candidates(cursor, pick, _batch(room), 0)
        taken: list[str] = []
        counts = Counter(state.held)
        for _ in range(PARK_PASSES):
            choice = self._choose(cursor, pick, state.candidates, counts, key_cap, room, taken)
            self._park(cursor, pick.name, choice.parked)
            if choice.parked_count < PARK_MAX or len(taken) >= room:
                break
            state.candidates = self._candidates(cursor, pick, _batch(room), 0)
        return tuple(taken)

    def _locked_read(self, cursor: Any, pick: Pick, batch: int) -> _State:
        """The name's lock row taken (``_lock_name``), then ``_read``, in one round trip where
        the database allows. MariaDB/MySQL: one statement, whose first part locks the row
        (FOR UPDATE); InnoDB opens a statement's read view at its first consistent read,
        after that, so the read sees every claim committed before the lock was granted
        (under READ COMMITTED, the default, as under REPEATABLE READ, where the lock is the
        transaction's first read). PostgreSQL: two statements sent together, each reading a
        snapshot of its own, the read's taken once the lock is granted. A name's first claim
        (no row yet to lock) creates the row and reads again; SQLite takes its write lock."""
        storage = self.storage
        assert pick.name is not None
        lock_table = connections[storage.alias].ops.quote_name(ReliableNameLock._meta.db_table)
        vendor = storage.vendor
        if vendor == "mysql" or (vendor == "postgresql" and _one_round_trip(cursor)):
            state = self._read(cursor, pick, batch, lock_table)
            if state.locked:
                return state
        storage._lock_name(cursor, lock_table, pick.name)
        return self._read(cursor, pick, batch)

    def _read(self, cursor: Any, pick: Pick, batch: int, lock_table: str | None = None) -> _State:
        """One read under the lock: the held tasks of the name by key (None: those without a
        key), its parked ranges, and its first ``batch`` due tasks, in pickup order; with
        ``lock_table``, taking the name's row of it first (``_locked_read``)."""
        storage = self.storage
        quote = connections[storage.alias].ops.quote_name
        parked_table = quote(ReliableParkedKey._meta.db_table)
        pick_sql, pick_params = storage._pick_sql(dataclasses.replace(pick, limit=batch))
        name, now = pick.name, storage._dt(pick.now)
        assert name is not None
        held_sql, held_params = self._held_sql(name, now)
        sql = (
            f"{held_sql} UNION ALL SELECT 1, {quote('key')}, lane, queue, NULL "
            f"FROM {parked_table} WHERE name = %s "
            "UNION ALL SELECT 2, concurrency_key, task_id, queue, "
            "ROW_NUMBER() OVER (ORDER BY priority DESC, flow_round ASC, run_at ASC) FROM "
            "(SELECT task_id, concurrency_key, queue, priority, flow_round, run_at "
            f"{pick_sql}) AS c"
        )
        params = [*held_params, name, *pick_params]
        state = _State()
        if lock_table is not None:
            lock_sql = f"FROM {lock_table} WHERE {quote('name')} = %s FOR UPDATE"
            if storage.vendor == "postgresql":
                cursor.execute(f"SELECT 1 {lock_sql}; {sql}", [name, *params])
                state.locked = bool(cursor.fetchall())
                cursor.nextset()
            else:
                # The locking part first: it is optimised and run before the others.
                sql = f"(SELECT 3, NULL, NULL, NULL, NULL {lock_sql}) UNION ALL {sql}"
                cursor.execute(sql, [name, *params])
        else:
            cursor.execute(sql, params)
        ordered: list[tuple[int, _Candidate]] = []
        for kind, key, text, queue, number in cursor.fetchall():
            if kind == 0:
                state.held[key] += int(number)
            elif kind == 1:
                state.parked.append(_Parked(str(text), str(key), str(queue)))
            elif kind == 2:
                ordered.append((int(number), _Candidate(str(text), key, str(queue))))
            else:
                state.locked = True
        state.candidates = [candidate for _, candidate in sorted(ordered, key=lambda o: o[0])]
        return state

    def _held_sql(self, name: str, now: Any) -> tuple[str, list[Any]]:
        """``_read``'s rows of the held tasks of ``name`` by key: claimed or running, and timed
        out with the handler still running (docs/guarantees.md, "ended")."""
        table = self.storage._table
        count = "SELECT 0, concurrency_key, NULL, NULL, COUNT(*)"
        if self.storage.vendor == "postgresql":
            # The held statuses by the partial index of migration 0006 (its condition is
            # HELD_SQL's), the timed out by (task_name, status): one index each, where both
            # in one condition was planned as a scan of the name's tasks (2.2 ms against 0.3).
            return (
                f"{count} FROM {table} WHERE task_name = %s AND {HELD_SQL} "
                f"GROUP BY concurrency_key UNION ALL {count} FROM {table} WHERE task_name = %s "
                "AND status = %s AND available = %s AND lease_expires_at > %s "
                "GROUP BY concurrency_key",
                [name, name, TIMEOUT, False, now],
            )
        # One range of rexec_held_idx (task_name, available, status). With ``NOT available``
        # SQLite read the name's waiting tasks by (task_name, status) instead (0.5 ms with
        # 4 000 waiting, against 0.03); MariaDB, left to choose, weighed every index of the
        # table first, and read the timed out tasks of every name by status.
        hint = " FORCE INDEX (rexec_held_idx)" if self.storage.vendor == "mysql" else ""
        return (
            f"{count} FROM {table}{hint} WHERE task_name = %s AND available = %s "
            f"AND status IN ({HELD_STATUSES_SQL}) AND (status <> '{TIMEOUT}' AND waiting_for "
            f"IS NULL OR status = '{TIMEOUT}' AND lease_expires_at > %s) GROUP BY concurrency_key",
            [name, False, now],
        )

    def _candidates(self, cursor: Any, pick: Pick, batch: int, offset: int) -> list[_Candidate]:
        """The due tasks of the pick, in pickup order, ``batch`` of them after ``offset``."""
        sql, params = self.storage._pick_sql(dataclasses.replace(pick, limit=batch))
        cursor.execute(f"SELECT task_id, concurrency_key, queue {sql} OFFSET %s", [*params, offset])
        return [_Candidate(str(task_id), key, str(q)) for task_id, key, q in cursor.fetchall()]

    def _unpark(self, cursor: Any, pick: Pick, state: _State, cap: int) -> bool:
        """Bring back into the name's range up to its free slots of each parked key with free
        slots, first in pickup order; forget the ranges left empty. Whether any came back."""
        free = {p.key: cap - state.held[p.key] for p in state.parked if state.held[p.key] < cap}
        lanes = [p for p in state.parked if p.key in free]
        if not lanes:
            return False
        found = self._first_parked(cursor, [(p.lane, p.queue, free[p.key]) for p in lanes])
        by_key: dict[str, list[tuple[int, int, Any, str, str]]] = defaultdict(list)
        key_of = {p.lane: p.key for p in lanes}
        for task_id, lane, priority, flow_round, run_at in found:
            by_key[key_of[lane]].append((-priority, flow_round, run_at, task_id, lane))
        moved: list[str] = []
        left = Counter(lane for _, lane, _, _, _ in found)  # found per lane, less those moved
        for key, tasks in by_key.items():
            for _, _, _, task_id, lane in sorted(tasks)[: free[key]]:
                moved.append(task_id)
                left[lane] -= 1
        back = self._lane_of(dataclasses.replace(pick, ids=()))
        self._set_lane(cursor, moved, "" if back is None else back)
        asked = {p.lane: free[p.key] for p in lanes}
        fetched = Counter(lane for _, lane, _, _, _ in found)
        # A range read through (fewer found than asked) and all of it moved is empty now.
        emptied = [lane for lane in asked if fetched[lane] < asked[lane] and not left[lane]]
        if emptied:
            ReliableParkedKey.objects.using(self.storage.alias).filter(lane__in=emptied).delete()
        return bool(moved)

    def _first_parked(
        self, cursor: Any, wanted: list[tuple[str, str, int]]
    ) -> list[tuple[str, str, int, int, Any]]:
        """(task id, lane, priority, flow round, run at) of the first ``n`` waiting tasks of
        each parked range ``(lane, queue, n)`` of ``wanted``, in the claim index's order (one
        queue per range: no sort), a hundred ranges a read (a derived table each: SQLite takes
        no parenthesised UNION member)."""
        table = self.storage._table
        select = (
            "SELECT * FROM (SELECT task_id, limited_name, priority, flow_round, run_at "
            f"FROM {table} WHERE available = %s AND limited_name = %s AND queue = %s "
            "ORDER BY priority DESC, flow_round ASC, run_at ASC LIMIT %s) AS p"
        )
        found: list[tuple[str, str, int, int, Any]] = []
        for lanes in chunks(wanted, 100):
            params = [v for lane, queue, n in lanes for v in (True, lane, queue, n)]
            cursor.execute(" UNION ALL ".join([select] * len(lanes)), params)
            found += [
                (str(t), str(lane), int(p), int(r), at) for t, lane, p, r, at in cursor.fetchall()
            ]
        return found

    def _choose(
        self,
        cursor: Any,
        pick: Pick,
        candidates: list[_Candidate],
        counts: Counter[str | None],
        cap: int,
        room: int,
        taken: list[str],
    ) -> _Choice:
        """Walk the name's range in pickup order (``candidates``, then reads four times longer
        each, so a long walk reads each entry a bounded number of times), adding to ``taken``
        up to ``room`` tasks of keys with a free slot (and without a key; ``counts``: held
        and taken by key), choosing the tasks of full keys to park, until ``room`` are
        taken, the range is read through or PARK_MAX are to be parked."""
        choice = _Choice()
        seen = set(taken)
        rows, batch, offset = candidates, _batch(room), 0
        while True:
            for row in rows:
                if row.task_id in seen:
                    continue
                seen.add(row.task_id)
                if row.key is None or counts[row.key] < cap:
                    counts[row.key] += row.key is not None
                    taken.append(row.task_id)
                    if len(taken) >= room:
                        return choice
                else:
                    choice.parked[(row.key, row.queue)].append(row.task_id)
                    choice.parked_count += 1
            if len(rows) < batch or choice.parked_count >= PARK_MAX:
                return choice  # read through, or enough parked for one pass
            offset += batch
            batch *= 4
            rows = self._candidates(cursor, pick, batch, offset)

    def _park(self, cursor: Any, name: str, parked: dict[tuple[str, str], list[str]]) -> None:
        """Move these tasks to their keys' parked ranges, and note the ranges."""
        if not parked:
            return
        for (key, queue), ids in parked.items():
            self._set_lane(cursor, ids, parked_lane(name, key, queue))
        ReliableParkedKey.objects.using(self.storage.alias).bulk_create(
            [
                ReliableParkedKey(
                    lane=parked_lane(name, key, queue), name=name, key=key, queue=queue
                )
                for key, queue in parked
            ],
            ignore_conflicts=True,
        )

    def _set_lane(self, cursor: Any, ids: Sequence[str], lane: str) -> None:
        """``limited_name = lane`` on these waiting tasks."""
        for chunk in chunks(ids):
            marks = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"UPDATE {self.storage._table} SET limited_name = %s "
                f"WHERE task_id IN ({marks}) AND available = %s",
                [lane, *chunk, True],
            )
