"""The database claim of a name with ``max_concurrency_per_key``: a full key's waiting tasks parked
out of the claim's way, and brought back as the key's slots free.

A claim of such a name runs under the name's lock row, as ``max_concurrency`` does. It counts
the held tasks of each key (claimed or running, and timed out with the handler still running:
docs/guarantees.md, "ended"), brings parked tasks of the keys with free slots back, then reads
the name's range of the claim index in pickup order: a task of a key with a free slot is
taken, a task of a full key is parked. Parking moves a task's ``limited_name`` to its key's own
range (``parked_lane``), which no claim reads, and notes the key in
``reliable_executor_parked_key``: a key's backlog is read once, by the claim that parks it,
not by every claim while the key stays full. Other keys and names are not held up behind it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, transaction

from ...core.records import Claim
from ...core.states import TaskStatus
from ...models import ReliableNameLock, ReliableParkedKey
from .rate_log import ClaimStatements
from .rows import HELD_SQL, Pick, chunks

# Most tasks one claim parks: a claim stays short however long a key's backlog is (the next
# claim parks the next ones).
PARK_MAX = 1000
# A parked range's value of ``limited_name``: this prefix, then a digest of the name and key
# (a key may be as long as the column). No registered task name starts with a control
# character in practice, and the chores (mark_limited) leave these ranges to this module.
LANE_PREFIX = "\x1f"


def parked_lane(name: str, key: str) -> str:
    """The ``limited_name`` of the parked tasks of ``name`` and ``key``."""
    digest = hashlib.sha256(f"{name}\x00{key}".encode()).hexdigest()[:48]
    return LANE_PREFIX + digest


def is_parked_lane(lane: str) -> bool:
    return lane.startswith(LANE_PREFIX)


@dataclasses.dataclass
class _State:
    """What a claim reads under the name's lock (``KeyParking._read``)."""

    held: Counter[str | None] = dataclasses.field(default_factory=Counter)
    parked: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (lane, key)
    # (task id, key) of the first due tasks of the name's range, in pickup order
    candidates: list[tuple[str, str | None]] = dataclasses.field(default_factory=list)


def _batch(room: int) -> int:
    """How many of the name's due tasks a read takes, to find ``room`` of free keys."""
    return max(room * 2, 16)


