#!/usr/bin/env python
"""Throughput and latency of django-reliable-executor on one store.

    python bench/throughput.py --storage {sqlite,mariadb,postgres,redis} --n 10000

Measures, on a database of its own (never the development or test databases):

1. ``enqueue_per_s``     N ``demo.noop`` tasks submitted one by one (``executor.submit``);
2. ``submit_many_per_s`` N tasks submitted with ``executor.submit_many`` in batches;
3. ``drain_per_s``       those N tasks executed by ONE ``runexecutor`` process with
                         ``--threads`` pool threads: from the worker's ready line to the
                         ``finished_at`` of the last task;
4. ``latency_p50_ms``/``latency_p95_ms``: with that worker idle, tasks submitted
                         ``--latency-interval-ms`` apart; latency = ``started_at - created_at``
                         of the stored rows (submit to handler start).

Beside each rate, the CPU time per task that phase cost, which a busy machine disturbs far less
than the rates: ``enqueue_cpu_us`` and ``submit_many_cpu_us`` of the submitting (benchmark)
process, ``drain_worker_cpu_us`` of the worker process over the drain (from /proc, so Linux).

Prints exactly one JSON line on stdout (with ``rtt_ms``, the median round trip of a trivial
query to the store) and, on Redis, ``redis_bytes_per_task`` (memory per queued task beyond its
parameter, with ``--memory-n`` tasks queued); progress goes to stderr. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

ROOT = Path(__file__).resolve().parent.parent
TESTPROJECT = ROOT / "testproject"
BENCH = ROOT / "bench"
DEFAULT_DB_NAME = "reliable_executor_bench"
DEFAULT_SQLITE_PATH = Path(tempfile.gettempdir()) / "reliable_executor_bench.sqlite3"
TASK_NAME = "demo.noop"
T = TypeVar("T")


def code_version() -> str:
    """HEAD plus a digest of the package's files, so a figure names the code it measured."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((ROOT / "django_reliable_executor").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "unknown"
    return f"HEAD {head}, package digest {digest.hexdigest()[:12]}"


def machine_load() -> str:
    """The load average against the core count: a busy machine makes every figure lower."""
    try:
        load1, load5, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    cores = os.cpu_count() or 1
    note = f"load average {load1:.2f} (1 min) {load5:.2f} (5 min) on {cores} cores"
    if load1 > cores / 2:
        note += " - BUSY: other processes compete for CPU and disk; figures are not representative"
    return note


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchError(RuntimeError):
    """The benchmark cannot go on (bad option, store unreachable, tasks not completing)."""


# --------------------------------------------------------------------------------------------
# Stores: everything that differs between storages lives in one class per storage. A new one
# (Redis) subclasses Store, fills in environment/ensure_exists/clear/rtt_ms and registers
# itself in STORES; the measurements only use the public executor API plus these methods.
# --------------------------------------------------------------------------------------------
class Store:
    """One place tasks can be stored, seen from the benchmark."""

    name = ""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def environment(self) -> dict[str, str]:
        """RE_* variables the settings read to use this store (benchmark and worker)."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def ensure_exists(self) -> None:
        """Create the benchmark's database if missing. Runs before Django is set up."""

    def prepare(self) -> None:
        """Create or update the schema. Runs after Django is set up."""

    def clear(self) -> None:
        """Delete every task (and worker/lock bookkeeping) of the benchmark's store."""
        raise NotImplementedError

    def after_load(self) -> None:
        """Called once N tasks are queued, before the worker starts."""

    def rtt_ms(self, rounds: int) -> float:
        """Median milliseconds of one trivial round trip to the store."""
        raise NotImplementedError

    def close(self) -> None:
        """Drop the benchmark process's connections (the worker opens its own)."""

    # Generic implementations through the public API; stores may answer more cheaply.
    def unfinished(self) -> int:
        """Tasks not in a terminal state."""
        from django_reliable_executor import TaskStatus, executor

        counts = executor.count_by_status()
        return sum(counts[s] for s in (TaskStatus.CREATED, TaskStatus.PENDING, TaskStatus.RUNNING))

    def status_counts(self) -> dict[str, int]:
        from django_reliable_executor import executor

        return {str(s.value): n for s, n in executor.count_by_status().items() if n}

    def drain_window(self) -> tuple[dt.datetime, dt.datetime] | None:
        """(first started_at, last finished_at) over every task, or None if not cheap."""
        return None

    def start_times(self, task_ids: Sequence[str]) -> list[tuple[dt.datetime, dt.datetime]]:
        """(created_at, started_at) of the given tasks, in the given order."""
        from django_reliable_executor import executor

        times = []
        for task_id in task_ids:
            info = executor.get_task(task_id)
            if info is None or info.started_at is None:
                raise BenchError(f"latency task {task_id} was not started: {info}")
            times.append((info.created_at, info.started_at))
        return times


