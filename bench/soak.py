#!/usr/bin/env python
"""Soak: a steady mix of tasks for a long time, sampled once a minute, to see whether anything
degrades (latency, the claim, the tables) while the master purges finished tasks.

    python bench/soak.py --storage {postgres,mariadb,redis,sqlite} --rate 1000 --minutes 60

On a store of its own (as bench/throughput.py's, under the name ``reliable_executor_soak``),
with ``FINISHED_RETENTION`` short (``--retention-seconds``, 120) so the master's purge runs many
times, this process submits ``demo.soak`` tasks one by one (``--batch`` > 1: ``submit_many``) at
``--rate`` per second: 80 % complete, 10 % fail once then complete (retried 200 ms later),
5 % fail for good, 5 % are delayed 1-30 s. ONE ``runexecutor`` process (``--threads``) runs
them; the handler writes each start to a journal file. Every ``--sample-seconds`` (60) one JSON
line goes to stdout:

* ``latency_p50_ms``/``latency_p99_ms``: submit → start of the first attempts whose start was
  read from the journal during the interval (from just before the submit call; for a delayed
  task, from the moment it was due);
* ``claim_ms``: median of 3 ``storage.claim`` calls of one task on a queue of its own (a probe
  task waits there; each claim is released at once, untimed): the claim statement's cost on
  the task table as the run ages it, not the worker's claim round;
* ``size_bytes``: the executor's tables with their indexes (PostgreSQL
  ``pg_total_relation_size``; MariaDB ``information_schema.tables`` data_length + index_length,
  InnoDB's estimate; SQLite page_count × page_size; Redis ``INFO memory`` used_memory, the
  whole server's); ``dead_tuples`` (PostgreSQL ``pg_stat_user_tables.n_dead_tup``, else null);
* ``stored_tasks``/``unfinished``: tasks stored and not yet finished (``count_by_status``).

Then one summary line: p99 over the first and the last ten minutes (``--window-minutes``, at
most a third of the run each) and their ratio (target <= 1.5), and whether table+index size
stopped growing once retention was reached. ``--out`` writes the samples as CSV, ``--plot``
draws them (needs matplotlib). The database (or Redis keys) it created is dropped at the end
unless ``--keep``. Progress and the machine's load go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import uuid
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import soak_report  # noqa: E402 - the summary, CSV and plot
import throughput  # noqa: E402 - the stores and worker process of the throughput benchmark

TASK_NAME = "demo.soak"
PROBE_QUEUE = "soak_probe"  # nobody else claims from it
DELAY_SECONDS = (1.0, 30.0)
MIX = (("complete", 80), ("retry", 10), ("fail", 5), ("delayed", 5))
log = throughput.log


PARAMETERS = {"complete": {}, "retry": {"retry_once": True}, "fail": {"fail": True}}


def request(kind: str, rng: random.Random) -> tuple[Any, float]:
    """A submit request of that kind, and its delay in seconds."""
    from django_reliable_executor import TaskSubmitRequest

    task_id = uuid.uuid4().hex
    if kind == "delayed":
        delay_millis = int(rng.uniform(*DELAY_SECONDS) * 1000)
        return TaskSubmitRequest(TASK_NAME, {}, task_id=task_id, delay_millis=delay_millis), (
            delay_millis / 1000
        )
    return TaskSubmitRequest(TASK_NAME, PARAMETERS[kind], task_id=task_id), 0.0


class Journal:
    """The handler's start records (RE_JOURNAL), read as they grow; matched with the submits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.due: dict[str, float] = {}  # task id -> when it was submitted (or due)
        self.latencies = array("d")  # ms, first attempts read since the last take()

    def read(self) -> None:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # a line still being written, or b""
        for line in lines:
            record = json.loads(line)
            if record["attempt"] != 1:
                continue
            due = self.due.pop(record["task"], None)
            if due is not None:
                self.latencies.append((record["t"] - due) * 1000)

    def take(self) -> array:
        taken, self.latencies = self.latencies, array("d")
        return taken


