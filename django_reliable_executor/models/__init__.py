"""Tables of the database storage: tasks, their durable steps, unique keys, the master lock, the
worker registry, paused queues, retries per minute.

One module per role (tasks, flow, workers, schedules); every model is imported here, where
Django looks for them."""

from .flow import (
    ReliableFairKey,
    ReliableNameLock,
    ReliableParkedKey,
    ReliablePausedQueue,
    ReliableRateLog,
    ReliableRetryCount,
)
from .schedules import ReliableSchedule, ReliableScheduleSkip
from .tasks import (
    ReliableBatch,
    ReliableDependency,
    ReliableTask,
    ReliableTaskEvent,
    ReliableTaskParameter,
    ReliableTaskStep,
    ReliableTaskTag,
    ReliableUniqueKey,
)
from .workers import ReliableApiNonce, ReliableLock, ReliableStackRequest, ReliableWorker

__all__ = [
    "ReliableTask",
    "ReliableDependency",
    "ReliableTaskStep",
    "ReliableTaskTag",
    "ReliableTaskParameter",
    "ReliableTaskEvent",
    "ReliableLock",
    "ReliableNameLock",
    "ReliableParkedKey",
    "ReliableFairKey",
    "ReliablePausedQueue",
    "ReliableRateLog",
    "ReliableRetryCount",
    "ReliableWorker",
    "ReliableApiNonce",
    "ReliableUniqueKey",
    "ReliableSchedule",
    "ReliableScheduleSkip",
    "ReliableBatch",
    "ReliableStackRequest",
]
