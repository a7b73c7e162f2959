"""manage.py demo: submit a realistic mix of tasks, run a worker, watch them settle, show the table.

What it shows, in order:
  1. submitting: one ``submit_many`` batch, single ``submit_task`` calls with per-task options,
     an idempotent re-submit, a submit rolled back with its transaction, two refused submits;
  2. ``runexecutor`` as a subprocess (its log goes to a file), with a live count by status;
  3. a cancel of a delayed task and of a running one while the worker works;
  4. a schedule firing every second meanwhile (the worker holding the master lock fires it);
  5. SIGTERM to the worker once every task is terminal, and a table of the final statuses.

Every run uses fresh task ids (``demo-<run>-...``), so it can be run again and again; tasks of
earlier runs stay in the database (and the admin) until FINISHED_RETENTION purges them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from demo.tasks import OrderParam
from django_reliable_executor import (
    TaskInfo,
    TaskStatus,
    TaskSubmitError,
    TaskSubmitRequest,
    executor,
)
from django_reliable_executor.conf import get_settings

S = TaskStatus
STATUS_ORDER = [
    S.CREATED,
    S.PENDING,
    S.RUNNING,
    S.COMPLETED,
    S.FAILED,
    S.TIMEOUT,
    S.CANCELLED,
    S.ERROR,
]
COLORS = {
    S.CREATED: "37",
    S.PENDING: "33",
    S.RUNNING: "36",
    S.COMPLETED: "32",
    S.FAILED: "31",
    S.TIMEOUT: "35",
    S.CANCELLED: "2",
    S.ERROR: "1;31",
}
REFRESH_SECONDS = 0.2
CANCEL_WAITING_AFTER = 1.0  # seconds after the worker starts: the delayed task sat there a while
# The testproject's log format: "2024-01-01 12:00:00,123 LEVEL logger message".
LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d [\d:,.]+ (?P<level>[A-Z]+) (?P<logger>\S+) (?P<message>.*)$"
)


class Rollback(Exception):
    """Raised inside atomic() to roll the demo's transaction back."""


@dataclasses.dataclass
class Scenario:
    request: TaskSubmitRequest
    story: str
    expected: TaskStatus
    cancel: str | None = None  # "waiting": cancel while delayed; "running": cancel once RUNNING
    cancelled: bool = False

    @property
    def task_id(self) -> str:
        assert self.request.task_id is not None
        return self.request.task_id


def build_scenarios(prefix: str) -> tuple[list[Scenario], list[Scenario]]:
    """(orders submitted as one batch, everything else submitted one by one)."""

    def request(key: str, name: str, parameter: Any = None, **options: Any) -> TaskSubmitRequest:
        return TaskSubmitRequest(
            task_name=name, task_parameter=parameter, task_id=f"{prefix}-{key}", **options
        )

    orders = [
        Scenario(
            request(f"order-{order_id}", "demo.process_order", OrderParam(order_id, amount, cur)),
            "an order, paid at once",
            S.COMPLETED,
        )
        for order_id, amount, cur in (
            (1001, 19.99, "EUR"),
            (1002, 5.00, "USD"),
            (1003, 120.00, "EUR"),
            (1004, 42.50, "GBP"),
        )
    ]
    orders.append(
        Scenario(
            request("order-1005", "demo.process_order", OrderParam(1005, -5.0)),
            "declined: PaymentDeclined is outside retry_on, so no retry",
            S.FAILED,
        )
    )
    singles = [
        Scenario(
            request("flaky-once", "demo.flaky", {"fail_times": 1}),
            "fails once, succeeds on the retry 100 ms later",
            S.COMPLETED,
        ),
        Scenario(
            request(
                "flaky-thrice",
                "demo.flaky",
                {"fail_times": 3},
                retry_backoff="exponential",
                retry_interval=200,
            ),
            "fails 3 times; exponential backoff ~200, 400, 800 ms",
            S.COMPLETED,
        ),
        Scenario(
            request("always-fails", "demo.always_fails"),
            "fails every attempt: 1 run + 3 retries, then FAILED",
            S.FAILED,
        ),
        Scenario(
            request(
                "retry-deadline",
                "demo.always_fails",
                retry_limit=10,
                retry_interval=1000,
                max_duration_millis=2500,
            ),
            "retries every second until its 2.5 s max duration passes",
            S.TIMEOUT,
        ),
        Scenario(
            request("slow-deadline", "demo.slow", {"seconds": 30}, max_duration_millis=2000),
            "a 30 s job with a 2 s max duration: TIMEOUT while running",
            S.TIMEOUT,
        ),
        Scenario(
            request("slow-1s", "demo.slow", {"seconds": 1}),
            "a 1 s job",
            S.COMPLETED,
        ),
        Scenario(
            request("echo-priority", "demo.echo", {"hello": "world"}, priority=10),
            "priority=10: of the tasks due, higher priority is claimed first",
            S.COMPLETED,
        ),
        Scenario(
            request("cancel-delayed", "demo.echo", {"remind": "later"}, delay_millis=60_000),
            "delayed by 60 s, cancelled while it waits",
            S.CANCELLED,
            cancel="waiting",
        ),
        Scenario(
            request("cancel-running", "demo.slow", {"seconds": 30}),
            "a 30 s job cancelled while running (it polls context.is_cancelled())",
            S.CANCELLED,
            cancel="running",
        ),
    ]
    return orders, singles