class Probe:
    """Store figures that do not depend on the workload's own API: claim time and sizes."""

    def __init__(self, store: throughput.Store) -> None:
        from django_reliable_executor import executor

        self.store = store
        self.storage = executor.storage
        executor.submit("demo.noop", queue=PROBE_QUEUE)

    def claim_ms(self, rounds: int = 3) -> float:
        samples = []
        for _ in range(rounds):
            start = time.perf_counter()
            claims = self.storage.claim("soak-probe", [PROBE_QUEUE], 1, 30.0)
            samples.append((time.perf_counter() - start) * 1000)
            if len(claims) != 1:
                raise throughput.BenchError(f"the claim probe took {len(claims)} tasks, not 1")
            self.storage.release(claims)
        return statistics.median(samples)

    def size_and_dead(self) -> tuple[int | None, int | None]:
        store = self.store
        if isinstance(store, throughput.RedisStore):
            return int(store.client().info("memory")["used_memory"]), None
        assert isinstance(store, throughput.DatabaseStore)
        tables = "'reliable\\_executor\\_%%'"
        if isinstance(store, throughput.PostgresStore):
            size, dead = store._one(
                "SELECT COALESCE(SUM(pg_total_relation_size(relid)), 0), "
                "COALESCE(SUM(n_dead_tup), 0) FROM pg_stat_user_tables "
                f"WHERE relname LIKE {tables}"
            )
            return int(size), int(dead)
        if isinstance(store, throughput.MariaDBStore):
            (size,) = store._one(
                "SELECT COALESCE(SUM(data_length + index_length), 0) FROM "
                "information_schema.tables WHERE table_schema = DATABASE() "
                f"AND table_name LIKE {tables}"
            )
            return int(size), None
        pages, page_size = store._one("PRAGMA page_count")[0], store._one("PRAGMA page_size")[0]
        return int(pages * page_size), None


def existed(store: throughput.Store) -> bool:
    """Whether the store's database (file, keys) is there before the run: only what the run
    created is dropped at the end; a database that was there is emptied instead."""
    if isinstance(store, throughput.RedisStore):
        return bool(next(iter(store.client().scan_iter(match="{" + store.prefix + "}:*")), None))
    if isinstance(store, throughput.SQLiteStore):
        return store.path.exists()
    assert isinstance(store, throughput.DatabaseStore)
    if isinstance(store, throughput.PostgresStore):
        with throughput.postgres_server() as conn:
            query = "SELECT 1 FROM pg_database WHERE datname = %s"
            return conn.execute(query, (store.db_name,)).fetchone() is not None
    conn = throughput.mariadb_server()
    try:
        cursor = conn.cursor()
        cursor.execute("SHOW DATABASES LIKE %s", (store.db_name,))
        return cursor.fetchone() is not None
    finally:
        conn.close()