@dataclasses.dataclass
class _Choice:
    """What one claim's read of the name's range decided: the tasks to take, and the tasks to
    park by key."""

    taken: list[str] = dataclasses.field(default_factory=list)
    parked: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def parked_count(self) -> int:
        return sum(map(len, self.parked.values()))


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
        connection = connections[storage.alias]
        lock_table = connection.ops.quote_name(ReliableNameLock._meta.db_table)
        with transaction.atomic(using=storage.alias, savepoint=not joined):
            with connection.cursor() as cursor:
                storage._lock_name(cursor, lock_table, pick.name)
                state = self._read(cursor, pick, _batch(pick.limit))
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
        """``choose`` from the state read under the lock."""
        assert pick.name is not None
        if self._unpark(cursor, pick, state, key_cap):
            # Back in the name's range, they compete in pickup order: read it again.
            state.candidates = self._candidates(cursor, pick, _batch(room), 0)
        choice = self._choose(cursor, pick, state, key_cap, room)
        self._park(cursor, pick.name, choice.parked)
        return tuple(choice.taken)

    def _read(self, cursor: Any, pick: Pick, batch: int) -> _State:
        """One read under the lock: the held tasks of the name by key (None: those without a
        key: claimed or running, or timed out with the handler still running), its parked
        keys, and the first ``batch`` due tasks of its range, in pickup order."""
        storage = self.storage
        quote = connections[storage.alias].ops.quote_name
        table, parked_table = storage._table, quote(ReliableParkedKey._meta.db_table)
        pick_sql, pick_params = storage._pick_sql(dataclasses.replace(pick, limit=batch))
        sql = (
            f"SELECT 0, concurrency_key, NULL, COUNT(*) FROM {table} WHERE task_name = %s AND "
            f"{HELD_SQL} GROUP BY concurrency_key "
            f"UNION ALL SELECT 0, concurrency_key, NULL, COUNT(*) FROM {table} "
            "WHERE task_name = %s AND status = %s AND available = %s AND lease_expires_at > %s "
            "GROUP BY concurrency_key "
            f"UNION ALL SELECT 1, {quote('key')}, lane, NULL FROM {parked_table} WHERE name = %s "
            "UNION ALL SELECT 2, concurrency_key, task_id, "
            "ROW_NUMBER() OVER (ORDER BY priority DESC, run_at ASC) FROM "
            f"(SELECT task_id, concurrency_key, priority, run_at {pick_sql}) AS c"
        )
        name, now = pick.name, storage._dt(pick.now)
        params = [name, name, TaskStatus.TIMEOUT.value, False, now, name, *pick_params]
        cursor.execute(sql, params)
        state = _State()
        ordered: list[tuple[int, str, str | None]] = []
        for kind, key, text, number in cursor.fetchall():
            if kind == 0:
                state.held[key] += int(number)
            elif kind == 1:
                state.parked.append((str(text), str(key)))
            else:
                ordered.append((int(number), str(text), key))
        state.candidates = [(task_id, key) for _, task_id, key in sorted(ordered)]
        return state

    def _unpark(self, cursor: Any, pick: Pick, state: _State, cap: int) -> bool:
        """Bring back into the name's range up to its free slots of each parked key with free
        slots, first in pickup order; forget the keys left with none parked. Whether any
        came back."""
        held = state.held
        wanted = {lane: cap - held[key] for lane, key in state.parked if held[key] < cap}
        if not wanted:
            return False
        found = self._first_parked(cursor, wanted)
        back = self._lane_of(dataclasses.replace(pick, ids=()))
        ids = [task_id for task_id, _ in found]
        self._set_lane(cursor, ids, "" if back is None else back)
        moved = Counter(lane for _, lane in found)
        emptied = [lane for lane, n in wanted.items() if moved[lane] < n]
        if emptied:
            ReliableParkedKey.objects.using(self.storage.alias).filter(lane__in=emptied).delete()
        return bool(ids)

    def _first_parked(self, cursor: Any, wanted: dict[str, int]) -> list[tuple[str, str]]:
        """(task id, lane) of the first ``wanted[lane]`` waiting tasks of each parked lane, a
        hundred lanes a read (a derived table per lane: SQLite takes no parenthesised UNION
        member)."""
        table = self.storage._table
        select = (
            f"SELECT * FROM (SELECT task_id, limited_name FROM {table} WHERE available = %s "
            "AND limited_name = %s ORDER BY priority DESC, run_at ASC LIMIT %s) AS p"
        )
        found: list[tuple[str, str]] = []
        for lanes in chunks(list(wanted.items()), 100):
            params = [value for lane, count in lanes for value in (True, lane, count)]
            cursor.execute(" UNION ALL ".join([select] * len(lanes)), params)
            found += [(str(task_id), str(lane)) for task_id, lane in cursor.fetchall()]
        return found

    def _choose(self, cursor: Any, pick: Pick, state: _State, cap: int, room: int) -> _Choice:
        """Go through the name's range in pickup order (the state's first candidates, then
        further reads), taking up to ``room`` tasks of keys with a free slot (and without a
        key), choosing the tasks of full keys to park, until ``room`` are taken, the range is
        read through or PARK_MAX are to be parked."""
        choice = _Choice()
        counts = Counter(state.held)
        seen: set[str] = set()
        batch = _batch(room)
        offset = 0
        rows = state.candidates
        while True:
            for task_id, key in rows:
                if task_id in seen:
                    continue
                seen.add(task_id)
                if key is None or counts[key] < cap:
                    counts[key] += key is not None
                    choice.taken.append(task_id)
                    if len(choice.taken) >= room:
                        return choice
                else:
                    choice.parked.setdefault(key, []).append(task_id)
            if len(rows) < batch or choice.parked_count >= PARK_MAX:
                return choice  # read through, or enough parked for one claim
            offset += batch
            rows = self._candidates(cursor, pick, batch, offset)

    def _candidates(
        self, cursor: Any, pick: Pick, batch: int, offset: int
    ) -> list[tuple[str, str | None]]:
        """(task id, key) of the due tasks of the pick, in pickup order, ``batch`` of them
        after ``offset``."""
        sql, params = self.storage._pick_sql(dataclasses.replace(pick, limit=batch))
        cursor.execute(f"SELECT task_id, concurrency_key {sql} OFFSET %s", [*params, offset])
        return [(str(task_id), key) for task_id, key in cursor.fetchall()]

    def _park(self, cursor: Any, name: str, parked: dict[str, list[str]]) -> None:
        """Move these tasks to their keys' parked ranges, and note the keys."""
        if not parked:
            return
        for key, ids in parked.items():
            self._set_lane(cursor, ids, parked_lane(name, key))
        ReliableParkedKey.objects.using(self.storage.alias).bulk_create(
            [ReliableParkedKey(lane=parked_lane(name, key), name=name, key=key) for key in parked],
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