class Command(BaseCommand):
    help = (
        "Submit a mix of demo tasks, run a worker until they settle, and print their final "
        "statuses. Needs a migrated database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--timeout",
            type=float,
            default=60.0,
            help="give up waiting for the tasks after this many seconds (default 60)",
        )

    # -- output helpers -------------------------------------------------------------------
    def _setup_output(self, options: dict[str, Any]) -> None:
        self.tty = self.stdout.isatty()
        self.color = self.tty and not options.get("no_color") and not os.environ.get("NO_COLOR")
        encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
        self.fancy = self.tty and encoding.replace("-", "") == "utf8"

    def _paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def _status(self, status: TaskStatus, width: int = 0) -> str:
        return self._paint(str(status).ljust(width), COLORS[status])

    def _say(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def _heading(self, text: str) -> None:
        self._say("")
        self._say(self._paint(text, "1"))

    @staticmethod
    def _width() -> int:
        return shutil.get_terminal_size((100, 24)).columns

    # -- the demo -------------------------------------------------------------------------
    def handle(self, *args: Any, **options: Any) -> None:
        self._setup_output(options)
        alias = get_settings().DATABASE_ALIAS
        self._check_migrated(alias)
        prefix = f"demo-{uuid.uuid4().hex[:6]}"
        orders, singles = build_scenarios(prefix)
        scenarios = orders + singles

        log_path = Path(tempfile.gettempdir()) / f"reliable-executor-{prefix}.log"
        self._heading("1. Starting a worker: manage.py runexecutor")
        worker = self._start_worker(log_path)
        finished = False
        try:
            self._wait_ready(worker, log_path)
            self._heading(f"2. Submitting {len(scenarios)} tasks (run {prefix})")
            self._submit(orders, singles)
            self._show_guards(prefix, orders[0])
            schedule_id = self._start_schedule(prefix)
            self._heading("3. Watching them settle")
            finished = self._watch(worker, scenarios, log_path, options["timeout"])
        except KeyboardInterrupt:
            self._say("\ninterrupted")
            self._stop_worker(worker)
            raise CommandError("demo interrupted; the worker was stopped") from None
        except BaseException:
            self._stop_worker(worker)
            raise
        finally:
            if self.tty:
                self.stdout.write("\x1b[?25h", ending="")  # show the cursor again
        self._heading("4. Stopping the worker with SIGTERM")
        code = self._stop_worker(worker)
        self._say(f"   worker exited with code {code}")

        self._heading("5. The schedule")
        self._show_schedule(schedule_id)

        self._heading("6. Final statuses")
        surprises = self._table(scenarios)
        self._closing(log_path)
        if not finished:
            raise CommandError(f"not every task finished within {options['timeout']:.0f} s")
        if surprises:
            raise CommandError(f"{surprises} task(s) ended in an unexpected status (marked !)")
        if self.guard_failures:
            raise CommandError(f"{self.guard_failures} submit check(s) above were UNEXPECTED")
        if code != 0:
            raise CommandError(f"the worker exited with code {code}; see {log_path}")

    def _start_schedule(self, prefix: str) -> str:
        """A schedule firing demo.echo every second while the demo runs."""
        schedule_id = f"{prefix}-every-second"
        info = executor.schedule(
            schedule_id,
            "demo.echo",
            {"beat": True},
            every=1,
            start_at=timezone.now().replace(microsecond=0) + dt.timedelta(seconds=1),
            misfire="catch_up",
        )
        self._say(
            f"   executor.schedule({schedule_id!r}, 'demo.echo', every=1): {info.describe()}, "
            f"first run {info.next_run_at:%H:%M:%S} UTC"
        )
        return schedule_id

    def _show_schedule(self, schedule_id: str) -> None:
        """What the schedule fired: one task per planned second, ids derived from the plan."""
        executor.delete_schedule(schedule_id)
        fired = sorted(
            (
                task
                for task in executor.list_tasks(task_name="demo.echo", limit=10_000)
                if task.task_id.startswith(schedule_id + "@")
            ),
            key=lambda task: task.run_at,
        )
        planned = [task.run_at for task in fired]
        every_second = all(
            (later - earlier).total_seconds() == 1 for earlier, later in itertools.pairwise(planned)
        )
        if not fired or not every_second:
            self.guard_failures += 1
            self._say(f"   UNEXPECTED: the schedule fired {len(fired)} run(s): {planned}")
            return
        done = sum(task.status is TaskStatus.COMPLETED for task in fired)
        self._say(
            f"   fired {len(fired)} runs, one per planned second, {done} completed; "
            f"task ids like {fired[0].task_id}"
        )
        self._say("   (deleted now; the tasks it fired stay)")

    def _check_migrated(self, alias: str) -> None:
        connection = connections[alias]
        migrations = MigrationExecutor(connection)
        if migrations.migration_plan(migrations.loader.graph.leaf_nodes()):
            raise CommandError(
                f"the {alias!r} database is not migrated: run "
                "python testproject/manage.py migrate first"
            )

    def _submit(self, orders: list[Scenario], singles: list[Scenario]) -> None:
        # One validated batch, one INSERT: a bad request in it would store none of them.
        executor.submit_many([s.request for s in orders])
        self._say(
            f"   submit_many: {len(orders)} orders of demo.process_order in one batch "
            f"({orders[0].task_id} .. {orders[-1].task_id.rsplit('-', 1)[-1]})"
        )
        for scenario in singles:
            executor.submit_task(scenario.request)
        width = max(len(s.task_id) for s in singles)
        self._say("   submit_task, one by one:")
        for scenario in singles:
            self._say(f"     {scenario.task_id.ljust(width)}  {scenario.story}")

    def _show_guards(self, prefix: str, first_order: Scenario) -> None:
        """What the executor refuses or deduplicates; none of this stores a task."""
        self.guard_failures = 0
        stored = dataclasses.asdict(first_order.request.task_parameter)
        again = executor.submit(
            "demo.process_order", OrderParam(1001, 999.0), task_id=first_order.task_id
        )
        self.guard_failures += again.parameter != stored
        self._say(
            f"   same task_id again: returns the stored task unchanged "
            f"(amount {again.parameter['amount']}, status {again.status}): nothing queued twice"
        )
        rolled_back = f"{prefix}-rolled-back"
        try:
            with transaction.atomic(using=get_settings().DATABASE_ALIAS):
                executor.submit("demo.echo", {"x": 1}, task_id=rolled_back)
                raise Rollback
        except Rollback:
            pass
        found = executor.get_task(rolled_back)
        self.guard_failures += found is not None
        self._say(
            "   submit inside a transaction that rolls back: "
            + ("no task stored" if found is None else f"UNEXPECTED: {found.status}")
        )
        refused = [
            ("demo.process_order", {"order_id": "abc", "amount": 1}),
            ("demo.no_such_task", None),
        ]
        for name, parameter in refused:
            try:
                executor.submit(name, parameter)
            except TaskSubmitError as exc:
                self._say(f"   refused: {type(exc).__name__}: {exc}")
            else:
                self.guard_failures += 1
                self._say(f"   UNEXPECTED: submitting {name} with {parameter!r} was accepted")

    def _start_worker(self, log_path: Path) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.setdefault("RE_LOG_LEVEL", "INFO")
        manage_py = Path(settings.BASE_DIR) / "manage.py"
        command = [
            sys.executable,
            str(manage_py),
            "runexecutor",
            "--core-pool-size",
            "4",
            "--max-pool-size",
            "8",
            "--shutdown-timeout",
            "10",
        ]
        self._say(f"   {' '.join(['python', 'testproject/manage.py', *command[2:]])}")
        with open(log_path, "wb") as log:
            return subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )

    def _wait_ready(self, worker: subprocess.Popen[bytes], log_path: Path) -> None:
        """Wait for the worker's start-up line, so deadlines below count from a running worker."""
        log = _LogTail(log_path)
        started = time.monotonic()
        while time.monotonic() - started < 60:
            # The banner's first line; the handler list after it can be long (48 here).
            if any(line.startswith("runexecutor ") for line in log.head(5)):
                self._say(f"   worker running (pid {worker.pid}); its log: {log_path}")
                return
            if worker.poll() is not None:
                tail = "\n     ".join(log.tail(15))
                raise CommandError(
                    f"the worker exited at start with code {worker.returncode}:\n     {tail}"
                )
            time.sleep(0.1)
        raise CommandError(f"the worker did not start within 60 s; see {log_path}")

    def _stop_worker(self, worker: subprocess.Popen[bytes]) -> int:
        """SIGTERM: stop claiming, finish running handlers, exit. A second signal is a hard stop."""
        if worker.poll() is not None:
            return worker.returncode
        worker.send_signal(signal.SIGTERM)
        try:
            return worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.send_signal(signal.SIGTERM)
        try:
            return worker.wait(timeout=5)
        except subprocess.TimeoutExpired:
            worker.kill()
            return worker.wait()

    # -- watching -------------------------------------------------------------------------
    def _watch(
        self,
        worker: subprocess.Popen[bytes],
        scenarios: list[Scenario],
        log_path: Path,
        timeout: float,
    ) -> bool:
        """Refresh the counts until every task is terminal; True if they all got there."""
        started = time.monotonic()
        events: deque[str] = deque(maxlen=3)
        log = _LogTail(log_path)
        drawn = 0
        last_plain = ""
        last_plain_at = 0.0
        if self.tty:
            self.stdout.write("\x1b[?25l", ending="")  # hide the cursor while redrawing
        while True:
            elapsed = time.monotonic() - started
            tasks = {s.task_id: executor.get_task(s.task_id) for s in scenarios}
            for message in self._cancel_due(scenarios, tasks, elapsed):
                events.append(message)
                if not self.tty:
                    self._say(f"   {elapsed:5.1f}s  {message}")
            events.extend(log.new_events())
            counts = {status: 0 for status in STATUS_ORDER}
            for task in tasks.values():
                if task is not None:
                    counts[task.status] += 1
            settled = sum(1 for t in tasks.values() if t is not None and t.is_terminal)
            done = settled == len(scenarios)
            if self.tty:
                drawn = self._draw(drawn, counts, settled, len(scenarios), elapsed, events)
            else:
                line = self._plain_counts(counts)
                if line != last_plain and (done or time.monotonic() - last_plain_at >= 0.5):
                    self._say(f"   {elapsed:5.1f}s  {settled}/{len(scenarios)} settled  {line}")
                    last_plain, last_plain_at = line, time.monotonic()
            if done:
                return True
            if worker.poll() is not None:
                self._say(f"   the worker exited early with code {worker.returncode}:")
                self._say("     " + "\n     ".join(log.tail(15)))
                return False
            if elapsed > timeout:
                self._say(f"   still not settled after {timeout:.0f} s, giving up")
                return False
            time.sleep(REFRESH_SECONDS)

    def _cancel_due(
        self, scenarios: list[Scenario], tasks: dict[str, TaskInfo | None], elapsed: float
    ) -> list[str]:
        messages = []
        for scenario in scenarios:
            task = tasks[scenario.task_id]
            if scenario.cancelled or task is None:
                continue
            waiting = scenario.cancel == "waiting" and elapsed >= CANCEL_WAITING_AFTER
            running = scenario.cancel == "running" and task.status is S.RUNNING
            if waiting or running:
                scenario.cancelled = True
                accepted = executor.cancel_task(scenario.task_id)
                messages.append(
                    f"cancel_task({scenario.task_id!r}) while {task.status} -> {accepted}"
                )
        return messages

    def _plain_counts(self, counts: dict[TaskStatus, int]) -> str:
        return "  ".join(f"{status} {counts[status]}" for status in STATUS_ORDER)

    def _draw(
        self,
        drawn: int,
        counts: dict[TaskStatus, int],
        settled: int,
        total: int,
        elapsed: float,
        events: deque[str],
    ) -> int:
        """Redraw the progress block in place; returns how many lines it has."""
        width = self._width() - 1  # never wrap: a wrapped line would break the redraw
        bar_width = 30
        filled = round(bar_width * settled / total) if total else bar_width
        full, empty = ("\u2588", "\u2591") if self.fancy else ("#", "-")
        bar = full * filled + empty * (bar_width - filled)
        lines = [
            (f"   [{bar}] {settled}/{total} terminal   {elapsed:4.1f} s", None),
            (
                "   " + "  ".join(f"{status} {counts[status]}" for status in STATUS_ORDER),
                "   "
                + "  ".join(f"{self._status(status)} {counts[status]}" for status in STATUS_ORDER),
            ),
        ]
        for event in list(events) + [""] * ((events.maxlen or 0) - len(events)):
            lines.append((f"   {self._paint('>', '2')} {event}" if event else "", None))
        out = []
        if drawn:
            out.append(f"\x1b[{drawn}F")  # back to the first line of the block
        for plain, painted in lines:
            text = painted if painted is not None and len(plain) <= width else plain[:width]
            out.append(f"\x1b[2K{text}\n")
        self.stdout.write("".join(out), ending="")
        self.stdout.flush()
        return len(lines)

    # -- the result -----------------------------------------------------------------------
    def _table(self, scenarios: list[Scenario]) -> int:
        """Print the final statuses; returns how many differ from what the scenario expects."""
        rows = []
        surprises = 0
        for scenario in scenarios:
            task = executor.get_task(scenario.task_id)
            if task is None:
                rows.append((scenario.task_id, scenario.request.task_name, None, "-", "(missing)"))
                surprises += 1
                continue
            surprise = task.status is not scenario.expected
            surprises += surprise
            rows.append(
                (
                    task.task_id,
                    task.task_name,
                    task.status,
                    str(task.attempts),
                    _outcome(task) + (f"  ! expected {scenario.expected}" if surprise else ""),
                )
            )
        headers = ("TASK ID", "TASK NAME", "STATUS", "ATTEMPTS", "RESULT / LAST ERROR")
        widths = [max(len(headers[i]), *(len(str(row[i] or "")) for row in rows)) for i in range(4)]
        room = max(30, self._width() - 3 - sum(w + 2 for w in widths)) if self.tty else 80
        header = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False))
        self._say(f"   {header}  {headers[4]}")
        for task_id, name, status, attempts, outcome in rows:
            if len(outcome) > room:
                outcome = outcome[: room - 3] + "..."
            shown = self._status(status, widths[2]) if status else "MISSING".ljust(widths[2])
            self._say(
                f"   {task_id.ljust(widths[0])}  {name.ljust(widths[1])}  {shown}  "
                f"{attempts.rjust(widths[3])}  {outcome}"
            )
        counts: dict[str, int] = {}
        for row in rows:
            key = str(row[2] or "MISSING")
            counts[key] = counts.get(key, 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in counts.items())
        self._say("")
        if surprises:
            self._say(f"   {summary}. {surprises} task(s) did not end as expected (marked !).")
        else:
            self._say(f"   {summary}: every task ended as expected.")
        return surprises

    def _closing(self, log_path: Path) -> None:
        venv = _venv_hint()
        # On Redis the admin reads the same tasks when the server runs with the same settings.
        env = "RE_STORAGE=redis " if get_settings().STORAGE == "redis" else ""
        self._heading("Next: browse the tasks in the Django admin")
        if venv:
            self._say(f"   source {venv}/bin/activate")
        self._say("   python testproject/manage.py createsuperuser")
        self._say(f"   {env}python testproject/manage.py runserver")
        self._say("   then open http://127.0.0.1:8000/admin/django_reliable_executor/reliabletask/")
        self._say("")
        self._say(f"   The worker's log: {log_path}")
        self._say(f"   Run the demo again with: {env}bash scripts/demo.sh")


