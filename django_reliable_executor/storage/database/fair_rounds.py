"""Numbering the rounds of a fair name's new tasks in the database storage (core/fairness.py),
and the master's chores' upkeep of the keys' rows.

A submit of tasks of a name with ``fairness="round_robin"`` reads the next rounds of their
keys in ``reliable_executor_fair_key`` without a lock (a lock held until the caller's commit
made two users' transactions submitting two keys in opposite orders deadlock); it reads the
round the name's claims are at in each queue and priority (the lowest round of its due waiting
tasks there: the head of its range of the claim index, one index probe), numbers the tasks,
and writes each key's next round (raised, never lowered) once its transaction commits. Both
are per (name, queue, priority): a key's rounds elsewhere say nothing of its turn here.

The chores (``FairKeyUpkeep``) delete the rows of keys with nothing waiting in their queue and
priority but keep each (name, queue, priority)'s highest next round, so the numbering never
goes back: a task that returns later with its round (a retry by hand, a recovered claim) still
goes before the tasks submitted after it. They also clear the rounds of the waiting tasks of
names registered here without fairness, so a name that lost it is taken oldest first again.
"""

from __future__ import annotations

import functools
import operator
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import Q

from ...core.fairness import fair_key, number_rounds
from ...core.records import NewTask
from ...models import ReliableFairKey, ReliableParkedKey
from .access import DatabaseAccess
from .rows import chunks

# A name's keys numbered in one queue and priority: (name, queue, priority).
Group = tuple[str, str, int]


class FairRounds:
    """The rounds of new tasks of fair names."""

    def __init__(self, storage: DatabaseAccess) -> None:
        self._storage = storage

    def number(self, tasks: Sequence[NewTask]) -> list[int]:
        """The ``flow_round`` of each task (0 for a name without fairness); the keys' next
        rounds are written once the inserting transaction commits (``_write``)."""
        fair = self._storage.flow_limits.fair()
        rounds = [0] * len(tasks)
        groups: dict[Group, list[int]] = defaultdict(list)
        for index, task in enumerate(tasks):
            if task.task_name in fair:
                groups[(task.task_name, task.queue, task.priority)].append(index)
        for group in sorted(groups):
            # In submit order (the storage inserts by task id): a key's tasks of one call get
            # its rounds in the order they were asked for (submit_many spaces them by 1 µs).
            indexes = sorted(groups[group], key=lambda i: tasks[i].created_at)
            keys = [fair_key(tasks[i].concurrency_key, tasks[i].rate_key) for i in indexes]
            nexts = self._read_keys(group, sorted(set(keys)))
            numbered, moved = number_rounds(keys, nexts, self._current(group))
            for index, round_ in zip(indexes, numbered, strict=True):
                rounds[index] = round_
            transaction.on_commit(
                functools.partial(self._write, group, moved), using=self._storage.alias, robust=True
            )
        return rounds

    def _read_keys(self, group: Group, keys: list[str]) -> dict[str, int]:
        """The keys' next rounds, read without a lock: a submit locks nothing that another
        submit of the key (or the chores) would wait for until its caller commits. Two submits
        of one key at the same instant may so give one round twice: that key then has two
        tasks in that round, once."""
        name, queue, priority = group
        rows = ReliableFairKey.objects.using(self._storage.alias)
        nexts: dict[str, int] = {}
        for chunk in chunks(keys):
            found = rows.filter(name=name, queue=queue, priority=priority, key__in=chunk)
            nexts.update(found.values_list("key", "next_round"))
        return nexts

    def _current(self, group: Group) -> int:
        """The round the name's claims are at in this queue and priority: the lowest of its
        due waiting tasks; with none, the highest next round of its keys there (the backlog
        drained: new work starts after everything numbered so far, which the chores keep)."""
        storage = self._storage
        name, queue, priority = group
        with connections[storage.alias].cursor() as cursor:
            cursor.execute(
                f"SELECT flow_round FROM {storage._table} WHERE available = %s "
                "AND limited_name = %s AND queue = %s AND priority = %s AND run_at <= %s "
                "ORDER BY flow_round LIMIT 1",
                [True, name, queue, priority, storage._dt(storage.clock.now())],
            )
            row = cursor.fetchone()
            if row is not None:
                return int(row[0])
            table = connections[storage.alias].ops.quote_name(ReliableFairKey._meta.db_table)
            cursor.execute(
                f"SELECT MAX(next_round) FROM {table} WHERE name = %s AND queue = %s "
                "AND priority = %s",
                [name, queue, priority],
            )
            (highest,) = cursor.fetchone()
        return int(highest or 0)

    def _write(self, group: Group, moved: dict[str, int]) -> None:
        """Each key's next round, raised (never lowered: a later submit may have written a
        higher one first), in one upsert of short locks in key order, after the submit's
        commit (a rolled back submit numbers nothing)."""
        storage = self._storage
        quote = connections[storage.alias].ops.quote_name
        table = quote(ReliableFairKey._meta.db_table)
        key, next_round = quote("key"), quote("next_round")
        columns = f"name, queue, priority, {key}"
        if storage.vendor == "mysql":
            upsert = (
                f"ON DUPLICATE KEY UPDATE {next_round} = "
                f"GREATEST({next_round}, VALUES({next_round}))"
            )
        else:
            higher = "GREATEST" if storage.vendor == "postgresql" else "MAX"
            upsert = (
                f"ON CONFLICT ({columns}) DO UPDATE SET {next_round} = "
                f"{higher}({table}.{next_round}, excluded.{next_round})"
            )
        for chunk in chunks(sorted(moved)):
            values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(chunk))
            params: list[Any] = [v for k in chunk for v in (*group, k, moved[k])]
            storage._execute(
                f"INSERT INTO {table} ({columns}, {next_round}) VALUES {values} {upsert}", params
            )


