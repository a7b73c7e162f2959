"""Prometheus collectors (in the default registry, which django-prometheus exports); no side
effects at import: collectors are created on first use, and only if prometheus_client exists."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .records import TaskInfo, Transition

logger = logging.getLogger("django_reliable_executor")


# -- hooks the service and the worker call (each cheap, and a no-op without prometheus_client) --
def observe_submitted(tasks: list[TaskInfo]) -> None:
    """Tasks just stored (after the caller's transaction committed, where there was one)."""


def observe_started(task: TaskInfo) -> None:
    """An attempt started (status RUNNING, ``task.attempts`` counts it)."""


def observe_transition(transition: Transition) -> None:
    """A recorded outcome: COMPLETED, PENDING (a retry), FAILED, TIMEOUT, ERROR, CANCELLED."""


def set_master(is_master: bool) -> None:
    """This process holds the master lock now, or not."""


def track_pool(queue_size: Callable[[], int]) -> None:
    """The worker's pool: ``queue_size()`` says how many claims wait in its local queue."""


def serve(port: int) -> None:
    """Serve the default registry over HTTP on ``port`` (runexecutor --metrics-port)."""
    try:
        from prometheus_client import start_http_server
    except ImportError as exc:
        raise RuntimeError(
            "--metrics-port needs prometheus_client: "
            "pip install 'django-reliable-executor[prometheus]'"
        ) from exc
    start_http_server(port)
    logger.info("serving Prometheus metrics on port %d", port)


__all__: list[Any] = [
    "observe_started",
    "observe_submitted",
    "observe_transition",
    "serve",
    "set_master",
    "track_pool",
]
