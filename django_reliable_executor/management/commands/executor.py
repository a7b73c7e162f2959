"""manage.py executor: status, show, retry, cancel and purge tasks, pause and resume queues; health;
shards (the check before changing REDIS_SHARDS).

Every action goes through the service (so signals fire and both storages behave alike); the
exit codes and output lines are documented in docs/command.md for scripts to rely on.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_reliable_executor.conf import MAX_REDIS_SHARDS
from django_reliable_executor.core.records import task_to_json
from django_reliable_executor.core.states import FAILURE_STATUSES, TERMINAL_STATUSES, TaskStatus
from django_reliable_executor.exceptions import (
    InvalidQueueError,
    StorageUnavailableError,
    UnknownQueueError,
)
from django_reliable_executor.management.health import check_health, default_max_age
from django_reliable_executor.management.output import (
    DURATION_EXAMPLES,
    StatusReport,
    format_age,
    parse_duration,
    storage_label,
    task_text,
)
from django_reliable_executor.management.tables import tables_missing
from django_reliable_executor.management.worker_id import check_worker_id
from django_reliable_executor.service.reliable_executor import executor

EXIT_OK = 0
EXIT_INCOMPLETE = 1  # an id not found or skipped, or a purge not confirmed
EXIT_USAGE = 2  # bad arguments (argparse exits 2 too)
EXIT_UNAVAILABLE = 3  # the task store cannot be reached or used
EXIT_INTERRUPTED = 130  # Ctrl-C during a purge (128 + SIGINT, as shells report it)

# Lifecycle order, not alphabetical, like every other list of statuses in the docs.
FINISHED = [status for status in TaskStatus if status in TERMINAL_STATUSES]
FINISHED_NAMES = ", ".join(status.value for status in FINISHED)


def _duration(value: str) -> Any:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _finished_status(value: str) -> TaskStatus:
    try:
        status = TaskStatus(value.strip().upper())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"unknown status {value!r}: expected one of {FINISHED_NAMES}"
        ) from None
    if status not in TERMINAL_STATUSES:
        raise argparse.ArgumentTypeError(
            f"{status.value} is not a finished status: purge deletes only {FINISHED_NAMES} "
            "tasks (live tasks are never purged)"
        )
    return status


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"invalid batch size {value!r}: expected an integer >= 1")
    return number


def _shard_count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_REDIS_SHARDS:
        raise argparse.ArgumentTypeError(
            f"invalid N {value!r}: expected a number of shards from 1 to {MAX_REDIS_SHARDS}"
        )
    return number


def _add_status(actions: Any) -> None:
    """``status``: counts, master, workers, oldest due task, rate limits in use."""
    status = actions.add_parser(
        "status",
        help="counts by status and queue, master, live workers, oldest due task, rate limits",
        description="Counts by status and queue, the master, the live workers, the "
        "age of the oldest task waiting to run and the use of each rate limit.",
    )
    status.add_argument("--json", action="store_true", help="print one JSON document")


def _add_show(actions: Any) -> None:
    """``show TASK_ID``: every field of one task."""
    show = actions.add_parser(
        "show",
        help="every field of one task",
        description="Every field of one task; parameter and result as JSON, the last "
        "error in full. Exit code 1 when the id is unknown.",
    )
    show.add_argument("task_id")
    show.add_argument("--json", action="store_true", help="print one JSON document")


def _add_retry_and_cancel(actions: Any) -> None:
    """``retry``/``cancel`` by ids; ``retry --failed``: every dead letter."""
    for name, verb in (("retry", "Retry"), ("cancel", "Cancel")):
        sub = actions.add_parser(
            name,
            help=f"{name} tasks by id",
            description=f"{verb} each task, one line per id, then a summary line. "
            "Exit code 0 when every task changed, 1 when any was skipped or not found.",
        )
        sub.add_argument("task_ids", nargs="+" if name == "cancel" else "*", metavar="task_id")
    retry = actions.choices["retry"]
    retry.add_argument(
        "--failed",
        action="store_true",
        help="instead of ids: every task that ended FAILED, TIMEOUT or ERROR (the dead "
        "letters), narrowed by --queue and --task-name",
    )
    retry.add_argument("--queue", default=None, help="with --failed: only this queue")
    retry.add_argument("--task-name", default=None, help="with --failed: only this task name")


def _add_purge(actions: Any) -> None:
    """``purge --older-than``: delete finished tasks."""
    purge = actions.add_parser(
        "purge",
        help="delete finished tasks older than a duration",
        description="Delete finished tasks (by default of every finished status) whose "
        "finished_at is older than --older-than. Running and waiting tasks are never "
        "deleted.",
    )
    purge.add_argument(
        "--older-than",
        type=_duration,
        required=True,
        metavar="DURATION",
        help=f"how long ago they finished, e.g. {DURATION_EXAMPLES}",
    )
    purge.add_argument(
        "--status",
        type=_finished_status,
        nargs="+",
        action="extend",
        dest="statuses",
        metavar="STATUS",
        help=f"only tasks of these statuses (any of {FINISHED_NAMES}; default all)",
    )
    purge.add_argument(
        "--yes",
        "--no-input",
        "--noinput",
        action="store_true",
        dest="yes",
        help="do not ask for confirmation (required when stdin is not a terminal)",
    )
    purge.add_argument(
        "--batch-size",
        type=_positive_int,
        default=500,
        metavar="N",
        help="tasks deleted per round (default 500)",
    )
    purge.add_argument(
        "--pause",
        type=_pause,
        default=0.0,
        metavar="SECONDS",
        help="wait this long between rounds, to pace a large purge (default 0)",
    )


def _pause(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 <= seconds <= 3600):
        raise argparse.ArgumentTypeError(
            f"invalid --pause {value!r}: expected a number of seconds from 0 to 3600"
        )
    return seconds


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


def _add_health(actions: Any) -> None:
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


def _add_pause_and_resume(actions: Any) -> None:
    """``pause-queue NAME`` / ``resume-queue NAME``."""
    for name, verb, what in (
        ("pause-queue", "Pause", "no worker claims its tasks until resumed"),
        ("resume-queue", "Resume", "workers claim its tasks again"),
    ):
        sub = actions.add_parser(
            name,
            help=f"{verb.lower()} a queue: {what}",
            description=f"{verb} a queue: {what}. Doing it twice is no error. Exit code 1 for "
            "a queue nothing uses, 2 for a name no queue can have.",
        )
        sub.add_argument("queue")


def _add_shards(actions: Any) -> None:
    """``shards N``: may REDIS_SHARDS change to N now?"""
    shards = actions.add_parser(
        "shards",
        help="check that REDIS_SHARDS may change to N now (Redis storage)",
        description="Check, before changing REDIS_SHARDS (offline: stop submitting, drain, stop "
        "the workers), that the current layout holds no unfinished task and that the N-shard "
        "layout holds no key at all; print each queue's shard under N. Exit code 0 when the "
        "switch may be made, 1 when not.",
    )
    shards.add_argument("target", type=_shard_count, metavar="N")
    shards.add_argument(
        "--apply",
        action="store_true",
        help="when the switch may be made, make it: pause the paused queues in the N-shard "
        "layout too and record N as the key prefix's layout (workers with the old REDIS_SHARDS "
        "are then refused, those with N start)",
    )


def _accept_django_options(action: Any) -> None:
    """Django's own options after the action too (``executor status --settings X``), as every
    other command takes them anywhere: SUPPRESS keeps a value given before the action."""
    action.add_argument(
        "-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=argparse.SUPPRESS
    )
    for name in ("--settings", "--pythonpath"):
        action.add_argument(name, default=argparse.SUPPRESS)
    for flag in ("--traceback", "--no-color", "--force-color", "--skip-checks"):
        action.add_argument(flag, action="store_true", default=argparse.SUPPRESS)


class Command(BaseCommand):
    help = (
        "Look at and operate reliable-executor tasks: status, show, retry, cancel, purge, "
        "pause-queue, resume-queue; health (a probe); shards (the check before changing "
        "REDIS_SHARDS). Exit codes: 0 done, 1 some id not found or skipped (health: unhealthy; "
        "pause/resume: unknown queue; shards: not ready), 2 usage error, 3 task store "
        "unavailable."
    )
    stealth_options = ("stdin",)

    def get_check_kwargs(self, options: dict[str, Any]) -> Any:
        """Skip the database checks Django 6 runs before commands: an unreachable task store
        is this command's to report, with exit code 3, not a system-check failure."""
        kwargs = super().get_check_kwargs(options)  # Django 6.0+ only calls this
        kwargs["databases"] = []
        return kwargs

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
        _add_status(actions)
        _add_show(actions)
        _add_retry_and_cancel(actions)
        _add_purge(actions)
        _add_health(actions)
        _add_pause_and_resume(actions)
        _add_shards(actions)
        for action in actions.choices.values():
            _accept_django_options(action)

    def handle(self, *args: Any, **options: Any) -> None:
        actions: dict[str, Callable[[dict[str, Any]], None]] = {
            "status": self.status,
            "show": self.show,
            "retry": self.retry,
            "cancel": self.cancel,
            "purge": self.purge,
            "health": self.health,
            "pause-queue": self.pause_queue,
            "resume-queue": self.resume_queue,
            "shards": self.shards,
        }
        try:
            actions[options["action"]](options)
        except UnknownQueueError as exc:
            raise CommandError(str(exc), returncode=EXIT_INCOMPLETE) from exc
        except InvalidQueueError as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        except StorageUnavailableError as exc:
            raise CommandError(
                f"task store unavailable: {exc}", returncode=EXIT_UNAVAILABLE
            ) from exc
        except DatabaseError as exc:
            alias = executor.settings.DATABASE_ALIAS
            missing = tables_missing(executor.settings)
            if missing is not None:
                raise CommandError(missing, returncode=EXIT_UNAVAILABLE) from exc
            raise CommandError(
                f"task store unavailable (database {alias!r}): {type(exc).__name__}: {exc}",
                returncode=EXIT_UNAVAILABLE,
            ) from exc

    # -- status and show ------------------------------------------------------------------
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
            storage=storage_label(settings),
            queues=queues,
            oldest_due_at=oldest_due_at,
            master=master,
            workers=workers,
            lease_timeout=settings.LEASE_TIMEOUT,
            schedules=schedules,
            next_schedule_at=next_schedule_at,
            paused_queues=frozenset(executor.paused_queues()),
            rate_limits=executor.rate_limit_use(),
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

    def shards(self, options: dict[str, Any]) -> None:
        from django_reliable_executor.storage.redis import RedisStorage
        from django_reliable_executor.storage.redis.resharding import (
            apply_reshard,
            check_reshard,
        )

        storage = executor.storage
        if not isinstance(storage, RedisStorage):
            raise CommandError(
                "shards: REDIS_SHARDS applies to the Redis storage only", returncode=EXIT_USAGE
            )
        try:
            check = (apply_reshard if options["apply"] else check_reshard)(
                storage, options["target"]
            )
        except ValueError as exc:
            raise CommandError(f"shards: {exc}", returncode=EXIT_USAGE) from None
        self.stdout.write(
            f"REDIS_SHARDS {check.current} -> {check.target} (key prefix {storage.key_prefix!r})"
        )
        for queue, shard in sorted(check.queue_shards.items()):
            self.stdout.write(f"  queue {queue}: shard {shard}")
        self.stdout.write(f"unfinished tasks: {check.unfinished}")
        self.stdout.write(
            f"schedules: {check.schedules} (not carried over: define them again after)"
        )
        paused = ", ".join(sorted(check.paused)) or "none"
        self.stdout.write(f"paused queues: {paused} (carried over)")
        for problem in check.problems():
            self.stdout.write(f"not ready: {problem}")
        if not check.ready:
            raise SystemExit(EXIT_INCOMPLETE)
        if options["apply"]:
            self.stdout.write(
                f"applied: the layout of key prefix {storage.key_prefix!r} is REDIS_SHARDS = "
                f"{check.target} now; set REDIS_SHARDS = {check.target}, then start the workers "
                "again"
            )
        else:
            self.stdout.write(
                f"ready: run again with --apply, then set REDIS_SHARDS = {check.target} and "
                "start the workers again"
            )

    # -- retry and cancel -----------------------------------------------------------------
    def retry(self, options: dict[str, Any]) -> None:
        task_ids = options["task_ids"]
        if options["failed"] == bool(task_ids):
            raise CommandError("retry: give task ids or --failed (not both)", returncode=EXIT_USAGE)
        if not options["failed"] and (options["queue"] or options["task_name"]):
            raise CommandError(
                "retry: --queue and --task-name only narrow --failed", returncode=EXIT_USAGE
            )
        if options["failed"]:
            task_ids = self._dead_letters(options["queue"], options["task_name"])
        self._each(task_ids, self._retry_one)

    @staticmethod
    def _dead_letters(queue: str | None, task_name: str | None) -> list[str]:
        """Ids of every FAILED, TIMEOUT and ERROR task (filtered), read before any is retried:
        a retry moves a task out of these statuses, which would shift the pages."""
        ids: list[str] = []
        for status in sorted(FAILURE_STATUSES, key=lambda s: s.value):
            offset = 0
            while True:
                page = executor.list_tasks(
                    status=status, queue=queue, task_name=task_name, limit=500, offset=offset
                )
                ids += [task.task_id for task in page]
                if len(page) < 500:
                    break
                offset += len(page)
        return ids

    def cancel(self, options: dict[str, Any]) -> None:
        self._each(options["task_ids"], self._cancel_one)

    def _each(self, task_ids: list[str], act: Callable[[str], tuple[str, str]]) -> None:
        """Run ``act`` on every id once (in the order given), print ``<id>: <outcome>`` for
        each, then the summary; exit 1 unless every task changed."""
        tally = {"changed": 0, "skipped": 0, "not found": 0}
        for task_id in dict.fromkeys(task_ids):  # an id given twice is acted on once
            kind, outcome = act(task_id)
            tally[kind] += 1
            self.stdout.write(f"{task_id}: {outcome}")
        summary = ", ".join(f"{n} {kind}" for kind, n in tally.items())
        self.stdout.write(summary)
        if tally["skipped"] or tally["not found"]:
            raise CommandError(f"not every task changed ({summary})", returncode=EXIT_INCOMPLETE)

    @staticmethod
    def _retry_one(task_id: str) -> tuple[str, str]:
        if executor.get_task(task_id) is None:
            return "not found", "not found"
        reason = executor.retry_task_or_reason(task_id)
        if reason is None:
            return "changed", "retried"
        if reason == "not found":
            return "not found", "not found"
        return "skipped", f"skipped: {reason}"

    @staticmethod
    def _cancel_one(task_id: str) -> tuple[str, str]:
        if executor.get_task(task_id) is None:
            return "not found", "not found"
        changed = executor.cancel_task(task_id)
        now = executor.get_task(task_id)
        if now is None:
            return "not found", "not found"
        if not changed:
            return "skipped", f"skipped: {now.status.value} cannot be cancelled"
        # A changed cancel either ended the task or, while it runs, only set the flag.
        if now.status is TaskStatus.CANCELLED:
            return "changed", "cancelled"
        return "changed", "cancel requested (running)"

    # -- paused queues --------------------------------------------------------------------
    def pause_queue(self, options: dict[str, Any]) -> None:
        queue = options["queue"]
        if executor.pause_queue(queue):
            self.stdout.write(f"paused queue {queue}")
        else:
            self.stdout.write(f"queue {queue} was paused already")

    def resume_queue(self, options: dict[str, Any]) -> None:
        queue = options["queue"]
        if executor.resume_queue(queue):
            self.stdout.write(f"resumed queue {queue}")
        else:
            self.stdout.write(f"queue {queue} was not paused")

    # -- purge ----------------------------------------------------------------------------
    def purge(self, options: dict[str, Any]) -> None:
        statuses: list[TaskStatus] = list(dict.fromkeys(options["statuses"] or FINISHED))
        cutoff = executor.clock.now() - options["older_than"]
        names = ", ".join(status.value for status in statuses)
        if not options["yes"] and not self._confirmed(
            f"Delete {names} tasks finished before {cutoff.isoformat()}? [y/N] ",
            options.get("stdin") or sys.stdin,
        ):
            raise CommandError("purge not confirmed: nothing deleted", returncode=EXIT_INCOMPLETE)
        draw = self._progress_line() if self.stderr.isatty() else None
        so_far = [0]

        def progress(deleted: int) -> None:
            so_far[0] = deleted
            if draw is not None:
                draw(deleted)

        try:
            deleted = executor.purge_finished(
                cutoff,
                statuses=statuses,
                batch=options["batch_size"],
                progress=progress,
                pause_seconds=options["pause"],
            )
            # Every finished task is gone: the batches that finished as long ago go too (with
            # --status, some of their members are kept: so are they).
            every = set(statuses) == set(FINISHED)
            batches = (
                executor.purge_batches(
                    cutoff, batch=options["batch_size"], pause_seconds=options["pause"]
                )
                if every
                else 0
            )
        except KeyboardInterrupt:
            # Every finished batch is deleted for good; say how many, not a traceback.
            if draw is not None:
                self.stderr.write("", style_func=_plain)
            raise CommandError(
                f"interrupted: purged {so_far[0]} tasks finished before {cutoff.isoformat()}",
                returncode=EXIT_INTERRUPTED,
            ) from None
        if draw is not None:
            self.stderr.write("", style_func=_plain)  # end the progress line
        if every:
            self.stdout.write(f"purged {batches} batches finished before {cutoff.isoformat()}")
        self.stdout.write(f"purged {deleted} tasks finished before {cutoff.isoformat()}")

    def _confirmed(self, question: str, stdin: Any) -> bool:
        if not (hasattr(stdin, "isatty") and stdin.isatty()):
            raise CommandError(
                "purge deletes tasks: pass --yes to confirm when stdin is not a terminal",
                returncode=EXIT_USAGE,
            )
        self.stderr.write(question, ending="", style_func=_plain)
        self.stderr.flush()
        return stdin.readline().strip().lower() in ("y", "yes")

    def _progress_line(self) -> Callable[[int], None]:
        """``progress`` for purge_finished: one line on the terminal, rewritten per batch.
        The total is not known up front, so it counts and shows the rate."""
        started = time.monotonic()

        def show(deleted: int) -> None:
            elapsed = time.monotonic() - started
            rate = f", {deleted / elapsed:,.0f}/s" if elapsed > 0 else ""
            self.stderr.write(
                f"\r\033[Kpurging: {deleted:,} deleted in {format_age(elapsed)}{rate}",
                ending="",
                style_func=_plain,
            )
            self.stderr.flush()

        return show


def _plain(text: str) -> str:
    """No error colour for what is not an error (Django colours all of stderr on a TTY)."""
    return text