class FairKeyUpkeep:
    """The master's chores on ``reliable_executor_fair_key`` and on the rounds of names no
    longer fair, each statement bounded by ``limit`` rows, one (name, queue, priority) at a
    time (found by index probes, never a scan of the keys)."""

    def __init__(self, storage: DatabaseAccess, limit: int) -> None:
        self._storage = storage
        self._limit = limit
        self._rows = ReliableFairKey.objects.using(storage.alias)

    def run(self) -> int:
        """Forget the rows of keys with nothing waiting (at most ``limit`` rows) and clear the
        rounds of waiting tasks of names registered here without fairness (at most ``limit``
        tasks). How many tasks' rounds were cleared."""
        limits = self._storage.flow_limits
        fair = set(limits.fair())
        plain = set(limits.known()) - fair  # a name not known here is left as it is
        cleared = 0
        left = self._limit
        for group in self._groups():
            if group[0] in plain and cleared < self._limit:
                cleared += self._clear(group, self._limit - cleared)
            if left > 0:
                left -= self._forget(group, left)
        return cleared

    def _groups(self) -> list[Group]:
        """Each (name, queue, priority) with rows: a loose scan of the unique index, one
        probe per value."""
        storage = self._storage
        table = connections[storage.alias].ops.quote_name(ReliableFairKey._meta.db_table)
        groups: list[Group] = []
        with connections[storage.alias].cursor() as cursor:

            def values(column: str, where: str, params: list[Any]) -> list[Any]:
                found: list[Any] = []
                while True:
                    after = f" AND {column} > %s" if found else ""
                    cursor.execute(
                        f"SELECT MIN({column}) FROM {table} WHERE {where}{after}",
                        params + found[-1:],
                    )
                    (value,) = cursor.fetchone()
                    if value is None:
                        return found
                    found.append(value)

            for name in values("name", "1 = 1", []):
                for queue in values("queue", "name = %s", [name]):
                    for priority in values("priority", "name = %s AND queue = %s", [name, queue]):
                        groups.append((name, queue, int(priority)))
        return groups

    def _forget(self, group: Group, limit: int) -> int:
        """Delete up to ``limit`` rows of keys of ``group`` with no waiting task there (a task
        of a key has a round below the key's next round, so the keys of the waiting tasks read
        in round order up to ``below`` are all those that may hold a row at or under it), all
        but the highest next round (new tasks number from there: never backwards).

        A submit meanwhile is safe: its ``_write`` runs after its commit and writes its keys'
        rows again (the GREATEST upsert), so a row deleted under it comes back; and a row
        raised since it was read here is not deleted (the delete compares its next round).
        The rows are read before the waiting tasks: a key whose task commits after the rows'
        read is either seen waiting, or its row was raised after that read and no longer
        matches (read the other way round, a task and its raise landing between the two reads
        lost its key's row: one turn too many)."""
        name, queue, priority = group
        rows = self._rows.filter(name=name, queue=queue, priority=priority)
        top = rows.order_by("-next_round").values_list("pk", flat=True).first()
        if top is None:
            return 0
        listed = list(
            rows.exclude(pk=top)
            .order_by("next_round")
            .values_list("pk", "key", "next_round")[: limit + self._limit + 1]
        )
        seen, below = self._waiting_keys(group)
        idle = [
            (pk, at) for pk, key, at in listed if key not in seen and (below is None or at <= below)
        ]
        deleted = 0
        for chunk in chunks(idle[:limit]):
            matched = functools.reduce(operator.or_, (Q(pk=pk, next_round=at) for pk, at in chunk))
            deleted += self._rows.filter(matched).delete()[0]
        return deleted

    def _waiting_keys(self, group: Group) -> tuple[set[str], int | None]:
        """The keys of the group's waiting tasks in the name's range, read in round order (at
        most ``limit``), and the round they reach (None: all read), with the keys parked at
        their cap in the group's queue (key_parking.py; any priority: kept either way). A
        task of the name outside its range (stored while the name was not limited) is not
        seen: its key's row may go, and its next task then shares a round with it."""
        storage = self._storage
        name, queue, priority = group
        with connections[storage.alias].cursor() as cursor:
            cursor.execute(
                f"SELECT flow_round, concurrency_key, rate_key FROM {storage._table} "
                "WHERE available = %s AND limited_name = %s AND queue = %s AND priority = %s "
                "ORDER BY flow_round LIMIT %s",
                [True, name, queue, priority, self._limit + 1],
            )
            found = cursor.fetchall()
        below = int(found[self._limit][0]) if len(found) > self._limit else None
        seen = {fair_key(c, r) for _, c, r in found[: self._limit]}
        parked = ReliableParkedKey.objects.using(storage.alias).filter(name=name, queue=queue)
        seen.update(parked.values_list("key", flat=True))
        return seen, below

    def _clear(self, group: Group, limit: int) -> int:
        """``flow_round = 0`` on up to ``limit`` waiting tasks of ``group`` (a name registered
        here without fairness) in its range, the claim of all other names and its parked
        ranges: the claims take them oldest first again. The group's highest row stays, so
        a task that comes back later (a recovered claim) is cleared then too."""
        storage = self._storage
        name, queue, priority = group
        parked = ReliableParkedKey.objects.using(storage.alias).filter(name=name, queue=queue)
        lanes = [name, "", *sorted(parked.values_list("lane", flat=True))]
        cleared = 0
        for lane in lanes:
            with connections[storage.alias].cursor() as cursor:
                cursor.execute(
                    f"SELECT task_id FROM {storage._table} WHERE available = %s "
                    "AND limited_name = %s AND queue = %s AND priority = %s AND flow_round > %s "
                    "AND task_name = %s LIMIT %s",
                    [True, lane, queue, priority, 0, name, limit - cleared],
                )
                ids = [task_id for (task_id,) in cursor.fetchall()]
            for chunk in chunks(ids):
                ids_sql, params = storage._in("task_id", chunk)
                cleared += storage._execute(
                    f"UPDATE {storage._table} SET flow_round = 0 WHERE {ids_sql} "
                    "AND available = %s",
                    [*params, True],
                )
            if cleared >= limit:
                break
        return cleared