class DatabaseStore(Store):
    """Database storage on one Django alias of the test project's settings."""

    alias = ""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        name = args.db_name
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,62}", name) or name.lower().startswith(
            "test_"
        ):
            raise BenchError(
                f"--db-name {name!r}: letters, digits and underscores only, and never a test "
                "database (test_...)"
            )
        self.db_name = name

    def environment(self) -> dict[str, str]:
        return {"RE_DATABASE": self.alias}

    def _connection(self) -> Any:
        from django.db import connections

        return connections[self.alias]

    def describe(self) -> str:
        settings = self._connection().settings_dict
        return f"{self.name} {settings['HOST']}:{settings['PORT']}/{settings['NAME']}"

    def expected_name(self) -> str:
        return self.db_name

    def prepare(self) -> None:
        from django.core.management import call_command

        # The settings build the name from the environment: make sure it is still ours
        # before deleting anything.
        actual = str(self._connection().settings_dict["NAME"])
        if actual != self.expected_name():
            raise BenchError(
                f"the settings point alias {self.alias!r} at {actual!r}, not at the "
                f"benchmark's {self.expected_name()!r}; refusing to touch it"
            )
        call_command("migrate", database=self.alias, verbosity=0, interactive=False)

    def _tables(self) -> list[str]:
        from django_reliable_executor.models import (
            ReliableDependency,
            ReliableFairKey,
            ReliableLock,
            ReliableParkedKey,
            ReliableSchedule,
            ReliableTask,
            ReliableWorker,
        )

        models = (
            ReliableTask,
            ReliableWorker,
            ReliableLock,
            ReliableSchedule,
            ReliableDependency,
            ReliableFairKey,
            ReliableParkedKey,
        )
        return [m._meta.db_table for m in models]

    def clear(self) -> None:
        connection = self._connection()
        with connection.cursor() as cursor:
            for table in self._tables():
                cursor.execute(f"TRUNCATE TABLE {connection.ops.quote_name(table)}")

    def rtt_ms(self, rounds: int) -> float:
        connection = self._connection()
        samples = []
        with connection.cursor() as cursor:
            for i in range(rounds + 20):
                start = time.perf_counter()
                cursor.execute("SELECT 1")
                cursor.fetchone()
                if i >= 20:  # the first ones warm up the connection
                    samples.append((time.perf_counter() - start) * 1000)
        return statistics.median(samples)

    def close(self) -> None:
        self._connection().close()

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
        connection = self._connection()
        table = connection.ops.quote_name("reliable_executor_task")
        with connection.cursor() as cursor:
            cursor.execute(sql.format(table=table), params)
            return cursor.fetchone()

    def unfinished(self) -> int:
        # Index range on (status, created_at) that shrinks while the queue drains.
        return self._one(
            "SELECT COUNT(*) FROM {table} WHERE status IN (%s, %s, %s)",
            ("CREATED", "PENDING", "RUNNING"),
        )[0]

    def drain_window(self) -> tuple[dt.datetime, dt.datetime] | None:
        from django.db.models import Max, Min

        from django_reliable_executor.models import ReliableTask

        window = ReliableTask.objects.using(self.alias).aggregate(
            first=Min("started_at"), last=Max("finished_at")
        )
        if window["first"] is None or window["last"] is None:
            return None
        return window["first"], window["last"]


