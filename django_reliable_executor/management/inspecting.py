"""``manage.py executor`` status, show and health: read the task store, change nothing."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..core.task_json import task_to_json
from ..service.reliable_executor import executor
from .exit_codes import EXIT_INCOMPLETE, EXIT_USAGE
from .health import check_health, default_max_age
from .output import StatusReport, task_text
from .worker_id import check_worker_id


def _max_age(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(
            f"invalid --max-age {value!r}: expected a number of seconds > 0"
        )
    return seconds


def add_status(actions: Any) -> None:
    """``status``: counts, master, workers, oldest due task, rate limits in use."""
    status = actions.add_parser(
        "status",
        help="counts by status and queue, master, live workers, oldest due task, rate limits",
        description="Counts by status and queue, the master, the live workers, the "
        "age of the oldest task waiting to run and the use of each rate limit.",
    )
    status.add_argument("--json", action="store_true", help="print one JSON document")


def add_show(actions: Any) -> None:
    """``show TASK_ID``: every field of one task."""
    show = actions.add_parser(
        "show",
        help="every field of one task",
        description="Every field of one task; parameter and result as JSON, the last "
        "error in full. Exit code 1 when the id is unknown.",
    )
    show.add_argument("task_id")
    show.add_argument("--json", action="store_true", help="print one JSON document")


def add_health(actions: Any) -> None:
    """``health``: the probe: storage answers, a master holds the lock, a worker is alive."""
    health = actions.add_parser(
        "health",
        help="exit 0 when the storage answers and a master holds the lock (a probe)",
        description="Exit 0 when the storage answers and a master holds the master lock "
        "(and, with --worker-id, that worker heartbeated within --max-age seconds); exit 1 "
        "otherwise. Prints one line saying what was checked and what failed.",
    )
    health.add_argument("--worker-id", default=None, help="also check this worker's last heartbeat")
    health.add_argument(
        "--max-age",
        type=_max_age,
        default=None,
        metavar="S",
        help="with --worker-id: the oldest heartbeat that passes, in seconds (default "
        "LEASE_TIMEOUT: four heartbeat intervals)",
    )


class Inspecting(BaseCommand):
    """The read-only actions of the ``executor`` command."""

    def status(self, options: dict[str, Any]) -> None:
        queues = executor.count_by_queue()
        oldest_due_at = executor.oldest_due_at()
        schedules = executor.count_schedules()
        next_schedule_at = executor.storage.next_schedule_due()
        master = executor.master()
        workers = executor.workers()
        settings = executor.settings
        report = StatusReport(
            # Read after the store, so no heartbeat read above lies in the future.
            checked_at=executor.clock.now(),
            storage=executor.storage.location(),
            queues=queues,
            oldest_due_at=oldest_due_at,
            master=master,
            workers=workers,
            lease_timeout=settings.LEASE_TIMEOUT,
            schedules=schedules,
            next_schedule_at=next_schedule_at,
            paused_queues=frozenset(executor.paused_queues()),
            rate_limits=executor.rate_limit_use(),
            key_limits=executor.concurrency_key_use(),
        )
        if options["json"]:
            self.stdout.write(json.dumps(report.as_json(), indent=2, ensure_ascii=False))
        else:
            self.stdout.write(report.as_text())

    def show(self, options: dict[str, Any]) -> None:
        task_id = options["task_id"]
        info = executor.get_task(task_id)
        if info is None:
            raise CommandError(f"task {task_id!r} not found", returncode=EXIT_INCOMPLETE)
        if options["json"]:
            self.stdout.write(json.dumps(task_to_json(info), indent=2, ensure_ascii=False))
        else:
            self.stdout.write(task_text(info, executor.clock.now()))

    def health(self, options: dict[str, Any]) -> None:
        worker_id, max_age = options["worker_id"], options["max_age"]
        if max_age is not None and worker_id is None:
            raise CommandError("health: --max-age applies to --worker-id", returncode=EXIT_USAGE)
        try:
            check_worker_id(worker_id)
        except CommandError as exc:
            raise CommandError(f"health: {exc}", returncode=EXIT_USAGE) from None
        if max_age is None:
            max_age = default_max_age(executor.settings)
        verdict = check_health(executor, worker_id, max_age)
        self.stdout.write(verdict.line)
        if not verdict.healthy:
            # Not a CommandError: the one line above is the whole answer, on stdout.
            raise SystemExit(EXIT_INCOMPLETE)
