"""Numbering the rounds of a fair name's new tasks in the database storage (core/fairness.py).

A submit of tasks of a name with ``fairness="round_robin"`` locks the rows of their keys in
``reliable_executor_fair_key`` (in key order, created on first use) for the rest of its
transaction, so two submits of one key never give out the same round; it reads the round the
name's claims are at (the lowest round of its due waiting tasks: the head of its range of the
claim index, one index probe per queue and priority), numbers the tasks and writes each key's
next round. The master's chores forget the rows of a name once it has no waiting task
(``forget_idle``): the numbering then starts again from 0.
"""

from __future__ import annotations

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
        """The ``flow_round`` of each task (0 for a name without fairness), the fair keys'
        rows locked and moved on. Called inside the inserting transaction."""
        fair = self._storage.flow_limits.fair()
        rounds = [0] * len(tasks)
        by_name: dict[str, list[int]] = defaultdict(list)
        for index, task in enumerate(tasks):
            if task.task_name in fair:
                by_name[task.task_name].append(index)
        for name in sorted(by_name):  # one order for every submitter: no deadlock by name
            indexes = by_name[name]
            keys = [fair_key(tasks[i].concurrency_key, tasks[i].rate_key) for i in indexes]
            nexts = self._lock_keys(name, sorted(set(keys)))
            current = self._current(name, tasks, indexes)
            numbered, moved = number_rounds(keys, nexts, current)
            for index, round_ in zip(indexes, numbered, strict=True):
                rounds[index] = round_
            self._write(name, moved)
        return rounds

    def _lock_keys(self, name: str, keys: list[str]) -> dict[str, int]:
        """The keys' next rounds, their rows created if missing and locked until the
        transaction ends (on SQLite the insert took the database's write lock already)."""
        rows = ReliableFairKey.objects.using(self._storage.alias)
        rows.bulk_create(
            [ReliableFairKey(name=name, key=key, next_round=0) for key in keys],
            ignore_conflicts=True,
        )
        nexts: dict[str, int] = {}
        for chunk in chunks(keys):
            found = rows.filter(name=name, key__in=chunk).order_by("key")
            if self._storage.vendor != "sqlite":
                found = found.select_for_update()
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
        """Each key's next round, on its locked row."""
        table = connections[self._storage.alias].ops.quote_name(ReliableFairKey._meta.db_table)
        key_column = connections[self._storage.alias].ops.quote_name("key")
        for chunk in chunks(sorted(moved)):
            cases = " ".join(["WHEN %s THEN %s"] * len(chunk))
            params: list[Any] = [value for key in chunk for value in (key, moved[key])]
            marks = ", ".join(["%s"] * len(chunk))
            self._storage._execute(
                f"UPDATE {table} SET next_round = CASE {key_column} {cases} END "
                f"WHERE name = %s AND {key_column} IN ({marks})",
                [*params, name, *chunk],
            )


def forget_idle(alias: str, waiting: Collection[str]) -> int:
    """Delete the key rows of every name but those in ``waiting`` (the names with waiting
    tasks, parked ones included): a name with none starts its rounds again from 0. A submit
    that numbered rounds meanwhile holds its rows locked, so this waits for its commit."""
    rows = ReliableFairKey.objects.using(alias)
    with transaction.atomic(using=alias):
        deleted, _ = rows.exclude(name__in=sorted(waiting)).delete()
    return deleted
