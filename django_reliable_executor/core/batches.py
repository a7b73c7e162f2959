"""Batches: a group of tasks submitted together whose callbacks are submitted once all have ended.

The rule the storages keep (see docs/workflows.md, "Batches"):

- A batch is *open* while its members are stored, chunk by chunk, each chunk adding to its
  ``total`` in the chunk's own transaction (one script on Redis); the last step *seals* it. Its
  fan-in is possible only once sealed: a batch whose submitter died mid-submit is never sealed,
  and never fires (its members run as ordinary tasks).
- Each member's ending write (completed, failed, timed out, errored, cancelled) adds it to one
  counter of its batch in the same transaction or script; the write that brings a sealed batch's
  ended members to its total marks it *finished* and submits the callbacks there and then: the
  batch row's lock (one script on Redis) makes that happen exactly once.
- A manual retry of a member takes its outcome out of the counters again (it is pending once
  more) and its next ending counts it anew; a finished batch stays finished, and its callbacks
  are never submitted again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from ..exceptions import InvalidDependencyError, InvalidTaskOptionError, TaskSubmitError
from .records import NewTask, TaskSubmitRequest, copy_with
from .states import TaskStatus

#: Members prepared and stored at a time: a batch of any size is submitted in bounded memory.
BATCH_CHUNK = 1000

# Which counter of its batch a member's terminal status adds to.
COMPLETED_COUNTER = "completed"
FAILED_COUNTER = "failed"
CANCELLED_COUNTER = "cancelled"


def counter_of(status: TaskStatus | str) -> str:
    """The batch counter a member ending in ``status`` (terminal) adds to."""
    status = TaskStatus(status)
    if status is TaskStatus.COMPLETED:
        return COMPLETED_COUNTER
    if status is TaskStatus.CANCELLED:
        return CANCELLED_COUNTER
    return FAILED_COUNTER  # FAILED, TIMEOUT, ERROR


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    """A snapshot of one batch: how many of its ``total`` members ended how. ``pending`` have
    not ended (yet, or again after a manual retry). ``finished``: every member had ended and the
    callbacks were submitted (it stays True after a member is retried). ``sealed``: every member
    is stored (False while the submit runs, or for ever if the submitter died mid-submit)."""

    batch_id: str
    total: int
    completed: int
    failed: int  # FAILED, TIMEOUT and ERROR
    cancelled: int
    pending: int
    finished: bool
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
    sealed: bool = True
    on_complete_id: str | None = None  # the callbacks' task ids (submitted or to be)
    on_success_id: str | None = None


def batch_info(
    batch_id: str,
    counts: dict[str, int],
    created_at: dt.datetime,
    finished_at: dt.datetime | None,
    sealed: bool,
    callbacks: dict[str, Any],
) -> BatchInfo:
    """A BatchInfo from a stored batch's counters (total, completed, failed, cancelled)."""
    total = counts["total"]
    ended = counts["completed"] + counts["failed"] + counts["cancelled"]
    return BatchInfo(
        batch_id=batch_id,
        total=total,
        completed=counts["completed"],
        failed=counts["failed"],
        cancelled=counts["cancelled"],
        pending=max(total - ended, 0),
        finished=finished_at is not None,
        created_at=created_at,
        finished_at=finished_at,
        sealed=sealed,
        on_complete_id=(callbacks.get("on_complete") or {}).get("task_id"),
        on_success_id=(callbacks.get("on_success") or {}).get("task_id"),
    )


@dataclasses.dataclass(frozen=True)
class NewBatch:
    """A validated batch ready to be opened: its callbacks prepared (their times are made
    relative to the moment the batch finishes, see ``callback_to_json``). ``generation`` tells
    it from an earlier batch of the same id, purged since, whose members may still be stored:
    each member carries it, and counts only in the batch whose generation it carries."""

    batch_id: str
    created_at: dt.datetime
    on_complete: NewTask | None
    on_success: NewTask | None
    generation: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)

    def member(self, task: NewTask) -> NewTask:
        """``task`` as a member of this batch."""
        return copy_with(task, batch_id=self.batch_id, batch_generation=self.generation)

    def callbacks_json(self) -> dict[str, Any]:
        """The callbacks as the storages keep them until the batch finishes."""
        plain: dict[str, Any] = {}
        if self.on_complete is not None:
            plain["on_complete"] = callback_to_json(self.on_complete)
        if self.on_success is not None:
            plain["on_success"] = callback_to_json(self.on_success)
        return plain


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def callback_to_json(task: NewTask) -> dict[str, Any]:
    """A callback as JSON: its delay and max duration count from when it is submitted (the
    batch's end), not from the submit of the batch."""
    return {
        "task_id": task.task_id,
        "task_name": task.task_name,
        "queue": task.queue,
        "priority": task.priority,
        "parameter": task.parameter,
        "retry_limit": task.retry_limit,
        "retry_interval": task.retry_interval,
        "retry_backoff": task.retry_backoff,
        "max_duration_millis": task.max_duration_millis,
        "delay_micros": _micros(task.run_at - task.created_at),
        "rate_key": task.rate_key,
        "concurrency_key": task.concurrency_key,
        "attempt_timeout": task.attempt_timeout,
        "tags": list(task.tags),
        "indexed": [list(entry) for entry in task.indexed],
    }


