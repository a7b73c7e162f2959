"""What runexecutor shows: its log lines on stderr when the project has not routed them, and
the start banner naming the handlers and the schedules declared in code."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.conf import settings

from django_reliable_executor.registry import all_handlers, declared_schedules

LOGGER = "django_reliable_executor"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# -v 0, 1 (the default), 2 and 3: quiet but for problems, a line per transition, everything.
_BY_VERBOSITY = {0: logging.WARNING, 1: logging.INFO}


def configure_logging(verbosity: int, loglevel: str | None) -> None:
    """The app's logger at INFO (``--loglevel``, or ``-v``: 0 WARNING, 2+ DEBUG).

    A project whose LOGGING names the ``django_reliable_executor`` logger (or one below it)
    keeps its configuration; only an explicit ``--loglevel`` changes the level. Otherwise the
    lines go to the project's root handlers if it has any, else to stderr."""
    level = (
        getattr(logging, loglevel.upper())
        if loglevel is not None
        else _BY_VERBOSITY.get(verbosity, logging.DEBUG)
    )
    logger = logging.getLogger(LOGGER)
    if _configured_by_project():
        if loglevel is not None:
            logger.setLevel(level)
        return
    logger.setLevel(level)
    if logging.getLogger().handlers or any(
        getattr(handler, "_reliable_executor_default", False) for handler in logger.handlers
    ):
        return  # the root's handlers show them; or ours is there already (a second call)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(message)s"))
    handler._reliable_executor_default = True  # type: ignore[attr-defined]
    logger.addHandler(handler)


def _configured_by_project() -> bool:
    loggers = (getattr(settings, "LOGGING", None) or {}).get("loggers") or {}
    return any(name == LOGGER or name.startswith(LOGGER + ".") for name in loggers)


def banner_lines() -> list[str]:
    """The handlers this worker can run (name, queue, limits and flow control) and the
    schedules declared in code, one per line."""
    handlers = all_handlers()
    lines = [f"handlers ({len(handlers)}):"]
    for name in sorted(handlers):
        handler = handlers[name]
        limits = [f"queue={handler.queue or 'default'}"]
        if handler.retry_limit is not None:
            limits.append(f"retry_limit={handler.retry_limit}")
        if handler.max_concurrency is not None:
            limits.append(f"max_concurrency={handler.max_concurrency}")
        if handler.max_concurrency_per_key is not None:
            limits.append(f"max_concurrency_per_key={handler.max_concurrency_per_key}")
        if handler.rate_limit is not None:
            rate = handler.rate_limit
            limits.append(f"rate_limit={rate.count}/{_per(rate.window_seconds)}")
        if handler.fairness is not None:
            limits.append(f"fairness={handler.fairness}")
        if handler.max_duration_millis is not None:
            limits.append(f"max_duration={handler.max_duration_millis / 1000:g}s")
        if handler.attempt_timeout is not None:
            limits.append(f"attempt_timeout={handler.attempt_timeout:g}s")
        lines.append(f"  {name}  {' '.join(limits)}")
    schedules = declared_schedules()
    lines.append(f"schedules declared in code ({len(schedules)}):")
    for schedule in schedules:
        when = (
            f"cron {schedule.cron!r}" + (f" {schedule.timezone}" if schedule.timezone else "")
            if schedule.cron is not None
            else f"every {_every(schedule.every)}"
        )
        lines.append(f"  {schedule.schedule_id}  {schedule.task_name}  {when}")
    return lines


def _per(window_seconds: float) -> str:
    return {1.0: "s", 60.0: "m", 3600.0: "h"}.get(window_seconds, f"{window_seconds:g}s")


def _every(every: Any) -> str:
    seconds = every.total_seconds() if hasattr(every, "total_seconds") else float(every)
    return f"{seconds:g}s"


def log_stop_request(signal_name: str, again: bool, shutdown_timeout: float) -> None:
    """The line a worker logs as a stop signal arrives: what it does now, and what a second
    signal does (call it outside the signal handler: logging takes locks)."""
    logger = logging.getLogger(LOGGER)
    if again:
        logger.warning("%s again: stopping now, without waiting for running handlers", signal_name)
        return
    logger.info(
        "%s received: stopping; no new claims, unstarted ones handed back, running handlers get "
        "up to %gs (--shutdown-timeout) to finish, after which their tasks are recovered once "
        "their lease expires. %s again stops at once",
        signal_name,
        shutdown_timeout,
        signal_name,
    )
