"""Announcer: the signal, the log line and the metrics of every state change of a task (and of
each durable step's checkpoint written)."""

from __future__ import annotations

import datetime as dt
import logging
import operator
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

from .. import signals
from ..core.records import TaskInfo, Transition
from ..core.states import FAILURE_STATUSES, TaskStatus
from ..core.waits import Wait
from . import metrics
from .tracing import current_trace_id, trace_id_of

logger = logging.getLogger("django_reliable_executor")

# Told of every batch of tasks that reached a final status (COMPLETED, FAILED, TIMEOUT, ERROR,
# CANCELLED), just before this app's signals for them: the Django Tasks backend sends Django's
# task_finished so. Not a signal receiver: a receiver would cost every task a dispatch, where
# a listener costs a batch one call.
STATUS = operator.attrgetter("task.status")  # read in C, for a batch

FinishListener = Callable[[list[Transition]], None]
_finish_listeners: list[FinishListener] = []


def on_finished(listener: FinishListener) -> None:
    """Call ``listener`` with the transitions of each batch of tasks that finished (once)."""
    if listener not in _finish_listeners:
        _finish_listeners.append(listener)


class Announcer:
    """Announces the transitions that submits, workers, chores and operations make. Signals are
    sent with ``send_robust`` as ``sender`` (the ReliableExecutor class): a failing receiver is
    logged, never raised into the code that made the transition."""

    def __init__(self, sender: type) -> None:
        self.sender = sender

    def submitted(self, created: list[TaskInfo]) -> None:
        """Tasks just stored."""
        metrics.count_submitted(created)
        if logger.isEnabledFor(logging.INFO):
            for info in created:
                log_transition(logging.INFO, info, "new", f"queue {info.queue}")
        if signals.task_submitted.receivers:
            for info in created:
                self._send(signals.task_submitted, task_id=info.task_id, task_name=info.task_name)

    def started(self, task: TaskInfo) -> None:
        """An attempt that has just started (RUNNING, this attempt counted)."""
        metrics.count_started(task)
        self.starting(task)

    @staticmethod
    def starts_recorded(tasks: list[TaskInfo]) -> None:
        """The metrics of attempts whose start was just recorded together (one start write, or
        one claim that started them); each is announced with ``starting`` as it runs."""
        metrics.count_started_many(tasks)

    def starting(self, task: TaskInfo) -> None:
        """``started`` but the metrics, already counted by ``starts_recorded``: the log line
        and the signal, sent by the thread about to run the attempt."""
        log_transition(logging.INFO, task, None)
        if signals.task_started.receivers:
            self._send(
                signals.task_started,
                task_id=task.task_id,
                task_name=task.task_name,
                attempt=task.attempts,
            )

    def transitions(self, transitions: list[Transition]) -> None:
        """``transition`` for each of a batch (the completion writer's): the metrics of its
        completions counted once per task name and queue, no per-task work for the log or a
        signal nobody listens to."""
        statuses = set(map(STATUS, transitions))
        completed = (
            transitions
            if statuses == {TaskStatus.COMPLETED}
            else [t for t in transitions if t.task.status is TaskStatus.COMPLETED]
        )
        if len(completed) < len(transitions):
            for transition in transitions:
                if transition.task.status is not TaskStatus.COMPLETED:
                    self.transition(transition)
        if not completed:
            return
        metrics.count_completed(completed)
        if logger.isEnabledFor(logging.INFO):
            for transition in completed:
                log_transition(logging.INFO, transition.task, transition.previous)
        self._finished(completed)
        if signals.task_completed.receivers:
            for transition in completed:
                task = transition.task
                self._send(
                    signals.task_completed,
                    task_id=task.task_id,
                    task_name=task.task_name,
                    result=task.result,
                )

    def transition(self, transition: Transition, *, exc: BaseException | None = None) -> None:
        """An outcome: completed, retrying, failed (FAILED/TIMEOUT/ERROR) or cancelled.
        ``exc``, the handler's exception when it raised in this process, goes with a final
        failure's ERROR line (its traceback in the log, and Sentry's logging integration
        reports it as an exception, grouped by its stack, not as one message for all
        tasks)."""
        metrics.count_transition(transition)
        task = transition.task
        status = task.status
        if status is TaskStatus.COMPLETED:
            log_transition(logging.INFO, task, transition.previous)
            self._finished([transition])
            self._send(
                signals.task_completed,
                task_id=task.task_id,
                task_name=task.task_name,
                result=task.result,
            )
        elif status is TaskStatus.PENDING:
            # A failed attempt that will be retried: worth a look, not yet an alarm.
            log_transition(
                logging.WARNING,
                task,
                transition.previous,
                f"retry at {task.run_at.isoformat()}: {_first_line(task.last_error)}",
            )
            self._send(
                signals.task_retrying,
                task_id=task.task_id,
                task_name=task.task_name,
                attempt=task.attempts,
                error=task.last_error,
                next_run_at=task.run_at,
            )
        elif status in FAILURE_STATUSES:
            log_transition(
                logging.ERROR,
                task,
                transition.previous,
                _first_line(task.last_error),
                exc_info=exc,
            )
            self._finished([transition])
            self._send(
                signals.task_failed,
                task_id=task.task_id,
                task_name=task.task_name,
                status=status,
                error=task.last_error,
            )
        elif status is TaskStatus.CANCELLED:
            log_transition(logging.INFO, task, transition.previous)
            self._finished([transition])
            self._send(signals.task_cancelled, task_id=task.task_id, task_name=task.task_name)

    def step_finished(self, task: TaskInfo, step: str) -> None:
        """A checkpoint of step ``step`` of ``task`` was written (no status changed): the
        counter and the signal, no log line (a task may make thousands of steps)."""
        metrics.count_step_finished(task)
        if signals.task_step_finished.receivers:
            self._send(
                signals.task_step_finished,
                task_id=task.task_id,
                task_name=task.task_name,
                step=step,
            )

    def suspended(self, transition: Transition, wait: Wait | None) -> None:
        """A handler stopped to wait (``wait``) or at a stop (None), its task handed back
        PENDING: a log line, the waits counter and the ``task_waiting`` signal."""
        task = transition.task
        kind = "stop" if wait is None else wait.kind
        what = (
            "handed back at a step: the worker stops"
            if wait is None
            else (f"waits ({wait.kind} {wait.name!r})")
        )
        log_transition(logging.INFO, task, transition.previous, what)
        metrics.count_wait(task, kind)
        if signals.task_waiting.receivers:
            self._send(
                signals.task_waiting,
                task=task,
                kind=kind,
                waiting=task.waiting,
            )

    @staticmethod
    def cancel_requested(task: TaskInfo) -> None:
        """A running task asked to stop: only a log line; its outcome is announced later."""
        log_transition(logging.INFO, task, TaskStatus.RUNNING, "cancel requested")

    @staticmethod
    def retried(transition: Transition) -> None:
        """A task put back to PENDING by hand: only a log line; its next outcome is announced."""
        log_transition(logging.INFO, transition.task, transition.previous, "retried by hand")

    @staticmethod
    def _finished(transitions: list[Transition]) -> None:
        for listener in _finish_listeners:
            try:
                listener(transitions)
            except Exception:  # as a signal receiver's: logged, never raised into the worker
                logger.exception("finished-task listener %r failed", listener)

    def _send(self, signal: Signal, **kwargs: Any) -> None:
        for receiver, response in signal.send_robust(sender=self.sender, **kwargs):
            if isinstance(response, Exception):
                logger.error(
                    "signal receiver %r failed",
                    receiver,
                    exc_info=(type(response), response, response.__traceback__),
                )


