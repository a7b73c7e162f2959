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
import datetime as dt
import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, transaction

from ...core.records import Claim
from ...core.states import TaskStatus
from ...models import ReliableNameLock, ReliableParkedKey
from .rate_log import ClaimStatements
from .rows import LIVE, Pick, chunks

# Most tasks one claim parks: a claim stays short however long a key's backlog is (the next
# claim parks the next ones).
PARK_MAX = 1000
# A parked range's value of ``limited_name``: this prefix, then a digest of the name and key
# (a key may be as long as the column). No registered task name starts with a control
# character in practice, and the chores (mark_limited) leave these ranges to this module.
LANE_PREFIX = "\x1f"

# The held tasks of a name, by key: claimed and not finished (a dependent waiting for its
# dependencies is unavailable too, but held by no one), or timed out with the handler still
# running (its holder keeps the lease: expire_overdue).
_HELD_BY_KEY_SQL = (
    "SELECT concurrency_key, COUNT(*) FROM {table} WHERE task_name = %s AND NOT available "
    "AND status IN ({live}) AND waiting_for IS NULL GROUP BY concurrency_key "
    "UNION ALL SELECT concurrency_key, COUNT(*) FROM {table} WHERE task_name = %s "
    "AND status = %s AND available = %s AND lease_expires_at > %s GROUP BY concurrency_key"
)


def parked_lane(name: str, key: str) -> str:
    """The ``limited_name`` of the parked tasks of ``name`` and ``key``."""
    digest = hashlib.sha256(f"{name}\x00{key}".encode()).hexdigest()[:48]
    return LANE_PREFIX + digest


def is_parked_lane(lane: str) -> bool:
    return lane.startswith(LANE_PREFIX)


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
        name = pick.name
        connection = connections[storage.alias]
        lock_table = connection.ops.quote_name(ReliableNameLock._meta.db_table)
        with transaction.atomic(using=storage.alias, savepoint=not joined):
            with connection.cursor() as cursor:
                storage._lock_name(cursor, lock_table, name)
                held = self._held_by_key(cursor, name, pick.now)
                room = pick.limit
                if name_cap is not None:
                    room = min(room, name_cap - sum(held.values()))
                if room <= 0:
                    return []
                chosen = self.choose(cursor, pick, key_cap, room, held)
            if not chosen:
                return []
            return storage._take(dataclasses.replace(pick, limit=len(chosen), ids=chosen))

    def choose(
        self,
        cursor: Any,
        pick: Pick,
        key_cap: int,
        room: int,
        held: Counter[str | None] | None = None,
    ) -> tuple[str, ...]:
        """Under the name's lock: the ids of up to ``room`` due tasks of ``pick.name`` whose
        keys have free slots, in pickup order, once the parked tasks of keys with free slots
        are back and the tasks passed over (of full keys) parked. ``held``: the held tasks
        by key, when the caller counted them."""
        assert pick.name is not None
        if held is None:
            held = self._held_by_key(cursor, pick.name, pick.now)
        self._unpark(cursor, pick, held, key_cap)
        choice = self._choose(cursor, pick, held, key_cap, room)
        self._park(cursor, pick.name, choice.parked)
        return tuple(choice.taken)

    def _held_by_key(self, cursor: Any, name: str, now: dt.datetime) -> Counter[str | None]:
        """``{key: held tasks}`` of ``name`` (None: those without a key). Under the lock."""
        storage = self.storage
        live = ", ".join(f"'{s}'" for s in LIVE)  # literals: PostgreSQL's partial index
        cursor.execute(
            _HELD_BY_KEY_SQL.format(table=storage._table, live=live),
            [name, name, TaskStatus.TIMEOUT.value, False, storage._dt(now)],
        )
        held: Counter[str | None] = Counter()
        for key, count in cursor.fetchall():
            held[key] += int(count)
        return held

    def _unpark(self, cursor: Any, pick: Pick, held: Counter[str | None], cap: int) -> None:
        """Bring back into the name's range up to its free slots of each parked key with free
        slots, first in pickup order; forget the keys left with none parked."""
        assert pick.name is not None
        parked = list(
            ReliableParkedKey.objects.using(self.storage.alias)
            .filter(name=pick.name)
            .values_list("lane", "key")
        )
        wanted = {lane: cap - held[key] for lane, key in parked if held[key] < cap}
        if not wanted:
            return
        found = self._first_parked(cursor, wanted)
        back = self._lane_of(dataclasses.replace(pick, ids=()))
        ids = [task_id for task_id, _ in found]
        self._set_lane(cursor, ids, "" if back is None else back)
        moved = Counter(lane for _, lane in found)
        emptied = [lane for lane, n in wanted.items() if moved[lane] < n]
        if emptied:
            ReliableParkedKey.objects.using(self.storage.alias).filter(lane__in=emptied).delete()

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

    def _choose(
        self, cursor: Any, pick: Pick, held: Counter[str | None], cap: int, room: int
    ) -> _Choice:
        """Read the name's range in pickup order, taking up to ``room`` tasks of keys with a
        free slot (and without a key), choosing the tasks of full keys to park, until
        ``room`` are taken, the range is read through or PARK_MAX are to be parked."""
        choice = _Choice()
        counts = Counter(held)
        seen: set[str] = set()
        batch = max(room * 2, 16)
        offset = 0
        while len(choice.taken) < room and choice.parked_count < PARK_MAX:
            rows = self._candidates(cursor, pick, batch, offset)
            for task_id, key in rows:
                if task_id in seen:
                    continue
                seen.add(task_id)
                if key is None or counts[key] < cap:
                    counts[key] += key is not None
                    choice.taken.append(task_id)
                    if len(choice.taken) >= room:
                        break
                else:
                    choice.parked.setdefault(key, []).append(task_id)
            if len(rows) < batch:
                break  # read through
            offset += batch
        return choice

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
