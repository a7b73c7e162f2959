"""The worker: everything a ``runexecutor`` process runs, except the master's duty (master/).

``Worker`` and ``WorkerOptions`` stay importable from here, the documented path; they load on
first use, so that importing ``worker.context`` (``TaskContext``) does not load the worker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .worker import Worker, WorkerOptions

__all__ = ["Worker", "WorkerOptions"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import worker

        return getattr(worker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
