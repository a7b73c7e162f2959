"""Task statuses and the allowed-transition table: the one source of truth for the state machine."""

from __future__ import annotations

import enum


class TaskStatus(str, enum.Enum):
    """Where a task stands. Stored as its value; compares equal to the plain string."""

    CREATED = "CREATED"
    RUNNING = "RUNNING"
    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    ERROR = "ERROR"

    def __str__(self) -> str:
        return self.value

    @property
    def is_terminal(self) -> bool:
        """COMPLETED, FAILED, TIMEOUT, CANCELLED or ERROR: no worker runs the task again
        unless it is retried by hand (which COMPLETED cannot be)."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.TIMEOUT,
        TaskStatus.CANCELLED,
        TaskStatus.ERROR,
    }
)
# Waiting to run: claimable once due. A claimed-but-unstarted task keeps this status.
WAITING_STATUSES = frozenset({TaskStatus.CREATED, TaskStatus.PENDING})
# Not finished: waiting or running (what the chores and the unfinished counts look at).
LIVE_STATUSES = WAITING_STATUSES | {TaskStatus.RUNNING}
# Statuses a manual retry accepts.
RETRYABLE_BY_HAND = frozenset(
    {TaskStatus.FAILED, TaskStatus.TIMEOUT, TaskStatus.ERROR, TaskStatus.CANCELLED}
)
# The final outcomes announced through the ``task_failed`` signal.
FAILURE_STATUSES = frozenset({TaskStatus.FAILED, TaskStatus.TIMEOUT, TaskStatus.ERROR})
# The dead letters: tasks that ended FAILED, TIMEOUT or ERROR and stay stored until retention (or
# a purge) deletes them or someone retries them.
DEAD_LETTER_STATUSES = FAILURE_STATUSES

S = TaskStatus
TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    S.CREATED: frozenset({S.RUNNING, S.CANCELLED, S.TIMEOUT}),
    S.PENDING: frozenset({S.RUNNING, S.CANCELLED, S.TIMEOUT}),
    # RUNNING -> TIMEOUT also happens without the handler: the deadline passes while it runs.
    S.RUNNING: frozenset({S.COMPLETED, S.PENDING, S.FAILED, S.TIMEOUT, S.CANCELLED, S.ERROR}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset({S.PENDING}),
    S.TIMEOUT: frozenset({S.PENDING}),
    S.CANCELLED: frozenset({S.PENDING}),
    S.ERROR: frozenset({S.PENDING}),
}
del S


def can_transition(source: TaskStatus, target: TaskStatus) -> bool:
    """True when the state machine allows ``source -> target``."""
    return target in TRANSITIONS[source]