def callback_from_json(plain: dict[str, Any], batch_id: str, now: dt.datetime) -> NewTask:
    """The callback task to store now, when its batch finished (a callback is counted in no
    batch: its ``batch_id`` is set where it is stored, apart from the members')."""
    max_duration = plain["max_duration_millis"]
    return NewTask(
        task_id=plain["task_id"],
        task_name=plain["task_name"],
        queue=plain["queue"],
        priority=plain["priority"],
        parameter=plain["parameter"],
        retry_limit=plain["retry_limit"],
        retry_interval=plain["retry_interval"],
        retry_backoff=plain["retry_backoff"],
        max_duration_millis=max_duration,
        created_at=now,
        run_at=now + dt.timedelta(microseconds=plain["delay_micros"]),
        deadline_at=now + dt.timedelta(milliseconds=max_duration) if max_duration else None,
        rate_key=plain["rate_key"],
        # (a callback stored before attempt_timeout or concurrency_key existed has none)
        concurrency_key=plain.get("concurrency_key"),
        attempt_timeout=plain.get("attempt_timeout"),
        tags=tuple(plain.get("tags") or ()),  # (none in a callback stored before tags existed)
        # Its parameter index entries as computed at the batch's submit (none stored before).
        indexed=tuple((key, value) for key, value in plain.get("indexed") or ()),
    )


def check_callback(request: Any, field: str) -> TaskSubmitRequest | None:
    """``on_complete``/``on_success`` as given: None or a TaskSubmitRequest without
    ``unique_for`` (a callback is submitted once anyway) and without dependencies.

    A callback's dependencies are refused rather than honoured: the callback is stored by the
    write that ends the batch's last member, under its batch's lock, where waiting for other
    tasks would lock their rows after the batch's (the order that deadlocks, see
    storage/database/batches.py) and a dependency purged by then could not be waited for."""
    if request is None:
        return None
    if not isinstance(request, TaskSubmitRequest):
        raise TaskSubmitError(
            f"{field} must be a TaskSubmitRequest or None, got {type(request).__name__}",
            field=field,
        )
    if request.unique_for is not None or request.unique_key is not None:
        raise InvalidTaskOptionError(
            f"{field}: unique_for/unique_key do not apply to a batch callback (it is submitted "
            "exactly once already)",
            field=field,
        )
    if request.debounce is not None or request.debounce_max_wait is not None:
        raise InvalidTaskOptionError(
            f"{field}: debounce does not apply to a batch callback (it is submitted exactly "
            "once already)",
            field=field,
        )
    if request.depends_on is not None:
        raise InvalidDependencyError(
            f"{field}: depends_on does not apply to a batch callback (it waits for the "
            "batch's members; make the tasks to wait for members of the batch)",
            field=f"{field}.depends_on",
        )
    if request.on_dependency_failure != "cancel":
        raise InvalidDependencyError(
            f"{field}: on_dependency_failure does not apply to a batch callback (it has no "
            "dependencies: on_complete runs whatever its members' outcomes)",
            field=f"{field}.on_dependency_failure",
        )
    return request


def check_requests(requests: Any) -> Sequence[TaskSubmitRequest]:
    """The members as given: a non-empty sequence (a list or tuple)."""
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
        raise TaskSubmitError(
            f"requests must be a list of TaskSubmitRequest, got {type(requests).__name__}",
            field="requests",
        )
    if not requests:
        raise TaskSubmitError(
            "requests is empty: a batch needs at least one member", field="requests"
        )
    return requests


def member_chunks(requests: Sequence[TaskSubmitRequest], size: int = BATCH_CHUNK) -> list[slice]:
    """The slices of ``requests`` prepared and stored together."""
    return [
        slice(start, min(start + size, len(requests))) for start in range(0, len(requests), size)
    ]
