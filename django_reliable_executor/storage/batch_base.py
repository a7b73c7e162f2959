"""The storage interface's workflow batches: open, add members, seal, read and purge (the rule
of when a batch has finished is core/batches.py's). TaskStorage inherits it (storage/base.py
says which module of each backend holds each method)."""

from __future__ import annotations

import abc
import builtins
import datetime as dt
from collections.abc import Sequence

from ..core.batches import BatchInfo, NewBatch
from ..core.records import NewTask, TaskInfo


class BatchStorage(abc.ABC):
    """The workflow batches of a storage."""

    @abc.abstractmethod
    def open_batch(self, batch: NewBatch) -> bool:
        """Store a new, open batch (no member yet, not sealed); False when its id is taken."""

    @abc.abstractmethod
    def add_to_batch(self, batch_id: str, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        """``enqueue`` of members of an open batch (their ``batch_id`` set), adding the ones
        created to its total in the same transaction (script). Existing ids are left as they
        are and are not members."""

    @abc.abstractmethod
    def seal_batch(self, batch_id: str) -> BatchInfo:
        """Mark the batch complete (every member stored): from now on the ending write that
        brings its ended members to its total submits its callbacks; if they all ended already,
        this call does. Atomic, and a no-op on a sealed batch."""

    @abc.abstractmethod
    def purge_batches(self, finished_before: dt.datetime, limit: int) -> int:
        """Delete up to ``limit`` batches that finished before the given time, oldest first
        (the batch's record and indexes; its members are tasks, purged on their own).
        A batch not finished is kept, however old. Each batch is deleted atomically."""

    @abc.abstractmethod
    def existing_ids(self, task_ids: Sequence[str]) -> builtins.list[str]:
        """Which of these task ids are stored (a batch's members must be new)."""

    @abc.abstractmethod
    def get_batch(self, batch_id: str) -> BatchInfo | None:
        """The batch's counters, or None for an unknown id."""