def _outcome(task: TaskInfo) -> str:
    """The result as JSON, or the line of the error that says most."""
    if task.last_error and task.status is not S.COMPLETED:
        lines = [line.strip() for line in task.last_error.strip().splitlines() if line.strip()]
        if not lines:
            return ""
        # A traceback ends with the exception; a message of ours starts with what happened.
        return lines[-1] if lines[0].startswith("Traceback") else lines[0]
    if task.status is S.COMPLETED:
        return json.dumps(task.result, ensure_ascii=False)
    return ""


def _venv_hint() -> str | None:
    """The active virtualenv relative to the current directory, if we run in one."""
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix):
        return None
    try:
        return os.path.relpath(sys.prefix)
    except ValueError:
        return sys.prefix


class _LogTail:
    """Reads the worker's log as it grows and turns its lines into short event texts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.pending = b""

    def new_events(self) -> list[str]:
        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.pending + data
        *complete, self.pending = data.split(b"\n")
        events = []
        for raw in complete:
            match = LOG_LINE.match(raw.decode("utf-8", "replace"))
            if match:
                events.append(f"worker {match['level']}: {match['message']}")
        return events

    def head(self, n: int) -> list[str]:
        try:
            with open(self.path, errors="replace") as log:
                return [line.rstrip("\n") for line in itertools.islice(log, n)]
        except OSError:
            return []

    def tail(self, n: int) -> list[str]:
        try:
            return self.path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return []