class SQLiteStore(DatabaseStore):
    name = "sqlite"
    alias = "default"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.path = Path(args.sqlite_path).resolve()
        if self.path.name.startswith("test_") or self.path.parent == TESTPROJECT:
            raise BenchError(f"--sqlite-path {self.path}: refusing the test project's databases")

    def environment(self) -> dict[str, str]:
        return {**super().environment(), "RE_SQLITE_PATH": str(self.path)}

    def describe(self) -> str:
        return f"sqlite {self.path}"

    def expected_name(self) -> str:
        return str(self.path)

    def ensure_exists(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def clear(self) -> None:
        connection = self._connection()
        with connection.cursor() as cursor:
            for table in self._tables():
                cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")


def postgres_server() -> Any:
    """A connection to the PostgreSQL server's maintenance database (autocommit), where the
    RE_POSTGRES_* variables say (as the test project's settings read them)."""
    import psycopg

    env = os.environ.get
    try:
        return psycopg.connect(
            host=env("RE_POSTGRES_HOST", "127.0.0.1"),
            port=int(env("RE_POSTGRES_PORT", "5432")),
            user=env("RE_POSTGRES_USER", "postgres"),
            password=env("RE_POSTGRES_PASSWORD", ""),
            dbname="postgres",
            autocommit=True,
        )
    except psycopg.Error as exc:
        raise BenchError(f"cannot connect to PostgreSQL: {exc}") from exc


def mariadb_server() -> Any:
    """A connection to the MariaDB/MySQL server, no database selected, where the RE_MARIADB_*
    variables say."""
    import MySQLdb

    env = os.environ.get
    try:
        return MySQLdb.connect(
            host=env("RE_MARIADB_HOST", "127.0.0.1"),
            port=int(env("RE_MARIADB_PORT", "3306")),
            user=env("RE_MARIADB_USER", "root"),
            password=env("RE_MARIADB_PASSWORD", ""),
            charset="utf8mb4",
        )
    except MySQLdb.Error as exc:
        raise BenchError(f"cannot connect to MariaDB/MySQL: {exc}") from exc


class MariaDBStore(DatabaseStore):
    name = "mariadb"
    alias = "mariadb"

    def environment(self) -> dict[str, str]:
        return {**super().environment(), "RE_MARIADB_NAME": self.db_name}

    def ensure_exists(self) -> None:
        conn = mariadb_server()
        try:
            cursor = conn.cursor()
            # Binary collation, as the test database: task ids are case-sensitive.
            cursor.execute(
                f"CREATE DATABASE IF NOT EXISTS `{self.db_name}` "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )
        finally:
            conn.close()

    def after_load(self) -> None:
        with self._connection().cursor() as cursor:
            cursor.execute("ANALYZE TABLE reliable_executor_task")
            cursor.fetchall()


class PostgresStore(DatabaseStore):
    name = "postgres"
    alias = "postgres"

    def environment(self) -> dict[str, str]:
        return {**super().environment(), "RE_POSTGRES_NAME": self.db_name}

    def ensure_exists(self) -> None:
        with postgres_server() as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.db_name,)
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{self.db_name}"')

    def after_load(self) -> None:
        # A freshly truncated table has no statistics; a production table has them.
        with self._connection().cursor() as cursor:
            cursor.execute("ANALYZE reliable_executor_task")