def log_transition(
    level: int,
    task: TaskInfo,
    previous: TaskStatus | str | None,
    detail: str = "",
    *,
    exc_info: BaseException | None = None,
) -> None:
    """One line per state change, in a shape a task's history can be grepped by:
    ``task <id> (<name>) <FROM> -> <TO> attempt=<n> worker=<id>[: detail]``, its fields also
    given as ``extra=`` (see transition_fields) for a structured formatter such as
    ``django_reliable_executor.logging.JsonFormatter``."""
    if not logger.isEnabledFor(level):
        return
    source = previous if previous is not None else "claimed"
    logger.log(
        level,
        "task %s (%s) %s -> %s attempt=%s worker=%s%s",
        task.task_id,
        task.task_name,
        source,
        task.status,
        task.attempts,
        task.worker_id or "-",
        f": {detail}" if detail else "",
        exc_info=exc_info,
        extra=transition_fields(task, source),
    )


def transition_fields(task: TaskInfo, source: TaskStatus | str) -> dict[str, Any]:
    """The fields of a transition's log record: task_id, task_name, from, to, attempt,
    worker_id, queue, duration_ms (the attempt's, once it ended: None otherwise) and, when
    the task is traced, trace_id (of the stored trace context, else of the current span)."""
    duration_ms = None
    started_at = task.started_at
    if source == TaskStatus.RUNNING and task.status != source and started_at is not None:
        ended = task.finished_at or dt.datetime.now(dt.timezone.utc)
        duration_ms = max(0, round((ended - started_at).total_seconds() * 1000))
    fields: dict[str, Any] = {
        "task_id": task.task_id,
        "task_name": task.task_name,
        "from": str(getattr(source, "value", source)),
        "to": task.status.value,
        "attempt": task.attempts,
        "worker_id": task.worker_id,
        "queue": task.queue,
        "duration_ms": duration_ms,
    }
    trace_id = trace_id_of(task.trace_context) or current_trace_id()
    if trace_id is not None:
        fields["trace_id"] = trace_id
    return fields


def _first_line(text: str | None) -> str:
    """A failure in one line: a traceback's exception line; a message of the worker's own put
    before a traceback ("attempt timed out after 1 s ...: the handler raised ...:") with the
    exception line after it, so the log says why as well as what."""
    if not text:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    first, last = lines[0], lines[-1]
    if len(lines) == 1 or first.startswith("Traceback (most recent call last)"):
        return last
    return f"{first} {last.strip()}"
