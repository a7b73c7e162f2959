"""Durable waits in a handler (``context.sleep``, ``wait_for_event``, ``wait_for``): each
either returns at once (its time has passed, its event was sent, its tasks ended) or stops
the handler by raising Suspended (suspended.py), which the worker turns into
``storage.suspend``: the task waits PENDING, holding no worker slot, and its handler is
called again from the top once the wait is over (docs/durable-tasks.md)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..core.records import TaskInfo
from ..core.steps import check_step_name
from ..core.waits import (
    EVENT,
    MAX_AWAITED_TASKS,
    SLEEP,
    TASKS,
    Wait,
    is_record,
    record_until,
    wait_seconds,
)
from ..exceptions import EventTimeout, WaitTimeout
from .steps import Checkpoints
from .suspended import Suspended

if TYPE_CHECKING:
    from ..storage.base import TaskStorage


class Waiting:
    """One attempt's durable waits: decided against the task's checkpoints (a wait's record
    fixes when it ends) and what the storage holds now (events, the awaited tasks)."""

    def __init__(self, checkpoints: Checkpoints) -> None:
        self._checkpoints = checkpoints

    @property
    def _storage(self) -> TaskStorage:
        return self._checkpoints.storage

    @property
    def _task_id(self) -> str:
        return self._checkpoints.claim.task_id

    def _now(self) -> dt.datetime:
        return self._checkpoints.clock.now()

    # -- what each wait reads: one storage round trip or two, off the event loop when async
    def read_sleep(self, name: str) -> dict[str, Any]:
        return self._checkpoints.results()

    def read_event(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        return self._checkpoints.results(), self._storage.task_events(self._task_id)

    def read_tasks(self, ids: list[str]) -> tuple[dict[str, Any], dict[str, TaskInfo]]:
        return self._checkpoints.results(), self._storage.get_many(ids)

    # -- each wait's decision ---------------------------------------------------------------
    def sleep(self, name: str, seconds: float, stored: dict[str, Any]) -> None:
        until = self._until(name, SLEEP, stored, seconds)
        assert until is not None
        if until > self._now():
            raise Suspended(Wait(SLEEP, name, until=until))

    def event(
        self, name: str, timeout: float | None, stored: dict[str, Any], events: dict[str, Any]
    ) -> Any:
        if name in events:
            return events[name]
        until = self._until(name, EVENT, stored, timeout)
        if until is not None and until <= self._now():
            raise EventTimeout(self._task_id, name, f"no event {name!r} was sent in time")
        raise Suspended(Wait(EVENT, name, until=until, event=name))

    def tasks(
        self,
        name: str,
        ids: list[str],
        timeout: float | None,
        stored: dict[str, Any],
        found: Mapping[str, TaskInfo],
    ) -> dict[str, TaskInfo]:
        if self._task_id in ids:
            raise ValueError(f"wait_for {name!r}: a task cannot wait for itself")
        missing = [task_id for task_id in ids if task_id not in found]
        if missing and name not in stored:
            raise ValueError(
                f"wait_for {name!r}: no task {', '.join(map(repr, missing))} (never "
                "submitted, or purged): it cannot be waited for"
            )
        # Resumed (its record stored): a task gone since was purged, so it had ended.
        live = [task_id for task_id in ids if task_id in found and not _ended(found[task_id])]
        if not live:
            return {task_id: found[task_id] for task_id in ids if task_id in found}
        until = self._until(name, TASKS, stored, timeout)
        if until is not None and until <= self._now():
            raise WaitTimeout(self._task_id, name, f"tasks not ended in time: {', '.join(live)}")
        raise Suspended(Wait(TASKS, name, until=until, task_ids=tuple(live)))

    def _until(
        self, name: str, kind: str, stored: dict[str, Any], seconds: float | None
    ) -> dt.datetime | None:
        """When the wait ends: as its record says (a resumed call: the clock never starts
        again), else ``seconds`` from now (None: no end)."""
        if name in stored:
            record = stored[name]
            if not is_record(record, kind):
                raise TypeError(
                    f"{name!r} names a step or a wait of another kind in this task's "
                    f"checkpoints, not a {kind} wait: each step and wait needs a name of its own"
                )
            return record_until(record)
        return None if seconds is None else self._now() + dt.timedelta(seconds=seconds)


def _ended(task: TaskInfo) -> bool:
    """Ended (§6.1): terminal, and no handler of it runs on."""
    return task.is_terminal and not task.handler_running


def check_wait(name: object) -> str:
    return check_step_name(name, "wait name")


def check_timeout(timeout: Any, what: str) -> float | None:
    return None if timeout is None else wait_seconds(timeout, what)


def check_task_ids(name: str, task_ids: Any) -> list[str]:
    """``task_ids`` as a list of distinct ids (order kept); TypeError or ValueError when it is
    not a non-empty list of at most MAX_AWAITED_TASKS ids."""
    if isinstance(task_ids, (str, bytes, Mapping)) or not isinstance(task_ids, Iterable):
        raise TypeError(
            f"wait_for {name!r}: task_ids must be a list of task ids, not {type(task_ids).__name__}"
        )
    ids = list(dict.fromkeys(task_ids))
    if not ids:
        raise ValueError(f"wait_for {name!r}: task_ids is empty")
    if len(ids) > MAX_AWAITED_TASKS:
        raise ValueError(f"wait_for {name!r}: at most {MAX_AWAITED_TASKS} tasks, not {len(ids)}")
    for task_id in ids:
        if not isinstance(task_id, str) or not task_id:
            raise TypeError(f"wait_for {name!r}: task ids are non-empty strings, not {task_id!r}")
    return ids


def wait_to_json(wait: Wait | None) -> dict[str, Any] | None:
    """A wait as the process pool's child sends it to its worker."""
    return None if wait is None else wait.describe()


def wait_from_json(value: dict[str, Any] | None) -> Wait | None:
    if value is None:
        return None
    until = value.get("until")
    return Wait(
        kind=value["kind"],
        name=value["name"],
        until=None if until is None else dt.datetime.fromisoformat(until),
        event=value.get("event"),
        task_ids=tuple(value.get("task_ids") or ()),
    )
