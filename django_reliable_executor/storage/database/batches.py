"""Batches on the database storage: the reliable_executor_batch row of each batch, its counters
kept by each member's ending write in that write's transaction (see batches.py for the rule)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TypeVar

from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet

from ...core.batches import BatchInfo, NewBatch, batch_info, callback_from_json, counter_of
from ...core.records import NewTask, TaskInfo, copy_with
from ...core.states import TaskStatus
from ...models import ReliableBatch
from .access import DatabaseAccess
from .rows import chunks

COUNTERS = ("completed", "failed", "cancelled")
T = TypeVar("T")


class Batches(DatabaseAccess):
    """open_batch, add_to_batch, seal_batch, get_batch, purge_batches; and the counting the
    transitions and chores call in their own transactions (_settle_batches,
    _reopen_batch_member)."""

    def _batches(self) -> QuerySet[ReliableBatch]:
        return ReliableBatch.objects.using(self.alias)

    def open_batch(self, batch: NewBatch) -> bool:
        try:
            with transaction.atomic(using=self.alias):  # a savepoint in the caller's
                self._batches().create(
                    batch_id=batch.batch_id,
                    created_at=batch.created_at,
                    callbacks=batch.callbacks_json(),
                    generation=batch.generation,
                )
        except IntegrityError:
            return False
        return True

    def add_to_batch(self, batch_id: str, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        """One transaction per chunk, run again whole when the database chose it as a
        deadlock victim (not inside the caller's transaction: only the caller can run that
        again). The batch row is locked last, as by every ending write (see Dependencies)."""

        def chunk() -> list[tuple[TaskInfo, bool]]:
            with transaction.atomic(using=self.alias):
                results = self._enqueue(tasks)
                created = sum(1 for _, was_created in results if was_created)
                if created:
                    self._batches().filter(pk=batch_id).update(total=F("total") + created)
                return results

        return self._again_alone(chunk)

    def seal_batch(self, batch_id: str) -> BatchInfo:
        def seal() -> BatchInfo:
            with transaction.atomic(using=self.alias):
                row = self._batches().select_for_update().get(pk=batch_id)
                if not row.sealed:
                    row.sealed = True
                    self._finish_if_done(row)  # every member may have ended already
                    row.save(update_fields=["sealed", "finished_at"])
                return _info(row)

        return self._again_alone(seal)

    def _again_alone(self, write: Callable[[], T]) -> T:
        """``write`` (a transaction of its own), run again after a deadlock, unless it runs
        inside the caller's transaction, which a deadlock aborts whole."""
        if transaction.get_connection(self.alias).in_atomic_block:
            return write()
        return self._retrying(write)

    def existing_ids(self, task_ids: Sequence[str]) -> list[str]:
        found: list[str] = []
        for chunk in chunks(list(task_ids)):
            found += self._tasks().filter(pk__in=chunk).values_list("pk", flat=True)
        return found

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        row = self._batches().filter(pk=batch_id).first()
        return _info(row) if row is not None else None

    def purge_batches(self, finished_before: dt.datetime, limit: int) -> int:
        # Ids first (the finished_at index), then a DELETE by primary key: short, and it locks
        # only these rows (a member's ending write may lock one meanwhile: it then counts in a
        # batch about to go, or finds none, as a member ending after its batch was purged).
        finished = self._batches().filter(finished_at__lt=finished_before)
        ids = list(finished.order_by("finished_at").values_list("pk", flat=True)[:limit])
        if not ids:
            return 0
        return finished.filter(pk__in=ids).delete()[0]

    def _settle_batches(self, ended: Sequence[tuple[str | None, str, str]]) -> None:
        by_batch: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for batch_id, task_id, status in ended:
            if batch_id is not None and TaskStatus(status).is_terminal:  # not a retry's PENDING
                by_batch[batch_id].append((task_id, status))
        if not by_batch:
            return
        generations = self._generations([t for members in by_batch.values() for t, _ in members])
        # Locked in id order: two writes ending members of the same batches never deadlock.
        rows = self._batches().select_for_update().filter(pk__in=list(by_batch)).order_by("pk")
        for row in rows:
            callbacks = _callback_ids(row)
            changed = False
            for task_id, status in by_batch[row.batch_id]:
                if task_id in callbacks:
                    continue  # a callback carries its batch's id, but is no member
                if generations.get(task_id) != row.generation:
                    continue  # a member of an earlier batch of this id, purged since
                counter = counter_of(status)
                setattr(row, counter, getattr(row, counter) + 1)
                changed = True
            if changed:
                self._finish_if_done(row)
                row.save(update_fields=[*COUNTERS, "finished_at"])

    def _reopen_batch_member(self, batch_id: str, task_id: str, status: str) -> None:
        row = self._batches().select_for_update().filter(pk=batch_id).first()
        if row is None or task_id in _callback_ids(row):
            return
        if self._generations([task_id]).get(task_id) != row.generation:
            return  # a member of an earlier batch of this id, purged since
        counter = counter_of(status)
        setattr(row, counter, max(getattr(row, counter) - 1, 0))
        row.save(update_fields=[counter])  # finished_at stays: the callbacks never refire

    def _generations(self, task_ids: Sequence[str]) -> dict[str, str | None]:
        """The batch generation each of these tasks carries (rows the caller's transaction
        just wrote: read without another lock)."""
        found: dict[str, str | None] = {}
        for chunk in chunks(list(task_ids)):
            found.update(self._tasks().filter(pk__in=chunk).values_list("pk", "batch_generation"))
        return found

    def _finish_if_done(self, row: ReliableBatch) -> None:
        """Under the row's lock: a sealed batch whose members have all ended, not finished
        before, finishes now and its callbacks are stored in this transaction."""
        ended = row.completed + row.failed + row.cancelled
        if not row.sealed or row.finished_at is not None or ended < row.total:
            return
        now = self.clock.now()
        row.finished_at = now
        due: list[NewTask] = []
        if row.callbacks.get("on_complete"):
            due.append(callback_from_json(row.callbacks["on_complete"], row.batch_id, now))
        if row.callbacks.get("on_success") and row.completed == row.total:
            due.append(callback_from_json(row.callbacks["on_success"], row.batch_id, now))
        for task in due:
            self._enqueue([copy_with(task, batch_id=row.batch_id)])


def _callback_ids(row: ReliableBatch) -> set[str]:
    return {plain["task_id"] for plain in row.callbacks.values() if plain}


def _info(row: ReliableBatch) -> BatchInfo:
    counts = {"total": row.total, "completed": row.completed, "failed": row.failed}
    counts["cancelled"] = row.cancelled
    return batch_info(
        row.batch_id, counts, row.created_at, row.finished_at, row.sealed, row.callbacks
    )
