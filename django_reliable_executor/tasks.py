"""The app's own handlers, registered when Django starts (autodiscovered like any app's
``tasks`` module): the bulk actions the admin starts (service/bulk_actions.py)."""

from __future__ import annotations

from typing import Any

from .registry import reliable_task_handler
from .service.bulk_actions import BULK_ACTION, run_bulk_action
from .service.reliable_executor import executor


@reliable_task_handler(name=BULK_ACTION, takes_context=True, priority=10)
def bulk_action(parameter: Any, context: Any) -> dict[str, Any]:
    """Retry or cancel every task of a filter, a chunk at a time (see bulk_actions)."""
    return run_bulk_action(executor, parameter, context)
