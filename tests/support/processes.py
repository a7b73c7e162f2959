"""Start, watch and stop ``manage.py runexecutor`` subprocesses for the process tests, on a
database alias or on Redis."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from demo.models import Execution
from django.db import connections
from django.db.models import QuerySet

from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.base import TaskStorage
from tests.conftest import REDIS_SHARDS, REDIS_URL, new_storage

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
MANAGE = ROOT / "testproject" / "manage.py"
READY_BANNER = "runexecutor "
# The timings of the process tests that lose a worker or a master: short, so a dead worker's
# leases (renewed every LEASE / 4) lapse and a dead master's lock is taken over within a test.
# A file that needs other timings defines its own and says why.
LEASE = 2.0  # seconds
MASTER_TTL = 2.0  # seconds
FAST = {"lease_timeout": LEASE, "master_lock_ttl": MASTER_TTL}
# Settings of the test project that a subprocess must not inherit from the caller's shell.
_OVERRIDDEN = (
    "RE_DATABASE",
    "RE_DEBUG",
    "RE_TEST_DB_NAMES",
    "RE_LEASE_TIMEOUT",
    "RE_MASTER_LOCK_TTL",
    "RE_POLL_INTERVAL",
    "RE_LOG_LEVEL",
    "RE_STORAGE",
    "RE_REDIS_URL",
    "RE_REDIS_CLUSTER",
    "RE_REDIS_SHARDS",
    "RE_KEY_PREFIX",
    "RE_OTEL_SPANS",
    "RE_LOG_JSON",
    "RE_BLOCK_IMPORTS",
    "RE_IMPORT_ATTEMPTS",
)
# Where testproject/settings.py reads each alias's database name from.
_NAME_VARIABLES = {
    "default": "RE_SQLITE_PATH",
    "mariadb": "RE_MARIADB_NAME",
    "postgres": "RE_POSTGRES_NAME",
}


@dataclasses.dataclass(frozen=True)
class Backend:
    """Where one test and its subprocesses store tasks: a database alias, or Redis under the
    test's own key prefix. The demo app's tables (Execution rows) are in ``db_alias``."""

    name: str  # "default" (SQLite), "mariadb", "postgres" or "redis": the alias parameter
    key_prefix: str  # the key_prefix fixture's; only Redis uses it
    redis_url: str = REDIS_URL  # another server's (a throw-away one the test restarts)
    redis_cluster: bool = False  # redis_url is one node of a Redis Cluster (REDIS_CLUSTER)
    shards: int = REDIS_SHARDS  # REDIS_SHARDS of the Redis storage

    @property
    def db_alias(self) -> str:
        """The test database of the demo app's tables: beside Redis, the SQLite default one."""
        return "default" if self.name == "redis" else self.name

    def storage(self) -> TaskStorage:
        """A storage over the same tasks the subprocesses see (real clock)."""
        if self.redis_cluster:
            from django_reliable_executor.conf import ExecutorSettings
            from django_reliable_executor.registry import FLOW_LIMITS
            from django_reliable_executor.storage import build_storage

            settings = ExecutorSettings(
                STORAGE="redis",
                REDIS_URL=self.redis_url,
                REDIS_CLUSTER=True,
                KEY_PREFIX=self.key_prefix,
            )
            return build_storage(settings, flow_limits=FLOW_LIMITS)
        return new_storage(self.name, self.key_prefix, redis_url=self.redis_url, shards=self.shards)

    def environment(self) -> dict[str, str]:
        """The RE_* variables that point a subprocess's settings at this backend, and at
        exactly the test database this test uses (whatever suffix pytest-django or the
        settings added), not the name the subprocess's settings would derive."""
        database = str(connections[self.db_alias].settings_dict["NAME"])
        env = {
            "RE_DATABASE": self.db_alias,
            _NAME_VARIABLES[self.db_alias]: database,
            "RE_DB_SUFFIX": "",
        }
        if self.name == "redis":
            env.update(
                RE_STORAGE="redis", RE_REDIS_URL=self.redis_url, RE_KEY_PREFIX=self.key_prefix
            )
            if self.redis_cluster:
                env["RE_REDIS_CLUSTER"] = "1"
            if self.shards > 1:
                env["RE_REDIS_SHARDS"] = str(self.shards)
        return env


