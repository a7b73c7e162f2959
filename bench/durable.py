#!/usr/bin/env python
"""Durable tasks' costs: a checkpoint, a sleeping task, and an event's wake-up.

    python bench/durable.py --storage {sqlite,mariadb,postgres,redis}
        [--tasks 200] [--steps 10] [--sleepers 100000] [--other 2000] [--events 100]

Prints one JSON line with three parts:

- ``checkpoint``: ``--tasks`` tasks of ``--steps`` no-op durable steps each (demo.stepper)
  against as many plain no-op tasks (demo.noop), each run through ``run_tasks()`` in this
  thread (the worker's own transitions). Per step: the CPU µs of this process and the round
  trips to the store (SQL statements on a database, requests written to Redis).
- ``sleepers``: ``--sleepers`` tasks put to sleep for a day (demo.sleeper, run by an
  in-process ``runexecutor --burst`` until every one waits). The bytes each sleeping task
  costs the store (PostgreSQL: the task tables' relation sizes; MariaDB: their data and index
  lengths after ANALYZE; SQLite: the file; Redis: used_memory; PostgreSQL's tables are
  vacuumed first, as autovacuum would, and MariaDB is let go idle, its purge of old row
  versions done), and the drain rate of ``--other`` no-op tasks of the same queue (``runexecutor
  --burst``, 8 threads; its start-up included, after a first, smaller drain that warms the
  process) before, beside and after them (the sleepers deleted): the median of three drains
  each; ``ratio`` is beside over the mean of before and after.
- ``event``: ``--events`` times in a row, a task waits for an event while a ``runexecutor``
  subprocess idles; the event is sent, and the latency is from the send to the handler's
  resumption (its journal record): p50, p95 and max in ms.

Uses the benchmark's own databases (``reliable_executor_bench``, a SQLite file in $TMPDIR,
the Redis key prefix ``reliable_executor_durable``) and deletes every task in them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEY_PREFIX = "reliable_executor_durable"
SQLITE_PATH = Path(tempfile.gettempdir()) / "reliable_executor_durable.sqlite3"
DRAINS = 3  # drains of --other tasks per figure: their median
TABLES = (
    "reliable_executor_task",
    "reliable_executor_task_step",
    "reliable_executor_task_event",
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    storages = ["sqlite", "mariadb", "postgres", "redis"]
    parser.add_argument("--storage", required=True, choices=storages)
    parser.add_argument("--tasks", type=int, default=200, help="tasks per checkpoint phase")
    parser.add_argument("--steps", type=int, default=10, help="steps per task")
    parser.add_argument("--sleepers", type=int, default=100_000, help="sleeping tasks")
    parser.add_argument("--other", type=int, default=2000, help="no-op tasks drained")
    parser.add_argument("--events", type=int, default=100, help="event wake-ups timed")
    return parser.parse_args()


def environment(storage: str) -> dict[str, str]:
    env = {
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "RE_DEBUG": "0",
        "RE_KEY_PREFIX": KEY_PREFIX,
        "RE_MARIADB_NAME": "reliable_executor_bench",
        "RE_POSTGRES_NAME": "reliable_executor_bench",
        "RE_SQLITE_PATH": str(SQLITE_PATH),
    }
    if storage == "redis":
        env["RE_STORAGE"] = "redis"
    elif storage != "sqlite":
        env["RE_DATABASE"] = storage
    return env


def main() -> int:
    args = parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
    os.environ.update(environment(args.storage))
    alias = args.storage if args.storage in ("mariadb", "postgres") else "default"
    import django

    django.setup()
    from django.core.management import call_command

    from django_reliable_executor import executor

    if args.storage != "redis":
        call_command("migrate", database=alias, verbosity=0)
    bench = Bench(args, alias, executor)
    bench.clear()
    result: dict[str, Any] = {"storage": args.storage}
    result["checkpoint"] = bench.checkpoint()
    bench.clear()
    result["sleepers"] = bench.sleepers()
    bench.clear()
    result["event"] = bench.event_latency()
    bench.clear()
    print(json.dumps(result))
    return 0


class Bench:
    def __init__(self, args: argparse.Namespace, alias: str, executor: Any) -> None:
        self.args = args
        self.alias = alias
        self.executor = executor
        self.redis = args.storage == "redis"

    # -- the store ----------------------------------------------------------------------------
    def clear(self) -> None:
        if self.redis:
            client = self.executor.storage.client
            keys = list(client.scan_iter("{" + KEY_PREFIX + "}:*", count=10_000))
            for start in range(0, len(keys), 10_000):
                client.delete(*keys[start : start + 10_000])
            return
        from django.db import connections

        with connections[self.alias].cursor() as cursor:
            for table in TABLES:
                cursor.execute(f"DELETE FROM {table}")
        if self.args.storage == "sqlite":
            with connections[self.alias].cursor() as cursor:
                cursor.execute("VACUUM")

    def round_trips(self, action: Callable[[], Any]) -> int:
        """SQL statements this process sent (a database), or requests it sent Redis."""
        if self.redis:  # each request written (a command, a pipeline, a script call)
            from redis.connection import AbstractConnection

            sent = 0
            original = AbstractConnection.send_packed_command

            def counting_send(connection: Any, *args: Any, **kwargs: Any) -> Any:
                nonlocal sent
                sent += 1
                return original(connection, *args, **kwargs)

            AbstractConnection.send_packed_command = counting_send  # type: ignore[method-assign]
            try:
                action()
            finally:
                AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
            return sent
        from django.db import connections

        count = 0

        def counting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            nonlocal count
            count += 1
            return execute(sql, params, many, context)

        with connections[self.alias].execute_wrapper(counting):
            action()
        return count

    def size(self) -> int:
        """Bytes the store holds for the tasks."""
        if self.redis:
            return int(self.executor.storage.client.info("memory")["used_memory"])
        from django.db import connections

        if self.args.storage == "sqlite":
            connections[self.alias].close()
            return SQLITE_PATH.stat().st_size
        with connections[self.alias].cursor() as cursor:
            if self.args.storage == "postgres":
                total = 0
                for table in TABLES:
                    cursor.execute("SELECT pg_total_relation_size(%s)", [table])
                    total += int(cursor.fetchone()[0])
                return total
            for table in TABLES:
                cursor.execute(f"ANALYZE TABLE {table}")
                cursor.fetchall()
            cursor.execute(
                "SELECT SUM(data_length + index_length) FROM information_schema.tables "
                f"WHERE table_schema = DATABASE() AND table_name IN ({', '.join(['%s'] * 3)})",
                list(TABLES),
            )
            return int(cursor.fetchone()[0])

    def settle(self) -> None:
        """The store as it would be some time after the writes just made, not in the middle
        of their clean-up. PostgreSQL: VACUUM ANALYZE the task tables, as autovacuum would by
        now (each sleeper's start and suspend left dead row versions whose index entries a
        claim walks past until they are vacuumed; docs/operations.md asks for autovacuum on,
        and the servers here run without it). MariaDB: wait until the server is idle (its
        purge of old row versions done)."""
        if self.args.storage == "mariadb":
            self.wait_for_idle_server()
        if self.args.storage != "postgres":
            return
        from django.db import connections

        with connections[self.alias].cursor() as cursor:
            for table in TABLES:
                cursor.execute(f"VACUUM ANALYZE {table}")

    def wait_for_idle_server(self, quiet: float = 0.05, span: float = 2.0) -> None:
        """MariaDB: until the server's process has used under ``quiet`` of a core for
        ``span`` seconds (at most 5 minutes), so that no drain runs beside InnoDB's purge of
        the rows the last phase deleted or rewrote (a DELETE of 100 000 rows is one undo log,
        purged row by row for a minute after). Prints how long that took to stderr."""
        pid = subprocess.check_output(["pgrep", "-o", "mariadbd|mysqld"], text=True).split()[0]
        tick = os.sysconf("SC_CLK_TCK")

        def cpu_seconds() -> float:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick

        began = time.monotonic()
        while time.monotonic() - began < 300:
            before = cpu_seconds()
            time.sleep(span)
            if (cpu_seconds() - before) / span < quiet:
                break
        print(f"MariaDB idle after {time.monotonic() - began:.0f} s", file=sys.stderr)

    # -- the three measures ------------------------------------------------------------------
    def checkpoint(self) -> dict[str, float]:
        from django_reliable_executor.testing import run_tasks

        n, steps = self.args.tasks, self.args.steps

        def run(task_name: str, param: Any) -> tuple[float, int]:
            for _ in range(n):
                self.executor.submit(task_name, param)
            cpu = time.process_time()
            trips = self.round_trips(lambda: run_tasks(limit=n))
            return time.process_time() - cpu, trips

        run("demo.noop", None)  # warm: imports, connections, scripts
        self.clear()
        plain_cpu, plain_trips = run("demo.noop", None)
        stepped_cpu, stepped_trips = run("demo.stepper", {"steps": steps})
        per_step = n * steps
        return {
            "tasks": n,
            "steps_per_task": steps,
            "plain_task_cpu_us": round(plain_cpu / n * 1e6, 1),
            "stepped_task_cpu_us": round(stepped_cpu / n * 1e6, 1),
            "cpu_us_per_step": round((stepped_cpu - plain_cpu) / per_step * 1e6, 1),
            "plain_task_round_trips": round(plain_trips / n, 2),
            "round_trips_per_step": round((stepped_trips - plain_trips) / per_step, 2),
        }

    def drain_rate(self, total: int | None = None) -> float:
        from django.core.management import call_command

        from django_reliable_executor import TaskSubmitRequest

        total = total or self.args.other
        requests = [TaskSubmitRequest("demo.noop", queue="bench") for _ in range(total)]
        for start in range(0, total, 500):
            self.executor.submit_many(requests[start : start + 500])
        began = time.monotonic()
        with open(os.devnull, "w") as quiet:
            call_command(
                "runexecutor", "--burst", "--queues", "bench",
                "--core-pool-size", "8", "--max-pool-size", "8", stdout=quiet, stderr=quiet,
            )  # fmt: skip
        return total / (time.monotonic() - began)

    def drain_median(self) -> float:
        """The median of DRAINS drains (one drain of a few thousand tasks varies a lot here),
        each drained task deleted after it (the store as it was before the drain)."""
        from django.db import connections

        rates = []
        for _ in range(DRAINS):
            rates.append(self.drain_rate())
            if self.redis:
                self.executor.purge_finished(self.executor.clock.now(), batch=5000)
            else:
                with connections[self.alias].cursor() as cursor:
                    cursor.execute(f"DELETE FROM {TABLES[0]} WHERE task_name = 'demo.noop'")
                self.settle()
        return statistics.median(rates)

    def sleepers(self) -> dict[str, float]:
        from django.core.management import call_command

        from django_reliable_executor import TaskSubmitRequest

        self.drain_rate(self.args.other // 5)  # warm: the first in-process worker's start-up
        self.clear()
        self.settle()
        alone = self.drain_median()
        self.clear()
        self.settle()
        empty = self.size()
        total = self.args.sleepers
        requests = [TaskSubmitRequest("demo.sleeper", queue="bench") for _ in range(total)]
        for start in range(0, total, 1000):
            self.executor.submit_many(requests[start : start + 1000])
        submitted = self.size()
        began = time.monotonic()
        with open(os.devnull, "w") as quiet:
            call_command(
                "runexecutor", "--burst", "--queues", "bench",
                "--core-pool-size", "8", "--max-pool-size", "8", stdout=quiet, stderr=quiet,
            )  # fmt: skip
        to_sleep = time.monotonic() - began
        self.settle()
        waiting = self.executor.count_waiting()["sleep"]
        asleep = self.size()
        beside = self.drain_median()
        # Alone again, the sleepers deleted: drains made later in this process run slower
        # than the first ones here (MariaDB: 2 205/s first, 1 524/s after the sleepers went),
        # so the drains beside them are compared with the mean of before and after.
        self.clear()
        self.settle()
        after = self.drain_median()
        return {
            "sleepers": total,
            "waiting": waiting,
            "bytes_per_submitted_task": round((submitted - empty) / total),
            "bytes_per_sleeping_task": round((asleep - empty) / total),
            "put_to_sleep_per_s": round(total / to_sleep),
            "drain_alone_per_s": round(alone),
            "drain_beside_sleepers_per_s": round(beside),
            "drain_alone_after_per_s": round(after),
            "ratio": round(beside / ((alone + after) / 2), 3),
        }

    def event_latency(self) -> dict[str, float]:
        journal = Path(tempfile.mkdtemp()) / "journal.jsonl"
        env = {**os.environ, **environment(self.args.storage), "RE_JOURNAL": str(journal)}
        env["RE_LOG_LEVEL"] = "WARNING"
        worker = subprocess.Popen(
            [sys.executable, str(ROOT / "testproject" / "manage.py"), "runexecutor"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        latencies: list[float] = []
        try:
            for number in range(self.args.events):
                task_id = f"evt-{number}"
                self.executor.submit("demo.waits", {"wait": "event"}, task_id=task_id)
                wait(lambda i=task_id: (t := self.executor.get_task(i)) and t.waiting, 60)
                time.sleep(0.05)  # the worker idles again
                sent = time.time()
                self.executor.send_event(task_id, "go", number)
                record = wait(lambda i=task_id: resumed(journal, i), 30)
                latencies.append((record["t"] - sent) * 1000)
        finally:
            worker.terminate()
            worker.wait(30)
        latencies.sort()
        return {
            "events": len(latencies),
            "p50_ms": round(statistics.median(latencies), 1),
            "p95_ms": round(latencies[int(len(latencies) * 0.95) - 1], 1),
            "max_ms": round(latencies[-1], 1),
        }


def resumed(journal: Path, task_id: str) -> dict | None:
    """The handler's "start" record of its resumption (the second call), once written."""
    if not journal.exists():
        return None
    for line in journal.read_text().splitlines():
        record = json.loads(line)
        if record["task"] == task_id and record["event"] == "start" and record.get("resumptions"):
            return record
    return None


def wait(condition: Callable[[], Any], timeout: float) -> Any:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        found = condition()
        if found:
            return found
        time.sleep(0.002)
    raise SystemExit(f"timed out after {timeout} s")


if __name__ == "__main__":
    sys.exit(main())
