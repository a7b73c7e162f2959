"""Retry or cancel a selection of tasks, pause or resume a queue, through the service, and say
what became of each one."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterable

from django.contrib import messages

from ..core.records import TaskInfo
from ..core.states import RETRYABLE_BY_HAND, WAITING_STATUSES, TaskStatus
from ..exceptions import InvalidQueueError, StorageUnavailableError, UnknownStepError
from ..service.reliable_executor import ReliableExecutor

NOT_FOUND = "not found"
# The task changed between our read and the service's compare-and-set (a worker took it, another
# operator acted first): the service refused, nothing was changed.
CHANGED_MEANWHILE = "changed meanwhile"


@dataclasses.dataclass
class Outcome:
    """What one action did to a selection: which tasks changed, and why the others did not."""

    verb: str  # "retried", "retried from step 'x'" or "cancelled"
    changed: list[str] = dataclasses.field(default_factory=list)
    # Cancel of a RUNNING task only sets cancel_requested: it ends when its attempt does.
    requested: list[str] = dataclasses.field(default_factory=list)
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)
    # Set when the storage became unreachable part way: the rest were not attempted.
    error: str | None = None

    @property
    def level(self) -> int:
        if self.error:
            return messages.ERROR
        return messages.WARNING if self.skipped else messages.SUCCESS

    def message(self) -> str:
        """E.g. "3 tasks retried; 2 skipped: 1 COMPLETED cannot be retried, 1 not found"."""
        parts = [f"{_tasks(len(self.changed))} {self.verb}"]
        if self.requested:
            parts[0] += f", cancel requested for {_tasks(len(self.requested))} running"
        text = parts[0]
        if self.skipped:
            reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
            text += f"; {sum(self.skipped.values())} skipped: {reasons}"
        if self.error:
            text += f". Stopped: {self.error}"
        return text + "."


def _tasks(n: int) -> str:
    return f"{n} task" if n == 1 else f"{n} tasks"


def retry_tasks(executor: ReliableExecutor, task_ids: Iterable[str]) -> Outcome:
    """Manual retry of each FAILED/TIMEOUT/ERROR/CANCELLED task; the others are skipped."""

    def retry(task: TaskInfo, outcome: Outcome) -> None:
        if task.status not in RETRYABLE_BY_HAND:
            outcome.skipped[f"{task.status} cannot be retried"] += 1
            return
        # The service says why it refused: the status changed meanwhile, or the handler of a
        # timed-out attempt is still running (retried, it would run twice at once).
        reason = executor.retry_task_or_reason(task.task_id)
        if reason is None:
            outcome.changed.append(task.task_id)
        else:
            outcome.skipped[reason] += 1

    return _each(executor, task_ids, Outcome("retried"), retry)


def retry_from_step(executor: ReliableExecutor, task_id: str, step: str) -> Outcome:
    """Manual retry of one task from its step ``step`` (``retry_task(task_id, from_step=step)``:
    that checkpoint and the later ones are discarded), skipped as ``retry_tasks`` skips, or
    when the task has no checkpoint of that step (nothing changed)."""

    def retry(task: TaskInfo, outcome: Outcome) -> None:
        if task.status not in RETRYABLE_BY_HAND:
            outcome.skipped[f"{task.status} cannot be retried"] += 1
            return
        try:
            reason = executor.retry_task_or_reason(task.task_id, from_step=step)
        except UnknownStepError:
            outcome.skipped[f"no checkpoint of step {step!r}"] += 1
            return
        except (TypeError, ValueError) as exc:  # a name no step can have
            outcome.skipped[str(exc)] += 1
            return
        if reason is None:
            outcome.changed.append(task.task_id)
        else:
            outcome.skipped[reason] += 1

    return _each(executor, [task_id], Outcome(f"retried from step {step!r}"), retry)


def send_event(
    executor: ReliableExecutor, task_id: str, name: str, payload_text: str
) -> tuple[int, str]:
    """Send event ``name`` with the payload the form's JSON text holds (empty: null):
    the message level and what to tell the operator."""
    try:
        payload = json.loads(payload_text) if payload_text.strip() else None
    except ValueError as exc:
        return messages.ERROR, f"Event not sent: the payload is not JSON ({exc})."
    try:
        sent = executor.send_event(task_id, name, payload)
    except (TypeError, ValueError) as exc:
        return messages.ERROR, f"Event not sent: {exc}."
    if not sent:
        return messages.WARNING, f"Event {name!r} not sent: the task has ended (or is gone)."
    return messages.SUCCESS, f"Event {name!r} sent."


def cancel_tasks(executor: ReliableExecutor, task_ids: Iterable[str]) -> Outcome:
    """Cancel each CREATED/PENDING task and request cancel of each RUNNING one."""

    def cancel(task: TaskInfo, outcome: Outcome) -> None:
        if task.status is TaskStatus.RUNNING and task.cancel_requested:
            outcome.skipped["RUNNING with cancel already requested"] += 1
        elif not can_cancel(task.status, task.cancel_requested):
            outcome.skipped[f"{task.status} cannot be cancelled"] += 1
        elif not executor.cancel_task(task.task_id):
            outcome.skipped[CHANGED_MEANWHILE] += 1
        elif task.status is TaskStatus.RUNNING:
            outcome.requested.append(task.task_id)
        else:
            outcome.changed.append(task.task_id)

    return _each(executor, task_ids, Outcome("cancelled"), cancel)


def _each(
    executor: ReliableExecutor,
    task_ids: Iterable[str],
    outcome: Outcome,
    act: Callable[[TaskInfo, Outcome], None],
) -> Outcome:
    """Read each task (skipping unknown ids) and act on it; the service's compare-and-set
    decides, so a task that changed since it was read is skipped, never forced."""
    ids = list(dict.fromkeys(task_ids))
    for index, task_id in enumerate(ids):
        try:
            task = executor.get_task(task_id)
            if task is None:
                outcome.skipped[NOT_FOUND] += 1
            else:
                act(task, outcome)
        except StorageUnavailableError as exc:
            outcome.skipped["not attempted"] += len(ids) - index
            outcome.error = str(exc)
            break
    return outcome


def can_retry(status: TaskStatus) -> bool:
    return status in RETRYABLE_BY_HAND


def can_cancel(status: TaskStatus, cancel_requested: bool) -> bool:
    return status in WAITING_STATUSES or (status is TaskStatus.RUNNING and not cancel_requested)


ACTIONS = {"retry": retry_tasks, "cancel": cancel_tasks}


def change_queue(executor: ReliableExecutor, action: str, queue: str) -> tuple[int, str]:
    """Pause or resume ``queue`` (``action`` "pause" or "resume"): the message's level and
    text, saying whether it changed or why not."""
    operation = {"pause": executor.pause_queue, "resume": executor.resume_queue}.get(action)
    if operation is None:
        return messages.ERROR, "Choose pause or resume: no queue was changed."
    try:
        changed = operation(queue)
    except (InvalidQueueError, StorageUnavailableError) as exc:
        return messages.ERROR, f"Queue not changed: {exc}."
    if action == "pause":
        if not changed:
            return messages.INFO, f"Queue {queue} was paused already."
        return messages.SUCCESS, (
            f"Queue {queue} paused: no worker claims its tasks until it is resumed (running "
            "ones finish, new ones are accepted and wait)."
        )
    if not changed:
        return messages.INFO, f"Queue {queue} was not paused."
    return messages.SUCCESS, f"Queue {queue} resumed: workers claim its tasks again."
