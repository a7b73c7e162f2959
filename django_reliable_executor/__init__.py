"""django-reliable-executor: reliable background tasks on the database or Redis you already run."""

from .core.batches import BatchInfo
from .core.records import StepInfo, TaskInfo, TaskSubmitRequest
from .core.states import FAILURE_STATUSES, TERMINAL_STATUSES, TaskStatus
from .exceptions import (
    DuplicateStepError,
    EventTimeout,
    InvalidDependencyError,
    InvalidQueueError,
    InvalidScheduleError,
    LeaseLostError,
    TaskSubmitConflictError,
    TaskSubmitError,
    UnknownStepError,
    WaitTimeout,
)
from .registry import reliable_task_handler
from .schedules.records import Schedule, ScheduleInfo
from .service.reliable_executor import ReliableExecutor, executor
from .worker.context import TaskContext

__version__ = "0.1.0"

__all__ = [
    "BatchInfo",
    "DuplicateStepError",
    "EventTimeout",
    "FAILURE_STATUSES",
    "InvalidDependencyError",
    "InvalidQueueError",
    "InvalidScheduleError",
    "LeaseLostError",
    "ReliableExecutor",
    "Schedule",
    "ScheduleInfo",
    "StepInfo",
    "TaskContext",
    "TaskInfo",
    "TaskStatus",
    "TaskSubmitConflictError",
    "TaskSubmitError",
    "TaskSubmitRequest",
    "TERMINAL_STATUSES",
    "UnknownStepError",
    "WaitTimeout",
    "executor",
    "reliable_task_handler",
]
