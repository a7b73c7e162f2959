"""django-reliable-executor: reliable background tasks on the database or Redis you already run."""

from .batches import BatchInfo
from .exceptions import (
    InvalidDependencyError,
    InvalidQueueError,
    InvalidScheduleError,
    TaskSubmitConflictError,
    TaskSubmitError,
)
from .records import TaskInfo, TaskSubmitRequest
from .registry import reliable_task_handler
from .schedules.records import Schedule, ScheduleInfo
from .service.reliable_executor import ReliableExecutor, executor
from .states import TaskStatus
from .worker.context import TaskContext

__version__ = "0.1.0"

__all__ = [
    "BatchInfo",
    "InvalidDependencyError",
    "InvalidQueueError",
    "InvalidScheduleError",
    "ReliableExecutor",
    "Schedule",
    "ScheduleInfo",
    "TaskContext",
    "TaskInfo",
    "TaskStatus",
    "TaskSubmitConflictError",
    "TaskSubmitError",
    "TaskSubmitRequest",
    "executor",
    "reliable_task_handler",
]
