"""The rows of reliable_executor_task_param (the parameter index, setting SEARCHABLE_PARAMETERS):
written with their task, replaced when a debounced submit joins it, filled for older tasks by
``executor index-parameters``. The purge deletes them (step_rows.py); the listing reads them
(reading.py).

SQLite and MySQL/MariaDB only: PostgreSQL's searches read the GIN index of every parameter
(migration 0036), which its planner kept choosing first with the rows there too, then looking
each match up in them (bench/admin_search.py at 1M tasks: a rare value's page in 33 ms
without them, 83 ms with), so it writes none."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from django.db import connections, transaction

from ...core.parameter_index import Entries, index_entries
from ...core.records import NewTask
from ...models import ReliableTaskParameter
from .access import DatabaseAccess
from .rows import chunks

# Rows per INSERT (three parameters each: far below every backend's limit).
INSERT_ROWS = 500
# Tasks read per step of ``index_parameters`` (their parameters are held in memory at once).
INDEX_CHUNK = 1000


def keeps_rows(vendor: str) -> bool:
    """Does this database keep the parameter index's rows (not PostgreSQL: see above)?"""
    return vendor != "postgresql"


def _table(alias: str) -> str:
    return connections[alias].ops.quote_name(ReliableTaskParameter._meta.db_table)


def _key(alias: str) -> str:
    return connections[alias].ops.quote_name("key")  # a reserved word on MySQL/MariaDB


def insert_entries(
    alias: str, rows: Sequence[tuple[str, str, str]], *, skip_present: bool = False
) -> None:
    """INSERT these (key, value, task_id) rows (none: no statement), in the caller's
    transaction: with their tasks, all or nothing. ``skip_present``: a row already there is
    left as it is (SQLite and MySQL/MariaDB, the databases that keep rows)."""
    table, key = _table(alias), _key(alias)
    insert = "INSERT INTO"
    if skip_present:
        insert = (
            "INSERT IGNORE INTO"
            if connections[alias].vendor == "mysql"
            else "INSERT OR IGNORE INTO"
        )
    for chunk in chunks(rows, INSERT_ROWS):
        values = ", ".join(["(%s, %s, %s)"] * len(chunk))
        with connections[alias].cursor() as cursor:
            cursor.execute(
                f"{insert} {table} ({key}, value, task_id) VALUES {values}",
                list(itertools.chain.from_iterable(chunk)),
            )


def insert_task_entries(alias: str, tasks: Iterable[NewTask]) -> None:
    """The index rows of new tasks (``NewTask.indexed``), in the transaction inserting them."""
    if not keeps_rows(connections[alias].vendor):
        return
    insert_entries(alias, [(k, v, task.task_id) for task in tasks for k, v in task.indexed])


def replace_entries(alias: str, task_id: str, entries: Entries) -> None:
    """The task's index rows made ``entries`` (a debounced submit gave it its parameter), in
    the caller's transaction: a read, then a DELETE by primary key of the rows that differ
    (on MySQL/MariaDB a DELETE by task id would lock the gaps of that index, where other
    submits insert), and an INSERT skipping the rows present (SQLite: of the missing ones
    only, none to change: no write). Under REPEATABLE READ a caller's transaction may read a
    snapshot older than another join's writes: a row it misses there stays (the search
    checks the parameter, so a row too many costs a check, never a wrong answer), and a row
    it still sees there may be gone, deleted by that join. So MySQL/MariaDB inserts every
    entry: its duplicate check reads the latest rows, and puts such a row back."""
    vendor = connections[alias].vendor
    if not keeps_rows(vendor):
        return
    rows = ReliableTaskParameter.objects.using(alias)
    have = {
        (k, v): pk for pk, k, v in rows.filter(task_id=task_id).values_list("pk", "key", "value")
    }
    stale = [pk for entry, pk in have.items() if entry not in entries]
    if stale:
        rows.filter(pk__in=stale).delete()
    # (SQLite's writers take turns: a transaction whose snapshot is older cannot write.)
    wanted = [(k, v) for k, v in entries if vendor == "mysql" or (k, v) not in have]
    insert_entries(alias, [(k, v, task_id) for k, v in wanted], skip_present=True)


