"""manage.py runexecutor: parse options, build a Worker, run it until SIGTERM/SIGINT."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from django_reliable_executor.connections import drop_unusable_connections
from django_reliable_executor.exceptions import StorageUnavailableError
from django_reliable_executor.management.tables import tables_missing
from django_reliable_executor.management.worker_id import check_worker_id
from django_reliable_executor.management.worker_output import (
    LEVELS,
    banner_lines,
    configure_logging,
    log_stop_request,
)
from django_reliable_executor.observability import metrics
from django_reliable_executor.service.reliable_executor import executor
from django_reliable_executor.worker.worker import Worker, WorkerOptions, format_queues


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def _non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(value)
    return number


def parse_queues(value: str) -> tuple[tuple[str, ...], dict[str, int]]:
    """``mail:2,reports:1,default`` -> the queue names in order, and the limits given."""
    queues: list[str] = []
    limits: dict[str, int] = {}
    for item in value.split(","):
        name, sep, limit = (part.strip() for part in item.partition(":"))
        if not name:
            if sep or limit:
                raise CommandError(f"--queues: empty queue name in {item.strip()!r}")
            continue  # stray comma, as before
        if name in queues:
            raise CommandError(f"--queues: queue {name!r} is named twice")
        queues.append(name)
        if sep:
            try:
                limits[name] = _positive_int(limit)
            except ValueError:
                raise CommandError(
                    f"--queues: the limit of queue {name!r} must be an integer >= 1, not {limit!r}"
                ) from None
    if not queues:
        raise CommandError("--queues needs at least one queue name")
    return tuple(queues), limits


class Command(BaseCommand):
    help = "Run a reliable-executor worker: claim due tasks and execute them."

    def get_check_kwargs(self, options: dict[str, Any]) -> Any:
        """Run the database checks (Django 6) on the worker's own database only: an unrelated
        alias that is down must not keep workers from starting."""
        kwargs = super().get_check_kwargs(options)  # Django 6.0+ only calls this
        try:
            settings = executor.settings
        except ImproperlyConfigured:
            return kwargs  # the checks that follow report every bad key (E001), cleanly
        # From the settings, not the storage: Django runs these before handle(), and building
        # a Redis Cluster client already connects.
        if settings.task_database is not None and not options.get("wait"):
            kwargs["databases"] = [settings.task_database]  # it answers (E006)
        else:
            # Redis is checked in handle() (E008): Django's own checks of a database that a
            # Redis worker may not even use must not keep it from starting. With --wait,
            # handle() waits for the store instead of refusing.
            kwargs["databases"] = []
        return kwargs

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues",
            default="default",
            help="comma-separated queue names, each optionally with its own concurrency limit: "
            "mail:2,reports:1,default",
        )
        add_pool_arguments(parser)
        parser.add_argument("--worker-id", default=None, help="default: hostname-pid-random")
        parser.add_argument(
            "--metrics-port", type=int, default=None, help="serve Prometheus metrics"
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            default=30.0,
            help="seconds running handlers get to finish after SIGTERM (default 30)",
        )
        parser.add_argument(
            "--loglevel",
            type=str.upper,
            choices=LEVELS,
            default=None,
            help="level of the django_reliable_executor logger (default INFO: a line per task "
            "transition; -v 0: WARNING, -v 2: DEBUG). Without a LOGGING entry of its own for "
            "that logger, its lines go to stderr",
        )
        parser.add_argument(
            "--wait",
            action="store_true",
            help="wait for the task store (the database or Redis) to answer at start, with one "
            "line per attempt, instead of refusing to start",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="exit 0 once nothing of these queues is running or due within 60 s",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        refuse_inside_a_transaction()
        worker_options = worker_options_from(options)
        # The options are good: now the store (bad options are refused without touching it).
        if options["wait"]:
            wait_for_the_store(self.stderr)
        elif executor.settings.task_database is None:  # not one Django's checks looked at
            refuse_without_redis()
        missing = tables_missing(executor.storage)
        if missing is not None:
            raise CommandError(f"runexecutor cannot start: {missing}")
        configure_logging(options["verbosity"], options["loglevel"])
        metrics_port = options["metrics_port"]
        if metrics_port is None:
            metrics_port = executor.settings.METRICS_PORT
        if metrics_port is not None:
            metrics.serve(metrics_port)
        try:
            worker = Worker(worker_options, executor)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None

        def on_signal(signum: int, frame: Any) -> None:
            again = worker.stopping.is_set()
            worker.request_stop()
            # Logged from a thread: the handler may have interrupted the main thread anywhere.
            threading.Thread(
                target=log_stop_request,
                args=(signal.Signals(signum).name, again, worker_options.shutdown_timeout),
                daemon=True,
            ).start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            # A stop asked for meanwhile (the process pool's children take seconds to set
            # Django up) is kept: run() then stops at once.
            worker.prepare()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        described = format_queues(worker_options.queues, worker_options.queue_limits)
        self.stdout.write(f"runexecutor {worker.worker_id}: queues {described}")
        if options["verbosity"] >= 1:
            for line in banner_lines():
                self.stdout.write(line)
        self.stdout.flush()
        code = worker.run()
        if code:
            sys.exit(code)


def add_pool_arguments(parser: CommandParser) -> None:
    """The options of the worker's pools: threads, the event loop, child processes."""
    parser.add_argument("--core-pool-size", type=_positive_int, default=None)
    parser.add_argument("--max-pool-size", type=_positive_int, default=None)
    parser.add_argument("--queue-capacity", type=int, default=None)
    parser.add_argument(
        "--async-concurrency",
        type=_non_negative_int,
        default=None,
        help="most async handlers running at once on the worker's event loop "
        "(default ASYNC_CONCURRENCY, 100); 0: each takes a pool thread",
    )
    parser.add_argument(
        "--pool",
        choices=("thread", "process"),
        default=None,
        help="where synchronous handlers run: pool threads (default POOL, thread), or "
        "--max-pool-size child processes (for CPU-bound handlers; hard time limits)",
    )
    parser.add_argument(
        "--max-tasks-per-child",
        type=_positive_int,
        default=None,
        help="--pool process: replace a child after N tasks (default MAX_TASKS_PER_CHILD: never)",
    )


