"""Submits inside the caller's ``atomic()`` block: the open transaction, the writes Redis
storage defers to its commit, and what those writes will store (the database storage needs
none of this: its writes join the caller's transaction)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import connections, transaction

from ..conf import ExecutorSettings
from ..core.debouncing import debounced_run_at
from ..core.records import NewTask, TaskInfo, copy_with, new_info
from ..core.states import TaskStatus
from ..observability.announcer import Announcer
from ..storage import TaskStorage
from .submitting import check_dependencies_exist

_C = TypeVar("_C", bound=Callable[[], object])


def open_transaction(settings: ExecutorSettings) -> str | None:
    """The database alias whose atomic() block the caller is in, if any: DATABASE_ALIAS
    first, then any other connection already opened in this thread."""
    if transaction.get_connection(settings.DATABASE_ALIAS).in_atomic_block:
        return settings.DATABASE_ALIAS
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            return str(connection.alias)
    return None


def after_commit(storage: TaskStorage, callback: Callable[[], object]) -> None:
    """Run now, or when the caller's transaction on the task database commits."""
    alias = storage.transaction_alias
    if alias is not None and transaction.get_connection(alias).in_atomic_block:
        transaction.on_commit(callback, using=alias)
    else:
        callback()


def stores_tasks_at_commit(callback: _C) -> _C:
    """Mark an on_commit callback that stores tasks (a submit to Redis inside atomic()):
    testing.run_tasks stores them at once, as a TestCase's transaction never commits."""
    callback.stores_tasks_at_commit = True  # type: ignore[attr-defined]
    return callback


def pending_task_writes(alias: str) -> list[Callable[[], object]]:
    """The marked on_commit callbacks of the open transaction on ``alias``, in order (those
    of rolled-back savepoints are gone from Django's list)."""
    callbacks = getattr(transaction.get_connection(alias), "run_on_commit", ())
    return [func for _, func, *_ in callbacks if getattr(func, "stores_tasks_at_commit", False)]


def _joined(task: NewTask, holder: TaskInfo | None) -> TaskInfo | None:
    """A debounced submit's answer as its write at commit will make it: the key's task, with
    this submit's parameter and due time (core/debouncing.py), while that task waits never
    started; None when the submit will open a new window."""
    if holder is None or holder.status is not TaskStatus.CREATED or holder.attempts:
        return None
    assert task.debounce is not None
    run_at = debounced_run_at(
        task.created_at, holder.created_at, task.debounce, task.debounce_max_wait
    )
    return copy_with(holder, parameter=task.parameter, run_at=run_at, debounced=True)


class DeferredWrite:
    """A submit inside a transaction whose tasks Redis stores when it commits (an on_commit
    callback), with what the submit answered: the tasks it will store by id, and the unique
    keys they take (a later submit in the same transaction returns the task holding one)."""

    stores_tasks_at_commit = True  # see stores_tasks_at_commit

    def __init__(self, storage: TaskStorage, announcer: Announcer, tasks: list[NewTask]) -> None:
        self.storage = storage
        self.announcer = announcer
        self.tasks = tasks
        self.stored: dict[str, TaskInfo] = {}
        self.keys: dict[str, TaskInfo] = {}

    def __call__(self) -> None:
        results = self.storage.enqueue(self.tasks)
        self.announcer.submitted([info for info, created in results if created])


def deferred_writes(alias: str) -> list[DeferredWrite]:
    """The submits inside the open transaction on ``alias`` whose write waits for its commit,
    in order (callbacks of rolled-back savepoints are gone from the list)."""
    callbacks = getattr(transaction.get_connection(alias), "run_on_commit", ())
    return [func for _, func, *_ in callbacks if isinstance(func, DeferredWrite)]


def submit_on_commit(
    storage: TaskStorage, announcer: Announcer, new_tasks: list[NewTask], alias: str
) -> list[tuple[TaskInfo, bool]]:
    """Storage outside the database (Redis): write when the caller's transaction commits,
    so a rolled-back transaction leaves no task behind. Ids already stored are returned as
    stored; the others as they will be, as the databases would answer in the transaction:
    a unique key held by a live task, or taken by a submit before this one in the same
    transaction (whose write waits for the commit too), returns that task; a debounced
    submit returns the key's task waiting never started as it will be once joined. Each with
    whether this submit's write is to store it (see ReliableExecutor.submit_many_created)."""
    earlier = deferred_writes(alias)
    infos: dict[str, TaskInfo] = {}
    holders: dict[str, TaskInfo | None] = {}
    for deferred in earlier:  # in the order submitted: the first to take a key keeps it
        for task_id, info in deferred.stored.items():
            infos.setdefault(task_id, info)
        for taken, info in deferred.keys.items():
            holders.setdefault(taken, info)
    coming = set(infos)
    infos.update(storage.get_many([task.task_id for task in new_tasks]))
    write = DeferredWrite(storage, announcer, new_tasks)
    skipped: set[str] = set()
    for task in new_tasks:
        if task.task_id in infos:
            continue
        key = task.unique_key
        if key is not None:
            # The live holder of its key as things stand; the write at commit decides.
            if key not in holders:
                holders[key] = storage.unique_holder(key)
            holder = holders[key]
            if task.debounce is not None:
                holder = _joined(task, holder)
                if holder is not None:  # the write at commit joins it (see _joined)
                    infos[task.task_id] = holders[key] = holder
                    skipped.add(task.task_id)
                    continue
            elif holder is not None:
                infos[task.task_id] = holder
                skipped.add(task.task_id)
                continue
            holders[key] = write.keys[key] = new_info(task)  # a later submit meets it
        infos[task.task_id] = write.stored[task.task_id] = new_info(task)
    # Refused now rather than at commit (submit.lua checks again when it writes): only
    # the tasks this transaction will store before these count as stored.
    check_dependencies_exist(storage, new_tasks, coming, skipped)
    transaction.on_commit(write, using=alias)
    answered: list[tuple[TaskInfo, bool]] = []
    seen: set[int] = set()  # the tasks answered so far, by identity
    for task in new_tasks:
        info = infos[task.task_id]
        # Stored by this write only for its own request, not for a later one it answers.
        answered.append((info, write.stored.get(task.task_id) is info and id(info) not in seen))
        seen.add(id(info))
    return answered