def remove_sqlite(path: Path) -> None:
    """The SQLite file and what SQLite and the idle-worker wake-ups keep beside it."""
    for suffix in ("", "-wal", "-shm", "-journal", "-executor-wake"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def drop(store: throughput.Store, created: bool, sqlite_created: bool) -> None:
    """Remove what the run created: its database, file or keys (else empty the tables)."""
    from django.db import connections

    if isinstance(store, throughput.RedisStore) or not created:
        store.clear()
        store.close()
        connections.close_all()
        if isinstance(store, throughput.RedisStore) and sqlite_created:
            remove_sqlite(store.sqlite_path)  # the demo app's tables, beside the Redis keys
        log(f"cleaned up: emptied {store.describe()}")
        return
    connections.close_all()
    assert isinstance(store, throughput.DatabaseStore)
    if isinstance(store, throughput.SQLiteStore):
        remove_sqlite(store.path)
    elif isinstance(store, throughput.PostgresStore):
        with throughput.postgres_server() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{store.db_name}" WITH (FORCE)')
    else:
        conn = throughput.mariadb_server()
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{store.db_name}`")
        finally:
            conn.close()
    log(f"cleaned up: dropped {store.describe()}, which the run created")


class Soak:
    """The submitting loop and its samples."""

    def __init__(self, args: argparse.Namespace, store: throughput.Store, journal: Journal):
        self.args = args
        self.store = store
        self.journal = journal
        self.probe = Probe(store)
        self.rng = random.Random(args.seed)
        self.kinds = [kind for kind, share in MIX for _ in range(share)]
        self.samples: list[dict[str, Any]] = []
        self.latencies: list[array] = []
        self.submitted = 0

    def submit(self, count: int) -> None:
        from django_reliable_executor import executor

        requests = []
        for _ in range(count):
            submit_request, delay = request(self.rng.choice(self.kinds), self.rng)
            self.journal.due[submit_request.task_id] = time.time() + delay
            requests.append(submit_request)
        if len(requests) == 1:
            executor.submit_task(requests[0])
        else:
            executor.submit_many(requests)
        self.submitted += count

    def sample(self, elapsed: float, interval: float, submitted: int, behind: int) -> None:
        from django_reliable_executor import TaskStatus, executor

        self.journal.read()
        latencies = self.journal.take()
        counts = executor.count_by_status()
        size, dead = self.probe.size_and_dead()
        live = (TaskStatus.CREATED, TaskStatus.PENDING, TaskStatus.RUNNING)
        row = {
            "t_s": round(elapsed, 1),
            "interval_s": round(interval, 1),
            "submitted": submitted,
            "submit_per_s": round(submitted / interval, 1),
            "submit_behind_max": behind,
            "started": len(latencies),
            "latency_p50_ms": soak_report.rounded(soak_report.percentile(latencies, 50)),
            "latency_p99_ms": soak_report.rounded(soak_report.percentile(latencies, 99)),
            "claim_ms": round(self.probe.claim_ms(), 3),
            "size_bytes": size,
            "dead_tuples": dead,
            "stored_tasks": sum(counts.values()),
            "unfinished": sum(counts[s] for s in live),
        }
        self.samples.append(row)
        self.latencies.append(latencies)
        print(json.dumps(row), flush=True)

    def run(self, worker: throughput.WorkerProcess) -> None:
        """Submit at the rate for the run's length, sampling."""
        args = self.args
        duration = args.minutes * 60
        start = time.time()
        last_sample, last_read, submitted_at_sample, behind = start, start, 0, 0
        while True:
            now = time.time()
            elapsed = now - start
            if now - last_sample >= args.sample_seconds or elapsed >= duration:
                worker.check_alive()
                submitted = self.submitted - submitted_at_sample
                self.sample(elapsed, now - last_sample, submitted, behind)
                last_sample, submitted_at_sample, behind = now, self.submitted, 0
                if elapsed >= duration:
                    return
                continue
            if now - last_read >= 1.0:  # a second's records at a time keeps each read short
                self.journal.read()
                worker.check_alive()
                last_read = now
            due = int(elapsed * args.rate) - self.submitted
            if due <= 0:
                time.sleep(min(1 / args.rate, 0.05))
                continue
            behind = max(behind, due)
            self.submit(min(due, args.batch))

    def summary(self) -> dict[str, Any]:
        from django_reliable_executor.master.chores import PURGE_EVERY_SECONDS

        args = self.args
        claims = [s["claim_ms"] for s in self.samples]
        return {
            "summary": True,
            "storage": self.store.name,
            "rate": args.rate,
            "minutes": args.minutes,
            "retention_s": args.retention_seconds,
            "sample_s": args.sample_seconds,
            "samples": len(self.samples),
            "submitted": self.submitted,
            "started_first_attempts": sum(len(values) for values in self.latencies),
            **soak_report.latency_windows(self.samples, self.latencies, args.window_minutes * 60),
            "claim_ms_first": claims[0] if claims else None,
            "claim_ms_last": claims[-1] if claims else None,
            # From then on the purge keeps pace: every task finished (a delayed one at most
            # DELAY_SECONDS late) before the last purge round's cutoff is gone.
            **soak_report.size_growth(
                self.samples, args.retention_seconds + DELAY_SECONDS[1] + PURGE_EVERY_SECONDS
            ),
        }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Soak: a steady task mix sampled over time; one JSON line per sample."
    )
    throughput.add_store_arguments(parser, "reliable_executor_soak")
    parser.add_argument("--rate", type=float, default=100.0, help="tasks submitted per second")
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the run")
    parser.add_argument("--retention-seconds", type=float, default=120.0)
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument("--window-minutes", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=1, help="> 1: submit_many up to this many")
    parser.add_argument("--threads", type=int, default=8, help="worker pool threads")
    parser.add_argument("--poll-interval", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0, help="seed of the task mix")
    parser.add_argument("--out", metavar="CSV", default=None, help="write the samples as CSV")
    parser.add_argument("--plot", metavar="PNG", default=None, help="draw them (matplotlib)")
    parser.add_argument("--keep", action="store_true", help="keep the database / keys")
    parser.add_argument(
        "--task-table-setting",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="PostgreSQL: a storage parameter of the task table for this run, e.g. "
        "autovacuum_vacuum_cost_delay=0 (ALTER TABLE ... SET before the worker starts; repeatable)",
    )
    args = parser.parse_args(argv)
    for key in ("rate", "minutes", "sample_seconds", "window_minutes", "batch", "threads"):
        if getattr(args, key) <= 0:
            parser.error(f"--{key.replace('_', '-')} must be > 0")
    if args.retention_seconds < 0:
        parser.error("--retention-seconds must be >= 0")
    for setting in args.task_table_setting:
        if args.storage != "postgres":
            parser.error("--task-table-setting is for --storage postgres")
        if not re.fullmatch(r"[a-z_.]+=[A-Za-z0-9_.]+", setting):
            parser.error(
                f"--task-table-setting {setting!r}: expected NAME=VALUE, e.g. "
                "autovacuum_vacuum_cost_delay=0"
            )
    args.conn_max_age = None
    args.count_queries = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="reliable_executor_soak_"))
    journal = Journal(workdir / "journal.jsonl")
    store: throughput.Store | None = None
    created = sqlite_created = False
    try:
        if args.plot:
            soak_report.require_matplotlib()
        with throughput.terminate_on_sigterm():
            probe_store = throughput.STORES[args.storage](args)
            created = not existed(probe_store)
            sqlite_created = not Path(args.sqlite_path).exists()
            os.environ["RE_BENCH_FINISHED_RETENTION"] = str(args.retention_seconds)
            os.environ["RE_JOURNAL"] = str(journal.path)
            # A retry or a failure logs a line each (15 % of the mix): thousands a minute.
            os.environ.setdefault("RE_LOG_LEVEL", "CRITICAL")
            store = throughput.open_store(args)
            store.clear()
            if args.task_table_setting:
                # Checked by parse_args: names and values of letters, digits, _ and . only.
                settings = ", ".join(args.task_table_setting)
                assert isinstance(store, throughput.PostgresStore)
                with store._connection().cursor() as cursor:
                    cursor.execute(f"ALTER TABLE reliable_executor_task SET ({settings})")
                log(f"task table: SET ({settings})")
            log(f"store: {store.describe()}; code: {throughput.code_version()}")
            load_before = throughput.machine_load()
            log(load_before)
            soak = Soak(args, store, journal)
            worker = throughput.WorkerProcess(args, dict(os.environ))
            try:
                worker.start()
                soak.run(worker)
            finally:
                worker.stop()
            summary = soak.summary()
            summary["load_before"], summary["load_after"] = load_before, throughput.machine_load()
            print(json.dumps(summary), flush=True)
            if args.out:
                soak_report.write_csv(Path(args.out), soak.samples)
            if args.plot:
                soak_report.plot(Path(args.plot), soak.samples, f"soak {store.name} {args.rate}/s")
    except (throughput.BenchError, RuntimeError) as exc:
        log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        journal.path.unlink(missing_ok=True)
        workdir.rmdir()
        if store is not None and not args.keep:
            drop(store, created, sqlite_created)
    return 0


if __name__ == "__main__":
    sys.exit(main())