@dataclass(frozen=True)
class IndexStep:
    """One step of ``index_parameters``: tasks read, rows written and deleted, and the last
    task id read (None when no task was left: the walk is over)."""

    tasks: int
    written: int
    deleted: int
    last_task_id: str | None
    note: str | None = None  # (Redis's steps say why a shard's walk started again)


class ParameterIndexing(DatabaseAccess):
    """index_parameters: the index rows of stored tasks completed for the current keys."""

    @property
    def keeps_parameter_index(self) -> bool:
        """Whether this database writes and reads the parameter index (not PostgreSQL)."""
        return keeps_rows(self.vendor)

    def index_parameters(
        self, keys: Collection[str], after: str | None = None, limit: int = INDEX_CHUNK
    ) -> IndexStep:
        """Up to ``limit`` tasks after task id ``after``, in id order, each given the index
        rows its parameter holds under ``keys`` that it lacks; rows of keys not in ``keys``
        are deleted. One short transaction per step (retried as a deadlock victim), so
        submits and workers go on meanwhile; idempotent, so a walk that stopped can start
        again anywhere (from the last id it reached).

        The step's tasks are read under a shared lock (SQLite: the write lock), so a purge
        deleting one waits for the step, then deletes its new rows too. A row of a searchable
        key is never deleted here: one the parameter no longer holds (a debounced submit that
        joined the task after it was read) costs a search only a check, a missing one would
        lose the task."""
        if not keeps_rows(self.vendor):
            return IndexStep(0, 0, 0, None)  # (PostgreSQL reads its GIN index instead)
        return self._retrying(lambda: self._index_step(tuple(keys), after, limit))

    def _index_step(self, keys: tuple[str, ...], after: str | None, limit: int) -> IndexStep:
        rows = ReliableTaskParameter.objects.using(self.alias)
        with transaction.atomic(using=self.alias):
            ids = self._locked_ids(after, limit)
            if not ids:
                return IndexStep(0, 0, 0, None)
            read = self._tasks().filter(pk__in=ids).values_list("pk", "parameter")
            wanted = {(k, v, task_id) for task_id, p in read for k, v in index_entries(p, keys)}
            have: set[tuple[str, str, str]] = set()
            stale: list[int] = []
            for id_chunk in chunks(ids):
                found = rows.filter(task_id__in=id_chunk).values_list(
                    "pk", "key", "value", "task_id"
                )
                for pk, key, value, task_id in found:
                    have.add((key, value, task_id))
                    if key not in keys:
                        stale.append(pk)
            for pk_chunk in chunks(stale):
                rows.filter(pk__in=pk_chunk).delete()
            missing = sorted(wanted - have)
            rows.bulk_create(
                [ReliableTaskParameter(key=k, value=v, task_id=t) for k, v, t in missing],
                batch_size=INSERT_ROWS,
                ignore_conflicts=True,  # (none expected: the step's tasks are locked)
            )
        return IndexStep(len(ids), len(missing), len(stale), ids[-1])

    def _locked_ids(self, after: str | None, limit: int) -> list[str]:
        """The next ``limit`` task ids after ``after``, locked against deletion until the
        transaction ends."""
        if self.vendor == "sqlite" and not self._begins_writing(connections[self.alias]):
            # A first write takes SQLite's write lock: no purge commits before this step does.
            self._execute(f"DELETE FROM {_table(self.alias)} WHERE id < 0", [])
        lock = {"postgresql": " FOR SHARE", "mysql": " LOCK IN SHARE MODE"}.get(self.vendor, "")
        where, params = ("WHERE task_id > %s ", [after]) if after is not None else ("", [])
        with connections[self.alias].cursor() as cursor:
            cursor.execute(
                f"SELECT task_id FROM {self._table} {where}ORDER BY task_id LIMIT %s{lock}",
                [*params, limit],
            )
            return [task_id for (task_id,) in cursor.fetchall()]