def pid_gone(pid: int) -> bool:
    """Whether no process has this pid (it exited and was reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def complete_lines(path: Path | str) -> list[str]:
    """The newline-terminated lines of a file other processes may still be appending to: a
    reader can catch a write half-copied (a read is not atomic with a write on a regular
    file), and the rest of that line arrives with the next read."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return [line for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def read_journal(path: Path | str) -> list[dict]:
    """The records the demo handlers appended to a journal file (RE_JOURNAL), read while
    workers may still be writing (see complete_lines). A complete line that does not parse is
    a write cut short by SIGKILL with the next record appended to it; that next record is
    kept, the cut one (which never finished) is not."""
    records = []
    for line in complete_lines(path):
        try:
            records.append(json.loads(line))
        except ValueError:
            head = line.rfind('{"task"')
            if head > 0:
                with contextlib.suppress(ValueError):
                    records.append(json.loads(line[head:]))
    return records


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    message: str,
    *,
    interval: float = 0.05,
    logs: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail the test
    with ``message`` (and the workers' logs) once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = f"\n--- worker logs ---\n{logs()}" if logs is not None else ""
            raise AssertionError(f"timed out after {timeout:.1f}s: {message}{detail}")
        time.sleep(interval)


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, get SIGKILL when the test run itself dies, so no
    worker outlives an interrupted pytest."""
    if sys.platform == "linux":
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class WorkerProcess:
    """One ``runexecutor`` subprocess; its stdout and stderr go to a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path, worker_id: str):
        self.worker_id = worker_id
        self.log_path = log_path
        with open(log_path, "wb") as log_file:  # the child keeps its own descriptor
            self.popen = subprocess.Popen(
                [sys.executable, str(MANAGE), "runexecutor", "--worker-id", worker_id, *args],
                cwd=ROOT,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the command printed its banner (settings loaded, worker built)."""

        def ready() -> bool:
            if not self.alive():
                raise AssertionError(
                    f"worker {self.worker_id} exited with {self.returncode} before it was ready:"
                    f"\n{self.log()}"
                )
            return READY_BANNER in self.log()

        wait_until(ready, timeout, f"worker {self.worker_id} did not start", logs=self.log)

    def terminate(self) -> None:
        """SIGTERM: a graceful stop (a second one is a hard stop)."""
        self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, then reap the process: it held nothing it could clean up."""
        if self.alive():
            self.popen.kill()
        self.wait(10)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit and return its exit code; fail the test on timeout."""
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.worker_id} still running after {timeout:.1f}s:\n{self.log()}"
            )
        return code


class Workers:
    """Starts runexecutor processes for one test and kills every leftover at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[WorkerProcess] = []

    def start(
        self,
        backend: Backend,
        *args: str,
        worker_id: str | None = None,
        lease_timeout: float | None = None,
        master_lock_ttl: float | None = None,
        poll_interval: float | None = 0.2,
        log_level: str = "INFO",
        wait_ready: bool = True,
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        """Start ``manage.py runexecutor *args`` on ``backend`` (``env``: extra variables)."""
        worker_id = worker_id or f"w{len(self.started) + 1}-{uuid.uuid4().hex[:6]}"
        extra = env or {}
        env = {k: v for k, v in os.environ.items() if k not in _OVERRIDDEN}
        env.update(
            DJANGO_SETTINGS_MODULE="testproject.settings",
            PYTHONUNBUFFERED="1",
            RE_DEBUG="0",  # as in production: DEBUG would keep every query in memory
            RE_LOG_LEVEL=log_level,
        )
        env.update(backend.environment())
        for variable, value in (
            ("RE_LEASE_TIMEOUT", lease_timeout),
            ("RE_MASTER_LOCK_TTL", master_lock_ttl),
            ("RE_POLL_INTERVAL", poll_interval),
        ):
            if value is not None:
                env[variable] = str(value)
        env.update(extra)
        process = WorkerProcess(list(args), env, self.log_dir / f"{worker_id}.log", worker_id)
        self.started.append(process)
        if wait_ready:
            process.wait_ready()
        return process

    def logs(self) -> str:
        return "\n".join(f"=== {p.worker_id} (pid {p.pid}) ===\n{p.log()}" for p in self.started)

    def by_id(self, worker_id: str | None) -> WorkerProcess | None:
        return next((p for p in self.started if p.worker_id == worker_id), None)

    def kill_all(self) -> None:
        """SIGKILL and reap every process still running (teardown)."""
        for process in self.started:
            if process.alive():
                process.popen.kill()
        for process in self.started:
            process.popen.wait()


def service_for(backend: Backend) -> ReliableExecutor:
    """A service over the same storage the subprocesses store tasks in (real clock)."""
    return ReliableExecutor(backend.storage())


def executions(backend: Backend, task_id: str | None = None) -> QuerySet[Execution]:
    """Rows demo.record wrote, one per handler execution, oldest first."""
    rows = Execution.objects.using(backend.db_alias).order_by("pk")
    return rows.filter(task_id=task_id) if task_id is not None else rows


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most of ``intervals`` (start, end) that overlap at any instant, from the handlers'
    own records of when they ran."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = peak = 0
    for _, step in events:  # an end sorts before a start at the same instant
        now += step
        peak = max(peak, now)
    return peak


def most_in_a_window(times: list[float], window: float) -> int:
    """The most of ``times`` in any sliding window of ``window`` seconds (the rate limits'
    promise, read from the handlers' own records of their starts)."""
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


def journal_lines(path) -> list[dict]:
    return read_journal(path)