class RedisStore(Store):
    """Redis storage under a key prefix of its own (never FLUSHALL: the server may be shared)."""

    name = "redis"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,62}", args.key_prefix) or (
            args.key_prefix.startswith("test")
        ):
            raise BenchError(
                f"--key-prefix {args.key_prefix!r}: letters, digits, '_', '.', '-' only, and "
                "never a test prefix (test...)"
            )
        self.url = args.redis_url
        self.prefix = args.key_prefix
        self.sqlite_path = Path(args.sqlite_path).resolve()
        self._client: Any = None

    def environment(self) -> dict[str, str]:
        # The SQLite default database is the bench's own file: nothing of the test project's.
        return {
            "RE_BENCH_REDIS_URL": self.url,
            "RE_BENCH_KEY_PREFIX": self.prefix,
            "RE_SQLITE_PATH": str(self.sqlite_path),
        }

    def describe(self) -> str:
        from django_reliable_executor import executor
        from django_reliable_executor.storage.redis.connection import describe

        return f"redis {describe(executor.settings)}, keys under {{{self.prefix}}}:"

    def client(self) -> Any:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(self.url, decode_responses=True)
            try:
                self._client.ping()
            except redis.RedisError as exc:
                raise BenchError(f"cannot reach Redis at {self.url}: {exc}") from exc
        return self._client

    def clear(self) -> None:
        client = self.client()
        keys = list(client.scan_iter(match="{" + self.prefix + "}:*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])

    def rtt_ms(self, rounds: int) -> float:
        client = self.client()
        samples = []
        for i in range(rounds + 20):
            start = time.perf_counter()
            client.ping()
            if i >= 20:
                samples.append((time.perf_counter() - start) * 1000)
        return statistics.median(samples)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def drain_window(self) -> tuple[dt.datetime, dt.datetime] | None:
        client = self.client()
        finished = client.zrange("{" + self.prefix + "}:finished", 0, -1, withscores=True)
        if not finished:
            return None
        pipe = client.pipeline(transaction=False)
        for task_id, _ in finished:
            pipe.hget("{" + self.prefix + "}:t:" + task_id, "st")
        started = [int(value) for value in pipe.execute() if value]
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        return (
            epoch + dt.timedelta(microseconds=min(started)),
            epoch + dt.timedelta(microseconds=int(max(score for _, score in finished))),
        )

    def memory_per_task(self, n: int, batch: int) -> tuple[float, int]:
        """Bytes of Redis memory (INFO used_memory) per queued task beyond its parameter, for
        n queued tasks with a small parameter; and that parameter's size in bytes."""
        from django_reliable_executor import TaskSubmitRequest, executor
        from django_reliable_executor.core.serialization import dumps

        self.clear()
        client = self.client()
        before = client.info("memory")["used_memory"]
        parameter_bytes = 0
        done = 0
        while done < n:
            size = min(batch, n - done)
            parameters = [{"order_id": done + i} for i in range(size)]
            parameter_bytes += sum(len(dumps(p).encode()) for p in parameters)
            executor.submit_many([TaskSubmitRequest("demo.echo", p) for p in parameters])
            done += size
        after = client.info("memory")["used_memory"]
        self.clear()
        return (after - before - parameter_bytes) / n, parameter_bytes // n


STORES: dict[str, type[Store]] = {
    store.name: store for store in (SQLiteStore, MariaDBStore, PostgresStore, RedisStore)
}


# --------------------------------------------------------------------------------------------
# The worker subprocess
# --------------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """In the child: get SIGTERM if the benchmark dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class WorkerProcess:
    """One ``manage.py runexecutor`` child. Its first stdout line means it is ready; its other
    output is copied to our stderr."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str]) -> None:
        command = [sys.executable]
        if args.count_queries:
            command += [str(BENCH / "count_queries.py"), args.count_queries]
        else:
            command += [str(TESTPROJECT / "manage.py")]
        command += [
            "runexecutor",
            "--core-pool-size",
            str(args.threads),
            "--max-pool-size",
            str(args.threads),
            "--shutdown-timeout",
            "10",
        ]
        self.command = command
        self.env = env
        self.process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    def start(self, timeout: float = 60.0) -> float:
        """Start the worker; return time.time() when it reported ready."""
        log("starting worker: " + " ".join(self.command[1:]))
        self.process = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=None,  # the worker's log lines go straight to our stderr
            text=True,
            bufsize=1,
            start_new_session=True,  # Ctrl-C reaches us only; we stop it in order
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        threading.Thread(target=self._read, daemon=True).start()
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise BenchError(f"worker not ready after {timeout:.0f}s") from None
        ready = time.time()
        if line is None:
            raise BenchError(f"worker exited before it was ready (code {self.process.wait()})")
        log(f"worker ready: {line.strip()}")
        return ready

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        first = True
        for line in self.process.stdout:
            if first:
                self._lines.put(line)
                first = False
            else:
                print(f"[worker] {line.rstrip()}", file=sys.stderr, flush=True)
        self._lines.put(None)

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the worker process has used so far, from /proc (Linux);
        its threads included, its children (none) not."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of stat(5)
        return (utime + stime) / os.sysconf("SC_CLK_TCK")

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise BenchError(f"worker exited unexpectedly with code {self.process.returncode}")

    def stop(self) -> None:
        """SIGTERM, wait for the graceful stop; SIGKILL if it does not come."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=20)
            log(f"worker stopped (exit code {code})")
        except subprocess.TimeoutExpired:
            log("worker did not stop within 20s after SIGTERM; killing it")
            process.kill()
            process.wait()


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------
def _progress(total: int, what: str) -> Callable[[int], None]:
    step = max(total // 5, 1)
    started = time.perf_counter()

    def report(done: int) -> None:
        if done % step == 0 and done < total:
            elapsed = time.perf_counter() - started
            log(f"{what}: {done}/{total} ({done / elapsed:.0f}/s)")

    return report


def measure_enqueue(n: int) -> tuple[float, float]:
    """Tasks per second, and this process's CPU microseconds per task."""
    from django_reliable_executor import executor

    report = _progress(n, "submit")
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(1, n + 1):
        executor.submit(TASK_NAME)
        report(i)
    return n / (time.perf_counter() - start), 1e6 * (time.process_time() - cpu) / n


def measure_submit_many(n: int, batch: int) -> tuple[float, float]:
    """Tasks per second, and this process's CPU microseconds per task."""
    from django_reliable_executor import TaskSubmitRequest, executor

    report = _progress(n, "submit_many")
    start, cpu = time.perf_counter(), time.process_time()
    done = 0
    while done < n:
        size = min(batch, n - done)
        executor.submit_many([TaskSubmitRequest(task_name=TASK_NAME) for _ in range(size)])
        done += size
        report(done)
    return n / (time.perf_counter() - start), 1e6 * (time.process_time() - cpu) / n


def wait_until_finished(
    store: Store, worker: WorkerProcess, total: int, *, stall_timeout: float, interval: float
) -> float:
    """Poll until no task is unfinished; return time.time() when that was seen."""
    last_left, last_change, last_log = -1, time.monotonic(), time.monotonic()
    while True:
        left = store.unfinished()
        now = time.monotonic()
        if left == 0:
            return time.time()
        if left != last_left:
            last_left, last_change = left, now
        elif now - last_change > stall_timeout:
            raise BenchError(f"no progress for {stall_timeout:.0f}s, {left} tasks unfinished")
        if now - last_log >= 2.0:
            log(f"  {total - left}/{total} finished")
            last_log = now
        worker.check_alive()
        time.sleep(interval)


def measure_drain(
    store: Store, worker: WorkerProcess, n: int, stall_timeout: float
) -> tuple[float, float]:
    """Tasks per second, and the worker process's CPU microseconds per task over the drain."""
    ready = worker.start()
    cpu_at_ready = worker.cpu_seconds()
    observed = wait_until_finished(store, worker, n, stall_timeout=stall_timeout, interval=0.05)
    cpu = worker.cpu_seconds() - cpu_at_ready
    counts = store.status_counts()
    if counts.get("COMPLETED", 0) != n:
        raise BenchError(f"expected {n} COMPLETED tasks, found {counts}")
    window = store.drain_window()
    if window is None:
        end = observed
    else:
        first_started, last_finished = (t.timestamp() for t in window)
        end = last_finished
        log(
            f"drain: ready->first start {1000 * (first_started - ready):.0f} ms; "
            f"first start->last finish {last_finished - first_started:.2f}s "
            f"= {n / (last_finished - first_started):.0f}/s; "
            f"poll saw the end {1000 * (observed - last_finished):.0f} ms after it"
        )
    seconds = end - ready
    log(f"drain: {n} tasks in {seconds:.2f}s from the worker's ready line, {cpu:.2f}s worker CPU")
    return n / seconds, 1e6 * cpu / n


def measure_latency(
    store: Store, worker: WorkerProcess, count: int, interval_ms: float, settle: float
) -> tuple[float, float]:
    from django_reliable_executor import executor

    log(f"latency: worker idle for {settle:.1f}s, then {count} submits {interval_ms:g} ms apart")
    time.sleep(settle)  # let the idle worker back off to its POLL_INTERVAL
    worker.check_alive()
    ids = []
    start = time.perf_counter()
    for i in range(count):
        pause = start + i * interval_ms / 1000 - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        ids.append(executor.submit(TASK_NAME).task_id)
    wait_until_finished(store, worker, count, stall_timeout=30, interval=0.05)
    times = store.start_times(ids)
    delays = sorted((started - created).total_seconds() * 1000 for created, started in times)
    log(
        f"latency: min {delays[0]:.1f} ms, max {delays[-1]:.1f} ms, "
        f"mean {statistics.fmean(delays):.1f} ms"
    )
    # The idle worker asks once per POLL_INTERVAL: the first task waits for that poll, and so
    # does every task submitted meanwhile. Where that poll falls is luck, so p95 swings from
    # run to run; the split shows wake-up and steady state apart.
    woke = min(started for _, started in times)
    waiting = sum(1 for created, _ in times if created < woke)
    rest = sorted(
        (started - created).total_seconds() * 1000 for created, started in times if created >= woke
    )
    log(
        f"latency: worker woke {(woke - times[0][0]).total_seconds() * 1000:.0f} ms after the "
        f"first submit, {waiting} tasks submitted before that"
        + (
            f"; the {len(rest)} after: p50 {percentile(rest, 50):.1f} ms, "
            f"p95 {percentile(rest, 95):.1f} ms"
            if rest
            else ""
        )
    )
    return percentile(delays, 50), percentile(delays, 95)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    position = (len(sorted_values) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


# --------------------------------------------------------------------------------------------
# Wiring
# --------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Throughput and latency of django-reliable-executor on one store; "
        "prints one JSON line.",
    )
    parser.add_argument("--storage", choices=sorted(STORES), required=True)
    parser.add_argument("--n", type=int, default=10_000, help="tasks per phase (default 10000)")
    parser.add_argument("--batch", type=int, default=1000, help="submit_many batch size")
    parser.add_argument("--threads", type=int, default=8, help="worker pool threads (default 8)")
    parser.add_argument("--latency-n", type=int, default=200, help="latency samples (default 200)")
    parser.add_argument(
        "--latency-interval-ms", type=float, default=20.0, help="gap between latency submits"
    )
    parser.add_argument("--skip-enqueue", action="store_true", help="skip phase 1")
    parser.add_argument("--skip-latency", action="store_true", help="skip phase 4")
    parser.add_argument(
        "--db-name",
        default=DEFAULT_DB_NAME,
        help=f"MariaDB/PostgreSQL database, created if missing (default {DEFAULT_DB_NAME})",
    )
    parser.add_argument(
        "--sqlite-path", default=str(DEFAULT_SQLITE_PATH), help="SQLite file of the benchmark"
    )
    parser.add_argument(
        "--redis-url", default="redis://127.0.0.1:6379/0", help="Redis of --storage redis"
    )
    parser.add_argument(
        "--key-prefix",
        default="reliable_executor_bench",
        help="KEY_PREFIX of --storage redis; only its keys are written and deleted",
    )
    parser.add_argument(
        "--memory-n",
        type=int,
        default=100_000,
        help="--storage redis: queued tasks for the memory-per-task figure (0 = skip)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        help="POLL_INTERVAL for the worker (default: the setting's default, 1.0 s)",
    )
    parser.add_argument(
        "--conn-max-age",
        default=None,
        help="CONN_MAX_AGE for every alias, seconds or 'none' (default: Django's, 0)",
    )
    parser.add_argument("--rtt-rounds", type=int, default=200)
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=120.0,
        help="give up after this many seconds without progress",
    )
    parser.add_argument(
        "--count-queries",
        metavar="FILE",
        default=None,
        help="profile: run the worker under bench/count_queries.py, which writes per-statement "
        "counts to FILE (adds overhead; do not quote its throughput)",
    )
    args = parser.parse_args(argv)
    for key in ("n", "batch", "threads", "latency_n", "rtt_rounds"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1")
    return args


def environment(args: argparse.Namespace, store: Store) -> dict[str, str]:
    """The environment of the benchmark and its worker: bench settings on the bench database."""
    env = dict(os.environ)
    # Never the test databases, and the default POLL_INTERVAL unless asked otherwise.
    for key in (
        "RE_TEST_DB_NAMES",
        "RE_DB_SUFFIX",
        "RE_POLL_INTERVAL",
        "RE_BENCH_CONN_MAX_AGE",
        "RE_STORAGE",
        "RE_KEY_PREFIX",
        "RE_REDIS_URL",
    ):
        env.pop(key, None)
    if args.poll_interval is not None:
        env["RE_POLL_INTERVAL"] = str(args.poll_interval)
    if args.conn_max_age is not None:
        env["RE_BENCH_CONN_MAX_AGE"] = args.conn_max_age
    env.update(store.environment())
    env["DJANGO_SETTINGS_MODULE"] = "bench_settings"
    paths = [str(BENCH), str(TESTPROJECT), str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into an exception, so the worker is stopped on the way out."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclasses.dataclass
class Rounds(Generic[T]):
    """What ``alternate_rounds`` measured: per scenario, each round's result, in order."""

    storage: str
    results: dict[str, list[T]]
    load: list[str]  # the machine's load before and after


def alternate_rounds(
    args: argparse.Namespace, scenarios: Sequence[str], run_round: Callable[[Store, str], T]
) -> Rounds[T] | int:
    """Open the store ``args`` name and run ``run_round(store, scenario)`` for every scenario
    in turn, ``args.rounds`` times over (rounds alternated, so a drift of the machine touches
    each alike), then clear and close the store. The exit code instead after an error (1) or
    an interruption (130), logged."""
    results: dict[str, list[T]] = {name: [] for name in scenarios}
    try:
        with terminate_on_sigterm():
            store = open_store(args)
            log(f"store: {store.describe()}; code: {code_version()}")
            load = [machine_load()]
            log(load[0])
            try:
                for _ in range(args.rounds):
                    for name in scenarios:
                        results[name].append(run_round(store, name))
                store.clear()
            finally:
                store.close()
            load.append(machine_load())
            log(load[1])
    except BenchError as exc:
        log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    return Rounds(store.name, results, load)


def open_store(args: argparse.Namespace) -> Store:
    """The store ``args`` name, with this process's environment and Django set up on it and
    its schema migrated (every benchmark script starts so)."""
    store = STORES[args.storage](args)
    env = environment(args, store)
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update(env)
    for path in (str(ROOT), str(TESTPROJECT), str(BENCH)):
        if path not in sys.path:
            sys.path.insert(0, path)
    store.ensure_exists()

    import django

    django.setup()
    store.prepare()
    return store


def add_store_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """--storage and where its store is, for a benchmark with a store of its own (``name``)."""
    parser.add_argument("--storage", choices=sorted(STORES), required=True)
    parser.add_argument("--db-name", default=name)
    parser.add_argument(
        "--sqlite-path", default=str(DEFAULT_SQLITE_PATH).replace("reliable_executor", name)
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--key-prefix", default=name)
    parser.add_argument("--rtt-rounds", type=int, default=200)


def run(args: argparse.Namespace) -> dict[str, Any]:
    store = open_store(args)
    from django_reliable_executor import executor

    log(f"store: {store.describe()}; code: {code_version()}")
    log(machine_load())
    rtt = store.rtt_ms(args.rtt_rounds)
    log(f"round trip (SELECT 1, median of {args.rtt_rounds}): {rtt:.3f} ms")
    poll = executor.settings.POLL_INTERVAL
    result: dict[str, Any] = {
        "storage": store.name,
        "n": args.n,
        "enqueue_per_s": None,
        "submit_many_per_s": None,
        "drain_per_s": None,
        "enqueue_cpu_us": None,
        "submit_many_cpu_us": None,
        "drain_worker_cpu_us": None,
        "latency_p50_ms": None,
        "latency_p95_ms": None,
        "rtt_ms": round(rtt, 3),
    }

    if not args.skip_enqueue:
        store.clear()
        rate, cpu_us = measure_enqueue(args.n)
        result["enqueue_per_s"] = round(rate, 1)
        result["enqueue_cpu_us"] = round(cpu_us, 1)
        log(f"enqueue (submit one by one): {rate:.0f}/s")

    store.clear()
    rate, cpu_us = measure_submit_many(args.n, args.batch)
    result["submit_many_per_s"] = round(rate, 1)
    result["submit_many_cpu_us"] = round(cpu_us, 1)
    log(f"submit_many (batches of {args.batch}): {rate:.0f}/s")
    store.after_load()

    worker = WorkerProcess(args, dict(os.environ))  # the environment open_store set up
    try:
        rate, cpu_us = measure_drain(store, worker, args.n, args.stall_timeout)
        result["drain_per_s"] = round(rate, 1)
        result["drain_worker_cpu_us"] = round(cpu_us, 1)
        log(f"drain ({args.threads} threads, one worker): {rate:.0f}/s")
        if not args.skip_latency:
            p50, p95 = measure_latency(
                store,
                worker,
                args.latency_n,
                args.latency_interval_ms,
                # Back off fully (the waits double up to POLL_INTERVAL over ~1.3 s), then a
                # random phase against the idle poll: a fixed pause would always land the first
                # submit at the same point of the poll cycle and bias the wake-up delay.
                settle=2 * poll + 1 + random.uniform(0, poll),
            )
            result["latency_p50_ms"] = round(p50, 2)
            result["latency_p95_ms"] = round(p95, 2)
            log(
                f"latency submit->start (POLL_INTERVAL {poll:g}s): "
                f"p50 {p50:.1f} ms, p95 {p95:.1f} ms"
            )
    finally:
        worker.stop()
    try:
        if isinstance(store, RedisStore) and args.memory_n:
            per_task, parameter_bytes = store.memory_per_task(args.memory_n, args.batch)
            result["redis_bytes_per_task"] = round(per_task, 1)
            log(
                f"memory: {per_task:.0f} bytes per queued task beyond its {parameter_bytes}-byte "
                f"parameter ({args.memory_n} tasks queued, INFO used_memory)"
            )
    finally:
        store.close()
    log(machine_load())
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with terminate_on_sigterm():
            result = run(args)
    except BenchError as exc:
        log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