def worker_options_from(options: dict[str, Any]) -> WorkerOptions:
    """The command's options checked (CommandError names a bad one) into the worker's."""
    queues, queue_limits = parse_queues(options["queues"])
    if options["queue_capacity"] is not None and options["queue_capacity"] < 0:
        raise CommandError("--queue-capacity must be >= 0")
    if options["shutdown_timeout"] < 0:
        raise CommandError("--shutdown-timeout must be >= 0")
    check_worker_id(options["worker_id"])
    worker_options = WorkerOptions.from_settings(
        executor,
        queues=queues,
        queue_limits=queue_limits,
        core_pool_size=options["core_pool_size"],
        max_pool_size=options["max_pool_size"],
        queue_capacity=options["queue_capacity"],
        async_concurrency=options["async_concurrency"],
        pool=options["pool"],
        max_tasks_per_child=options["max_tasks_per_child"],
        worker_id=options["worker_id"],
        shutdown_timeout=options["shutdown_timeout"],
        burst=options["burst"],
    )
    if options["max_tasks_per_child"] is not None and worker_options.pool != "process":
        raise CommandError("--max-tasks-per-child needs --pool process")
    if (
        worker_options.pool == "thread"
        and worker_options.max_pool_size < worker_options.core_pool_size
    ):
        worker_options.max_pool_size = worker_options.core_pool_size
    return worker_options


def refuse_inside_a_transaction() -> None:
    """A worker started inside an open transaction (call_command in a django.test.TestCase)
    would wait forever: its threads use connections of their own, which do not see the
    transaction's rows and wait for its locks (SQLite's "database table is locked")."""
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            raise CommandError(
                f"runexecutor cannot run inside an open transaction (database "
                f"{connection.alias!r}; django.test.TestCase wraps every test in one): its "
                "worker threads use connections of their own, which would wait for this "
                "transaction forever. In a test, run the tasks with "
                "django_reliable_executor.testing.run_tasks() instead (see docs/testing.md), "
                "or start the worker from a TransactionTestCase."
            )


def wait_for_the_store(out: Any) -> None:
    """Until the task store answers a read: one line per attempt, every 1 s doubling to 10 s
    (Ctrl-C or SIGTERM ends the wait, and the command)."""
    pause = 1.0
    while True:
        try:
            executor.master()
            return
        except (StorageUnavailableError, DatabaseError) as exc:
            drop_unusable_connections()
            out.write(f"waiting for the task store: {exc}; again in {pause:g}s")
            time.sleep(pause)
            pause = min(pause * 2, 10.0)


def refuse_without_redis() -> None:
    """Redis that does not answer: refused at start, as the database is (E006), in one line
    rather than a traceback per retry."""
    try:
        executor.master()
    except StorageUnavailableError as exc:
        raise CommandError(
            f"{str(exc).rstrip('.')}. Start Redis (or fix REDIS_URL); `runexecutor --wait` "
            "waits for it instead."
        ) from None
