"""Numbering the rounds of a fair name's new tasks in the database storage (core/fairness.py).

A submit of tasks of a name with ``fairness="round_robin"`` reads the next rounds of their
keys in ``reliable_executor_fair_key`` without a lock (a lock held until the caller's commit
made two users' transactions submitting two keys in opposite orders deadlock); it reads the
round the name's claims are at (the lowest round of its due waiting tasks: the head of its
range of the claim index, one index probe per queue and priority), numbers the tasks, and
writes each key's next round (raised, never lowered) once its transaction commits. The
master's chores forget the rows of a name once it has no waiting task (``forget_idle``): the
numbering then starts again from 0.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import Any

from django.db import connections, transaction

from ...core.fairness import fair_key, number_rounds
from ...core.records import NewTask
from ...models import ReliableFairKey
from .access import DatabaseAccess
from .rows import chunks


class FairRounds:
    """The rounds of new tasks of fair names, and the chores' clean-up of the keys' rows."""

    def __init__(self, storage: DatabaseAccess) -> None:
        self._storage = storage

    def number(self, tasks: Sequence[NewTask]) -> list[int]:
        """The ``flow_round`` of each task (0 for a name without fairness); the keys' next
        rounds are written once the inserting transaction commits (``_write``)."""
        fair = self._storage.flow_limits.fair()
        rounds = [0] * len(tasks)
        by_name: dict[str, list[int]] = defaultdict(list)
        for index, task in enumerate(tasks):
            if task.task_name in fair:
                by_name[task.task_name].append(index)
        for name in sorted(by_name):
            indexes = by_name[name]
            keys = [fair_key(tasks[i].concurrency_key, tasks[i].rate_key) for i in indexes]
            nexts = self._read_keys(name, sorted(set(keys)))
            current = self._current(name, tasks, indexes)
            numbered, moved = number_rounds(keys, nexts, current)
            for index, round_ in zip(indexes, numbered, strict=True):
                rounds[index] = round_
            transaction.on_commit(
                functools.partial(self._write, name, moved), using=self._storage.alias, robust=True
            )
        return rounds

    def _read_keys(self, name: str, keys: list[str]) -> dict[str, int]:
        """The keys' next rounds, read without a lock: a submit locks nothing that another
        submit of the key (or the chores) would wait for until its caller commits. Two submits
        of one key at the same instant may so give one round twice: that key then has two
        tasks in that round, once."""
        rows = ReliableFairKey.objects.using(self._storage.alias)
        nexts: dict[str, int] = {}
        for chunk in chunks(keys):
            found = rows.filter(name=name, key__in=chunk)
            nexts.update(found.values_list("key", "next_round"))
        return nexts

    def _current(self, name: str, tasks: Sequence[NewTask], indexes: list[int]) -> int:
        """The round the name's claims are at: the lowest of its due waiting tasks in the new
        tasks' queues and priorities; with none, the highest next round of its keys (the
        backlog drained: new work starts after everything numbered so far)."""
        storage = self._storage
        now = storage.clock.now()
        lowest: int | None = None
        with connections[storage.alias].cursor() as cursor:
            for queue, priority in sorted({(tasks[i].queue, tasks[i].priority) for i in indexes}):
                cursor.execute(
                    f"SELECT flow_round FROM {storage._table} WHERE available = %s "
                    "AND limited_name = %s AND queue = %s AND priority = %s AND run_at <= %s "
                    "ORDER BY flow_round LIMIT 1",
                    [True, name, queue, priority, storage._dt(now)],
                )
                row = cursor.fetchone()
                if row is not None and (lowest is None or row[0] < lowest):
                    lowest = int(row[0])
            if lowest is not None:
                return lowest
            table = connections[storage.alias].ops.quote_name(ReliableFairKey._meta.db_table)
            cursor.execute(f"SELECT MAX(next_round) FROM {table} WHERE name = %s", [name])
            (highest,) = cursor.fetchone()
        return int(highest or 0)

    def _write(self, name: str, moved: dict[str, int]) -> None:
        """Each key's next round, raised (never lowered: a later submit may have written a
        higher one first), in one upsert of short locks in key order, after the submit's
        commit (a rolled back submit numbers nothing)."""
        storage = self._storage
        connection = connections[storage.alias]
        quote = connection.ops.quote_name
        table = quote(ReliableFairKey._meta.db_table)
        key, next_round = quote("key"), quote("next_round")
        if storage.vendor == "mysql":
            upsert = (
                f"ON DUPLICATE KEY UPDATE {next_round} = "
                f"GREATEST({next_round}, VALUES({next_round}))"
            )
        else:
            higher = "GREATEST" if storage.vendor == "postgresql" else "MAX"
            upsert = (
                f"ON CONFLICT (name, {key}) DO UPDATE SET {next_round} = "
                f"{higher}({table}.{next_round}, excluded.{next_round})"
            )
        for chunk in chunks(sorted(moved)):
            values = ", ".join(["(%s, %s, %s)"] * len(chunk))
            params: list[Any] = [v for k in chunk for v in (name, k, moved[k])]
            storage._execute(
                f"INSERT INTO {table} (name, {key}, {next_round}) VALUES {values} {upsert}", params
            )


def forget_idle(alias: str, waiting: Collection[str]) -> int:
    """Delete the key rows of every name but those in ``waiting`` (the names with waiting
    tasks, parked ones included): a name with none starts its rounds again from 0. (A submit
    committing meanwhile writes its keys' rows again just after its commit.)"""
    rows = ReliableFairKey.objects.using(alias)
    with transaction.atomic(using=alias):
        deleted, _ = rows.exclude(name__in=sorted(waiting)).delete()
    return deleted
