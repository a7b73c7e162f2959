#!/usr/bin/env python
"""Chaos soak: workers and a steady, mixed load while a seeded schedule of faults hits them and
their store; then every promise of docs/guarantees.md is checked from the handlers' own journal
and the storage.

    python bench/chaos_soak.py --storage {sqlite,postgres,mariadb,redis} --minutes 60 \\
        --rate 30 --seed 1 [--workers 3] [--no-faults] [--plot chaos.png] [--out chaos.json]

``--workers`` (3) ``manage.py runexecutor`` processes run the demo app's ``demo.chaos*``
handlers, which write "start" and "end" records (task, attempt, pid, time, outcome) to a
journal file. This process submits ``--rate`` times a second one of: a quick task, a slow one
(0.2-2 s), one that fails (not retried), one retried once or twice, a poison result (cannot be
stored: FAILED), a chain of three, a batch of five with an ``on_complete`` callback, a unique
task (five keys), a task of a rate-limited name (``demo.chaos_rated``, 5/s), of a capped one
(``demo.chaos_capped``, ``max_concurrency=2``), or four tasks of one ``concurrency_key`` of 20
(``demo.chaos_keyed1``/``demo.chaos_keyed3``, ``max_concurrency_per_key`` 1 and 3, ten keys
each); a schedule fires every 2 s.

The first ``--baseline-fraction`` of the run is fault-free (its latency is the reference);
from then on, by a schedule drawn from ``--seed``: a random worker SIGKILLed every 20-45 s
(``--kill-every``) and started again; one worker SIGSTOPped for 1.5 × LEASE_TIMEOUT, then
SIGCONT; the store's connections killed every ``--conn-kill-every`` s (PostgreSQL
``pg_terminate_backend``, MariaDB ``KILL``, Redis ``CLIENT KILL TYPE normal``; SQLite has no
connections to kill); the server restarted every ``--restart-every`` s (crash: SIGKILL of a
private ``redis-server`` with ``appendfsync always``; ``pg_ctl restart -m immediate`` of a
private PostgreSQL, bench/private_postgres.py; SIGKILL of a private ``mariadbd`` the script
sets up with ``mariadb-install-db`` -- without those programs MariaDB runs on the shared
server, never restarted, and its restarts are skipped and said so; SQLite has no server).

Then the faults stop, the workers drain the backlog (``--drain-seconds``), and the checks run
(see CHECKS). One JSON document goes to stdout; the exit code is 1 on any violation.
``--plot`` draws throughput and latency with the faults marked (matplotlib). Progress goes to
stderr. Everything the run created (database, files, servers) is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for _path in (str(BENCH), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import chaos_reclaim  # noqa: E402 - the reclaim bound
import private_postgres  # noqa: E402 - the private PostgreSQL server
import soak  # noqa: E402 - cleaning up what a run created
import soak_report  # noqa: E402 - percentiles, matplotlib
import throughput  # noqa: E402 - the stores and the worker process

log = throughput.log

WORKERS = 3  # the default of --workers
THREADS = 8
RETRY_LIMIT = 10  # a task survives many lost workers: a FAILED there would be noise
RETRY_INTERVAL_S = 0.1  # the demo.chaos* handlers' retry_interval
RATE_LIMIT = (5, 1.0)  # demo.chaos_rated: 5 starts in any second
MAX_CONCURRENCY = 2  # demo.chaos_capped
# max_concurrency_per_key of demo.chaos_keyed1/3; each has KEYS_PER_NAME keys ("k1-0".."k1-9",
# "k3-0".."k3-9"). A keyed submit stores KEYED_BURST tasks of one key at once (a tenant's
# import): single tasks, a couple a second spread over 20 keys, would seldom put two on one
# key, and the caps would never bind.
KEY_CAPS = {"demo.chaos_keyed1": 1, "demo.chaos_keyed3": 3}
KEYS_PER_NAME = 10
KEYED_BURST = 4
UNIQUE_KEYS = 5
SCHEDULE_ID = "chaos-soak"
SCHEDULE_EVERY_S = 2.0
BUCKET_S = 5.0  # the plot's and the series' resolution
# (kind, share in %): what the submitter picks from, each second ``--rate`` times.
MIX = (
    ("quick", 34),
    ("slow", 8),
    ("failing", 5),
    ("retried", 10),
    ("poison", 2),
    ("chain", 5),
    ("batch", 3),
    ("unique", 7),
    ("rated", 12),
    ("capped", 8),
    ("keyed", 6),  # bursts of KEYED_BURST: 7.2 tasks a second at the default rate
)
CHECKS = {
    "lost": "accepted tasks missing from the storage, or COMPLETED with no run that returned",
    "stuck": "tasks not terminal once the drain ended",
    "wrong_status": "tasks that ended in another status than their kind's",
    "concurrent_duplicates": "two runs of one task at once while the first one's worker lived "
    "(and was not frozen)",
    "unattributed_reexecutions": "a run repeated without the handler failing, its worker "
    "killed or frozen, or a store fault in between",
    "rerun_after_short_store_fault": "a handler that had finished, on a worker that lived, run "
    "again because a store fault shorter than LEASE_TIMEOUT cost its outcome (guarantees.md: "
    "only an outage longer than LEASE_TIMEOUT may)",
    "reclaim_over_bound": "re-executions after a lost worker later than LEASE_TIMEOUT + the "
    "chores interval + a worker's pickup after the fault (or than a master take-over + the "
    "chores interval + the pickup, when a worker fault may have cost the master meanwhile); "
    "the pickup is POLL_INTERVAL plus the longest wait for a thread of the quick tasks "
    "submitted within 0.5 s of the moment the task was due again (bench/chaos_reclaim.py)",
    "rate_limit_exceeded": "more demo.chaos_rated starts in some second than its limit",
    "max_concurrency_exceeded": "more demo.chaos_capped runs at once than its cap",
    "key_concurrency_exceeded": "more demo.chaos_keyed1/3 runs of one concurrency_key at once "
    "than the name's max_concurrency_per_key",
    "batch_callbacks_not_once": "batches whose on_complete callback was stored other than once",
    "dependency_order": "a chain step started before the step it depends on returned",
    "unique_overlap": "two tasks of one unique key running at once",
    "worker_exited": "a worker process that ended by itself (no fault of the plan killed it): "
    "guarantees.md promises the living workers carry on through every store fault",
}


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """What this process and its children print goes to stderr meanwhile: stdout is the JSON
    document's (pg_ctl writes to the file descriptor, not to sys.stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------------------------
# The store under chaos: what killing its connections and restarting it mean, per storage
# --------------------------------------------------------------------------------------------
class Server:
    """The storage's server as the fault schedule sees it. ``None`` notes: the fault is done;
    a string: why it is not."""

    kill_note: str | None = None
    restart_note: str | None = None

    def before_setup(self, args: argparse.Namespace, workdir: Path) -> None:
        """Start what the run needs (before Django is set up: the settings read the port)."""

    def kill_connections(self) -> int:
        raise NotImplementedError

    def restart(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop what before_setup started."""


class SQLiteServer(Server):
    kill_note = "SQLite: no server, no connections to kill (an open file is not a connection)"
    restart_note = "SQLite: no server to restart (kill -9 of the workers is its crash test)"


class MariaDBServer(Server):
    """A private MariaDB server (``mariadb-install-db`` and ``mariadbd`` into the run's
    directory, on a free port, stock settings: InnoDB flushes its log at every commit), so it
    may be crashed and restarted; without those programs, the shared server, never
    restarted."""

    def before_setup(self, args: argparse.Namespace, workdir: Path) -> None:
        self.db_name = args.db_name
        self.process: subprocess.Popen[bytes] | None = None
        self.server = shutil.which("mariadbd")
        install = shutil.which("mariadb-install-db")
        if self.server is None or install is None:
            self.restart_note = (
                "MariaDB: no mariadbd/mariadb-install-db here: the run uses the shared server, "
                "which is never restarted"
            )
            return
        self.directory = workdir / "mariadb"
        self.directory.mkdir()
        self.port = free_port()
        subprocess.run(
            [install, "--no-defaults", f"--datadir={self.directory / 'data'}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.environ["RE_MARIADB_HOST"] = "127.0.0.1"
        os.environ["RE_MARIADB_PORT"] = str(self.port)
        self._start()
        log(f"private MariaDB on port {self.port}")

    def _start(self) -> None:
        assert self.server is not None
        self.process = subprocess.Popen(
            [self.server, "--no-defaults", f"--datadir={self.directory / 'data'}",
             f"--port={self.port}", "--bind-address=127.0.0.1", "--user=root",
             f"--socket={self.directory / 'mariadb.sock'}",
             f"--log-error={self.directory / 'error.log'}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                throughput.mariadb_server().close()
                return
            except throughput.BenchError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def kill_connections(self) -> int:
        conn = throughput.mariadb_server()
        try:
            cursor = conn.cursor()
            cursor.execute(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = %s AND id <> CONNECTION_ID()",
                (self.db_name,),
            )
            ids = [row[0] for row in cursor.fetchall()]
            killed = 0
            for connection_id in ids:
                with contextlib.suppress(Exception):  # it may have gone meanwhile
                    cursor.execute(f"KILL CONNECTION {int(connection_id)}")
                    killed += 1
            return killed
        finally:
            conn.close()

    def restart(self) -> None:
        """SIGKILL (a crash: InnoDB recovers from its log) and start again on the same data."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self._start()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class PostgresServer(Server):
    """A private server (bench/private_postgres.py) on a free port, so it may be restarted."""

    def before_setup(self, args: argparse.Namespace, workdir: Path) -> None:
        self.directory = workdir / "postgres"
        self.port = free_port()
        self.db_name = args.db_name
        with stdout_to_stderr():
            private_postgres.start(self.directory, self.port, ["max_connections=200"])
        os.environ["RE_POSTGRES_PORT"] = str(self.port)
        os.environ["RE_POSTGRES_HOST"] = "127.0.0.1"
        log(f"private PostgreSQL on port {self.port}")

    def kill_connections(self) -> int:
        with throughput.postgres_server() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.db_name,),
            ).fetchall()
        return sum(1 for (done,) in rows if done)

    def restart(self) -> None:
        data = self.directory / "data"
        command = private_postgres.command(
            "pg_ctl",
            "-D",
            str(data),
            "-l",
            str(self.directory / "server.log"),
            "-m",
            "immediate",
            "-w",
            "restart",
        )
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)

    def close(self) -> None:
        with stdout_to_stderr():
            private_postgres.stop(self.directory)


class RedisChaosServer(Server):
    """A private redis-server (tests/support/redis_servers.py) with ``appendfsync always``: a crash
    loses nothing it acknowledged."""

    def before_setup(self, args: argparse.Namespace, workdir: Path) -> None:
        from tests.support.redis_servers import RedisServer

        self.server = RedisServer(
            workdir / "redis", ["--appendonly", "yes", "--appendfsync", "always"]
        ).start()
        args.redis_url = self.server.url
        log(f"private redis-server at {self.server.url} (appendfsync always)")

    def kill_connections(self) -> int:
        with self.server.client() as admin:
            return int(admin.client_kill_filter(_type="normal", skipme=True))

    def restart(self) -> None:
        self.server.restart(hard=True)  # SIGKILL: only what was fsynced survives

    def close(self) -> None:
        self.server.stop()


SERVERS: dict[str, type[Server]] = {
    "sqlite": SQLiteServer,
    "mariadb": MariaDBServer,
    "postgres": PostgresServer,
    "redis": RedisChaosServer,
}


# --------------------------------------------------------------------------------------------
# Workers and the fault schedule
# --------------------------------------------------------------------------------------------
class Worker:
    """One runexecutor process slot: started again after each kill, under a new pid."""

    def __init__(self, index: int, args: argparse.Namespace, env: dict[str, str]) -> None:
        self.index = index
        self.args = args
        self.env = env
        self.process: throughput.WorkerProcess | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None and self.process.process is not None
        return self.process.process.pid

    def alive(self) -> bool:
        return (
            self.process is not None
            and self.process.process is not None
            and self.process.process.poll() is None
        )

    def start(self) -> None:
        self.process = throughput.WorkerProcess(self.args, self.env)
        self.process.start()

    def kill(self) -> None:
        """SIGKILL and reap (what Faults.kill calls)."""
        assert self.process is not None and self.process.process is not None
        self.process.process.kill()
        self.process.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                if self.alive():
                    os.kill(self.pid, signal.SIGCONT)
            self.process.stop()


def fault_plan(
    args: argparse.Namespace, start_s: float, end_s: float
) -> list[tuple[float, str, int]]:
    """(seconds from the run's start, action, worker index) drawn from the seed."""
    rng = random.Random(f"faults-{args.seed}")
    plan: list[tuple[float, str, int]] = []
    freeze_s = 1.5 * args.lease_timeout
    freeze_at = start_s + 5.0
    frozen = rng.randrange(args.workers)
    if freeze_at + freeze_s <= end_s:
        plan += [(freeze_at, "freeze", frozen), (freeze_at + freeze_s, "thaw", frozen)]
    low, high = args.kill_every
    at = start_s + rng.uniform(low, high)
    while at < end_s:
        during_freeze = freeze_at <= at <= freeze_at + freeze_s + 1
        choices = [i for i in range(args.workers) if not (during_freeze and i == frozen)]
        plan.append((at, "kill", rng.choice(choices)))
        at += rng.uniform(low, high)
    for action, every in (
        ("kill_connections", args.conn_kill_every),
        ("restart", args.restart_every),
    ):
        at = start_s + every
        while every > 0 and at < end_s:
            plan.append((at, action, -1))
            at += every
    return sorted(plan)


class Chaos(threading.Thread):
    """Carries out the fault plan; records what it did, when, on the journal's clock."""

    def __init__(self, plan, workers: list[Worker], server: Server, faults: Any, start: float):
        super().__init__(name="chaos", daemon=True)
        self.plan = plan
        self.workers = workers
        self.server = server
        self.faults = faults  # tests.support.journal.Faults: kills and freezes by pid
        self.start_time = start
        self.done = threading.Event()  # stop doing faults
        self.release = threading.Event()  # the workers are stopped: end the thread
        self.events: list[dict[str, Any]] = []  # every fault, for the report and the plot
        self.store_faults: list[tuple[float, float]] = []  # (from, to) of each store fault
        self.lock = threading.Lock()

    def run(self) -> None:
        self._run_plan()
        # The workers this thread started get SIGTERM when it ends (PR_SET_PDEATHSIG follows
        # the thread that forked): it lives until they are stopped.
        self.release.wait()

    def _run_plan(self) -> None:
        for at, action, index in self.plan:
            if self.done.wait(max(0.0, self.start_time + at - time.time())):
                return
            with self.lock:
                if self.done.is_set():
                    return
                self._fault(at, action, index)

    def _fault(self, at: float, action: str, index: int) -> None:
        began = time.time()
        event: dict[str, Any] = {"t_s": round(began - self.start_time, 2), "fault": action}
        try:
            self._do(action, index, event)
        except Exception as exc:  # a fault that could not be done is reported, not fatal
            event["error"] = f"{type(exc).__name__}: {exc}"
        event["took_s"] = round(time.time() - began, 2)
        if action in ("kill_connections", "restart") and "skipped" not in event:
            self.store_faults.append((began, time.time()))
        self.events.append(event)
        log(f"fault: {event}")

    def _do(self, action: str, index: int, event: dict[str, Any]) -> None:
        if action in ("kill", "freeze", "thaw"):
            worker = self.workers[index]
            event["worker"] = index
            event["pid"] = worker.pid
            if action == "kill":
                self.faults.kill(worker)
                worker.start()
                event["new_pid"] = worker.pid
            elif action == "freeze":
                self.faults.freeze(worker)
            else:
                self.faults.thaw(worker)
            return
        note = self.server.kill_note if action == "kill_connections" else self.server.restart_note
        if note is not None:
            event["skipped"] = note
        elif action == "kill_connections":
            event["killed_connections"] = self.server.kill_connections()
        else:
            self.server.restart()

    def watch_workers(self) -> None:
        """Start again a worker that ended by itself, and record it: its runs count as ended
        when it was found gone (at most a second late), and the check reports it."""
        with self.lock:
            if self.done.is_set():
                return
            for index, worker in enumerate(self.workers):
                if worker.process is None or worker.alive():
                    continue
                pid = worker.pid
                assert worker.process.process is not None
                code = worker.process.process.returncode
                self.faults.note_killed(pid, time.time())
                event = {"t_s": round(time.time() - self.start_time, 2), "fault": "exited",
                         "worker": index, "pid": pid, "code": code}  # fmt: skip
                worker.start()
                event["new_pid"] = worker.pid
                self.events.append(event)
                log(f"worker exited by itself: {event}")

    def thaw_all(self) -> None:
        for worker in self.workers:
            frozen = self.faults.frozen.get(worker.pid if worker.alive() else -1)
            if frozen and frozen[-1][1] is None:
                self.faults.thaw(worker)


# --------------------------------------------------------------------------------------------
# The load
# --------------------------------------------------------------------------------------------
class Submitter:
    """Submits the mix at the rate; remembers what it expects of every task."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(f"load-{args.seed}")
        self.kinds = [kind for kind, share in MIX for _ in range(share)]
        self.expected: dict[str, tuple[str, str]] = {}  # task id -> (kind, expected status)
        self.uncertain: set[str] = set()  # the submit raised: stored or not, both are right
        self.submitted_at: dict[str, float] = {}  # quick tasks: for the latency
        self.accepted_at: dict[str, float] = {}  # every accepted task: when its submit returned
        self.chains: list[list[str]] = []
        self.batches: dict[str, list[str]] = {}
        self.unique: dict[str, set[str]] = defaultdict(set)  # key -> task ids it returned
        self.keyed: dict[str, tuple[str, str]] = {}  # task id -> (name, concurrency_key)
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.deduplicated = 0

    def request(self, name: str, param: dict, **options: Any) -> Any:
        from django_reliable_executor import TaskSubmitRequest

        options.setdefault("task_id", uuid.uuid4().hex)
        return TaskSubmitRequest(name, param, retry_limit=RETRY_LIMIT, **options)

    def single(self, kind: str) -> Any:
        """The request of a kind that submits one task."""
        rng = self.rng
        name, param, options = "demo.chaos", {}, {}
        if kind == "slow":
            param = {"sleep": round(rng.uniform(0.2, 2.0), 2)}
        elif kind == "failing":
            param = {"fail": True}
        elif kind == "retried":
            param = {"fail_times": rng.choice((1, 2))}
        elif kind == "poison":
            param = {"poison": "bigint"}
        elif kind == "unique":
            param = {"sleep": 0.3}
            options = {"unique_for": 30.0, "unique_key": f"chaos-{rng.randrange(UNIQUE_KEYS)}"}
        elif kind == "rated":
            name = "demo.chaos_rated"
        elif kind == "capped":
            name, param = "demo.chaos_capped", {"sleep": 0.3}
        return self.request(name, param, **options)

    def keyed_burst(self) -> list[Any]:
        """KEYED_BURST tasks of one key of demo.chaos_keyed1 or _keyed3, 0.2-1.0 s each (long
        enough that a key's tasks wait for each other's slots)."""
        rng = self.rng
        name = rng.choice(sorted(KEY_CAPS))
        key = f"k{KEY_CAPS[name]}-{rng.randrange(KEYS_PER_NAME)}"
        burst = [
            self.request(name, {"sleep": round(rng.uniform(0.2, 1.0), 2)}, concurrency_key=key)
            for _ in range(KEYED_BURST)
        ]
        # Noted before the submit: a task stored although its submit raised holds a slot of
        # its key all the same, and its runs must count.
        self.keyed.update(dict.fromkeys((r.task_id for r in burst), (name, key)))
        return burst

    def submit_one(self) -> None:
        from django_reliable_executor import TaskSubmitRequest, executor

        kind = self.rng.choice(self.kinds)
        ids: list[str] = []
        call: Callable[[], Any]
        if kind == "chain":
            steps = [self.request("demo.chaos", {}) for _ in range(3)]
            ids = [s.task_id for s in steps]
            call = lambda: executor.chain(steps)  # noqa: E731
        elif kind == "batch":
            members = [self.request("demo.chaos", {}) for _ in range(5)]
            ids = [m.task_id for m in members]
            batch_id = uuid.uuid4().hex
            # No task id of ours: that the storage stores it once is what is checked.
            callback = TaskSubmitRequest(
                "demo.batch_report", {"kind": "complete"}, retry_limit=RETRY_LIMIT
            )
            call = lambda: executor.submit_batch(members, batch_id=batch_id, on_complete=callback)  # noqa: E731
        elif kind == "keyed":
            burst = self.keyed_burst()
            ids = [r.task_id for r in burst]
            call = lambda: executor.submit_many(burst)  # noqa: E731
        else:
            req = self.single(kind)
            ids = [req.task_id]
            call = lambda: executor.submit_task(req)  # noqa: E731
        status = "FAILED" if kind in ("failing", "poison") else "COMPLETED"
        before = time.time()
        try:
            result = call()
        except Exception as exc:
            self.errors[type(exc).__name__] += 1
            self.uncertain.update(ids)
            self._discard_connections()
            return
        self.counts[kind] += 1
        if kind == "unique":
            key = req.unique_key
            if result.task_id != ids[0]:
                self.deduplicated += 1
                return
            self.unique[key].add(result.task_id)
        accepted = time.time()
        for task_id in ids:
            self.expected[task_id] = (kind, status)
            self.accepted_at[task_id] = accepted
        if kind == "quick":
            self.submitted_at[ids[0]] = before
        elif kind == "chain":
            self.chains.append(ids)
        elif kind == "batch":
            self.batches[result.batch_id] = ids

    @staticmethod
    def _discard_connections() -> None:
        from django.db import connections

        with contextlib.suppress(Exception):
            connections.close_all()

    def run(self, start: float, duration: float, on_tick: Callable[[], None]) -> None:
        """Submit ``rate`` a second for ``duration`` seconds from ``start``; never more than two
        seconds' worth behind (after an outage it catches up that much, not more)."""
        rate = self.args.rate
        done = 0
        last_tick = 0.0
        while True:
            now = time.time()
            elapsed = now - start
            if elapsed >= duration:
                return
            if now - last_tick >= 1.0:
                on_tick()
                last_tick = now
            due = int(elapsed * rate) - done
            if due > 2 * rate:
                self.counts["skipped_behind"] += due - int(2 * rate)
                done += due - int(2 * rate)
                due = int(2 * rate)
            if due <= 0:
                time.sleep(min(1 / rate, 0.05))
                continue
            self.submit_one()
            done += 1


# --------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------
def percentiles(values: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": soak_report.rounded(soak_report.percentile(values, 50)),
        "p99_ms": soak_report.rounded(soak_report.percentile(values, 99)),
    }


class Analysis:
    """Everything the run promised, read from the journal and the storage."""

    def __init__(self, args, submitter: Submitter, journal, faults, chaos: Chaos, start: float):
        self.args = args
        self.submitter = submitter
        self.journal = journal
        self.faults = faults
        self.chaos = chaos
        self.start = start
        self.violations: dict[str, list[str]] = {name: [] for name in CHECKS}
        self.runs = journal.runs()
        self.records = journal.records()
        self.outcomes = {
            (r["task"], r["attempt"], r["pid"]): r.get("outcome")
            for r in self.records
            if r["event"] == "end"
        }
        self.reexecutions: Counter[str] = Counter()
        self.reclaims: list[float] = []
        self.outcome_lost: list[str] = []  # re-run after a store fault although it had finished
        self.infos: dict[str, Any] = {}
        self.longest_over_bound = float("-inf")  # reclaim minus its bound, the worst one
        self.reclaim_parts: list[chaos_reclaim.Reclaim] = []
        self._backlog: chaos_reclaim.Backlog | None = None

    def bad(self, check: str, message: str) -> None:
        self.violations[check].append(message)

    def store_fault_between(self, after: float, before: float) -> bool:
        return any(begin <= before and end >= after for begin, end in self.chaos.store_faults)

    def held_until(self, run: Any) -> float | None:
        """Until when a run holds what waits for it to end (a max_concurrency slot, a unique
        key): its end, its process's kill, or its freeze -- a frozen run's lease lapses and
        from then it has ended (DESIGN §6.1; counting it until the freeze only under-counts,
        never raises a false alarm)."""
        end = self.ended(run)
        for stopped, _resumed in self.faults.frozen.get(run.pid, []):
            if stopped >= run.start and (end is None or stopped < end):
                end = stopped
        return end

    def ended(self, run: Any) -> float | None:
        """When a run stopped: its end record, else its process's kill."""
        return run.end if run.end is not None else self.faults.killed_after(run.pid, run.start)

    def check_tasks(self) -> None:
        for task_id, (kind, status) in self.submitter.expected.items():
            info = get_task(task_id)
            self.infos[task_id] = info
            if info is None:
                at = self.submitter.accepted_at.get(task_id)
                when = "" if at is None else f" (submit returned at t={at - self.start:.2f}s)"
                self.bad("lost", f"{task_id} ({kind}): accepted, not in the storage{when}")
                continue
            self._check_status(task_id, kind, status, info)
        for task_id in self.submitter.uncertain:
            info = get_task(task_id)
            if info is not None:  # the submit raised, yet it was stored: it must run all the same
                self._check_status(task_id, "uncertain", None, info)

    def _check_status(self, task_id: str, kind: str, status: str | None, info: Any) -> None:
        value = info.status.value
        if not info.is_terminal:
            self.bad("stuck", f"{task_id} ({kind}): {value} after the drain")
        elif status is not None and value != status:
            self.bad(
                "wrong_status",
                f"{task_id} ({kind}): {value}, expected {status}: {(info.last_error or '')[:200]}",
            )
        if value == "COMPLETED" and not any(
            self.outcomes.get((task_id, r.attempt, r.pid)) == "return"
            for r in self.runs.get(task_id, [])
        ):
            self.bad("lost", f"{task_id} ({kind}): COMPLETED without a run that returned")

    def check_runs(self) -> None:
        """No concurrent duplicates; every re-execution has a cause; reclaim times."""
        limited = {"rated", "capped", "keyed"}
        for task_id, runs in self.runs.items():
            kind = self.submitter.expected.get(task_id, ("scheduled", ""))[0]
            for earlier, later in zip(runs, runs[1:], strict=False):
                ended = self.ended(earlier)
                if (ended is None or ended > later.start) and not self.faults.frozen_at(
                    earlier.pid, later.start
                ):
                    self.bad("concurrent_duplicates", f"{task_id} ({kind}): {earlier} and {later}")
                outcome = self.outcomes.get((task_id, earlier.attempt, earlier.pid))
                if outcome == "retryable":
                    self.reexecutions["handler_failed"] += 1
                    continue
                if later.start < earlier.start and self.faults.frozen_at(earlier.pid, later.start):
                    # The older attempt's handler began after the newer one's (runs are in
                    # attempt order): its worker wrote the start, then was frozen before the
                    # handler's first line (written after the thaw), and the newer attempt
                    # began meanwhile. The freeze caused the newer attempt.
                    self.reexecutions["worker_killed_or_frozen"] += 1
                    continue
                fault_at = self._worker_fault(earlier, later.start)
                if fault_at is not None:
                    self.reexecutions["worker_killed_or_frozen"] += 1
                    if kind not in limited:
                        last = later is runs[-1]
                        found = self.reclaim(task_id, fault_at, later, last)
                        self.reclaims.append(found.seconds)
                        self.reclaim_parts.append(found)
                        self.longest_over_bound = max(
                            self.longest_over_bound, found.seconds - found.bound
                        )
                        if found.late:
                            self.bad(
                                "reclaim_over_bound",
                                f"{task_id} ({kind}): {found.seconds:.2f}s after the fault > "
                                f"{found.bound:.2f}s ({found.describe()}): {earlier}, {later}",
                            )
                    continue
                # A killed connection fails its next use, which may come a while after the
                # kill: the outcome write of a run begun after it, say.
                if self.store_fault_between(earlier.start - self.args.lease_timeout, later.start):
                    self.reexecutions["store_fault"] += 1
                    if outcome in ("return", "fatal"):
                        # The handler had finished and its worker lived: an outage shorter than
                        # LEASE_TIMEOUT (every one here) must not cost its outcome.
                        self.outcome_lost.append(f"{task_id} ({kind}) attempt {earlier.attempt}")
                        self.bad(
                            "rerun_after_short_store_fault",
                            f"{task_id} ({kind}): "
                            f"{earlier} finished ({outcome}), ran again: {later}",
                        )
                    continue
                self.reexecutions["unattributed"] += 1
                self.bad(
                    "unattributed_reexecutions",
                    f"{task_id} ({kind}): {earlier}, {later} (first run's outcome: {outcome})",
                )

    def reclaim(
        self, task_id: str, fault_at: float, later: Any, last: bool
    ) -> chaos_reclaim.Reclaim:
        """The re-execution ``later`` of a task whose worker was lost at ``fault_at``, split
        into the recovery (its stored run_at, when ``later`` was its last run) and the pickup
        (bench/chaos_reclaim.py)."""
        args = self.args
        timing = chaos_reclaim.Timing(
            lease_timeout=args.lease_timeout,
            chores_interval=chores_interval(args),
            poll_interval=args.poll_interval,
            master_lock_ttl=args.master_lock_ttl,
            retry_interval=RETRY_INTERVAL_S,
        )
        faults = [t for kills in self.faults.kills.values() for t in kills]
        faults += [stopped for spans in self.faults.frozen.values() for stopped, _ in spans]
        # A store fault costs the master its round (and maybe its lock): recovery waits for
        # the settle time once the store answers again, as after a take-over.
        faults += [end for _, end in self.chaos.store_faults]
        info = self.infos.get(task_id)
        run_at = info.run_at.timestamp() if last and info is not None and info.run_at else None
        return chaos_reclaim.reclaim(fault_at, later.start, run_at, faults, self.backlog(), timing)

    def reclaim_summary(self) -> dict[str, Any]:
        """The reclaims split: the recovery (from the stored run_at, where known) against its
        promise, and the pickup against POLL_INTERVAL plus the backlog."""
        parts = self.reclaim_parts
        known = [r for r in parts if r.due_known]

        def longest(values: list[float]) -> float | None:
            return round(max(values), 2) if values else None

        return {
            "recovery_known": len(known),
            "longest_recovery": longest([r.due - r.retry_delay - r.fault_at for r in known]),
            "recoveries_after_promise": sum(r.due - r.retry_delay > r.recovered_by for r in known),
            "longest_pickup": longest([r.started - r.due for r in known]),
            "longest_backlog_allowance": longest(
                [r.pickup - self.args.poll_interval for r in parts]
            ),
        }

    def backlog(self) -> chaos_reclaim.Backlog:
        """The quick tasks' waits for a thread (chaos_reclaim.Backlog), built once."""
        if self._backlog is None:
            waits = [
                (submitted, runs[0].start)
                for task_id, submitted in self.submitter.submitted_at.items()
                if (runs := self.runs.get(task_id)) and runs[0].attempt == 1
            ]
            faults = [(t, t) for kills in self.faults.kills.values() for t in kills]
            faults += [(s, s) for spans in self.faults.frozen.values() for s, _ in spans]
            faults += list(self.chaos.store_faults)
            self._backlog = chaos_reclaim.Backlog(waits, faults)
        return self._backlog

    def _worker_fault(self, run: Any, again: float) -> float | None:
        """When the run's worker was killed or frozen between the run's start and the next
        run (``again``), or None. After the handler returned too: its outcome may still have
        been waiting in the worker (the completion writer batches) when the fault came."""
        killed = self.faults.killed_after(run.pid, run.start)
        if killed is not None and killed <= again:
            return killed
        for stopped, resumed in self.faults.frozen.get(run.pid, []):
            if stopped <= again and (resumed is None or resumed >= run.start):
                return max(stopped, run.start)
        return None

    def runs_of(self, kind: str) -> list[Any]:
        return [
            run
            for task_id, (k, _) in self.submitter.expected.items()
            if k == kind
            for run in self.runs.get(task_id, [])
        ]

    def check_limits(self) -> dict[str, Any]:
        from tests.support.processes import most_in_a_window, peak_overlap

        limit, window = RATE_LIMIT
        # As tests/integration/flow_control/test_rate_limits.py: the stored starts of any six
        # span more than W + half the limiter's margin (1.05 s, less 2 ms of rounding); the
        # handlers' own first lines the same, less the longest delay from a start write to its
        # handler (a loaded machine's). Tasks run once only: a re-run's start overwrites the
        # stored one.
        handler_at, written = [], []
        for task_id, (kind, _) in self.submitter.expected.items():
            runs, info = self.runs.get(task_id, []), self.infos.get(task_id)
            if kind == "rated" and len(runs) == 1 and info is not None and info.started_at:
                handler_at.append(runs[0].start)
                written.append(info.started_at.timestamp())
        delay = max((h - w for h, w in zip(handler_at, written, strict=True)), default=0.0)
        stored_most = most_in_a_window(written, 1.05 - 0.002) if written else 0
        handler_window = min(window, 1.05 - max(delay, 0.0) - 0.002)
        # A start write that reached its handler more than a window later (an overloaded
        # machine) leaves no window the handlers' clocks can be held to: the stored starts'
        # check above still holds them.
        most = (
            most_in_a_window(handler_at, handler_window) if handler_at and handler_window > 0 else 0
        )
        if stored_most > limit:
            self.bad(
                "rate_limit_exceeded",
                f"{stored_most} stored starts in 1.048 s: {self._crowded(written, 1.048, limit)}",
            )
        if most > limit:
            self.bad("rate_limit_exceeded", f"{most} handler starts in {handler_window:.3f}s")
        starts = [run.start for run in self.runs_of("rated")]
        capped = self.runs_of("capped")
        intervals = self.held_spans(capped)
        peak = peak_overlap(intervals) if intervals else 0
        if peak > MAX_CONCURRENCY:
            self.bad(
                "max_concurrency_exceeded",
                f"{peak} demo.chaos_capped runs at once; {self.crowding(capped, MAX_CONCURRENCY)}",
            )
        return {
            "rated_starts": len(starts),
            "rated_most_in_window": most,
            "rated_handler_window_s": round(handler_window, 3),
            "rated_start_to_handler_max_ms": round(delay * 1000, 1),
            "rated_stored_most_in_1048ms": stored_most,
            "rated_most_in_1s_all_runs": most_in_a_window(starts, window) if starts else 0,
            "rate_limit": f"{limit}/{window:g}s",
            "capped_runs": len(intervals),
            "capped_peak": peak,
            "max_concurrency": MAX_CONCURRENCY,
        }

    def held_spans(self, runs: list[Any]) -> list[tuple[float, float]]:
        """(start, held_until) of each run; one still held when the checks run, until now."""
        now = time.time()
        return [
            (run.start, end if (end := self.held_until(run)) is not None else now) for run in runs
        ]

    def crowding(self, runs: list[Any], cap: int) -> str:
        """When more than ``cap`` of ``runs`` were first held at once, and which (task, attempt,
        pid, start, end): to set beside the fault schedule."""
        spans = self.held_spans(runs)
        at = next(
            begin for begin, _ in sorted(spans) if sum(b <= begin < e for b, e in spans) > cap
        )
        crowd = [
            (run.task, run.attempt, run.pid, round(run.start - self.start, 3), run.end)
            for run, (begin, end) in zip(runs, spans, strict=True)
            if begin <= at < end
        ]
        return f"first at t={at - self.start:.2f}s: {crowd}"

    def check_key_concurrency(self) -> dict[str, Any]:
        """No concurrency_key of demo.chaos_keyed1/3 held more runs at once than the name's
        max_concurrency_per_key, each run counted from its handler's start to held_until (as
        the capped check). Every task whose submit was tried counts, an uncertain one too."""
        from tests.support.processes import peak_overlap

        by_key: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for task_id, name_key in self.submitter.keyed.items():
            by_key[name_key].extend(self.runs.get(task_id, []))
        runs: Counter[str] = Counter()
        peaks: Counter[str] = Counter()
        at_cap: Counter[str] = Counter()  # keys that reached their cap: the cap was binding
        for (name, key), key_runs in sorted(by_key.items()):
            cap = KEY_CAPS[name]
            peak = peak_overlap(self.held_spans(key_runs)) if key_runs else 0
            runs[name] += len(key_runs)
            peaks[name] = max(peaks[name], peak)
            at_cap[name] += peak >= cap
            if peak > cap:
                self.bad(
                    "key_concurrency_exceeded",
                    f"{peak} {name} runs of key {key!r} at once (cap {cap}); "
                    f"{self.crowding(key_runs, cap)}",
                )
        return {
            "keyed_tasks": dict(Counter(name for name, _ in self.submitter.keyed.values())),
            "keyed_runs": {name: runs[name] for name in KEY_CAPS},
            "keyed_peak": {name: peaks[name] for name in KEY_CAPS},
            "keyed_keys_at_cap": {name: at_cap[name] for name in KEY_CAPS},
            "max_concurrency_per_key": dict(KEY_CAPS),
        }

    def _crowded(self, written: list[float], window: float, limit: int) -> list[Any]:
        """The rated tasks of the first window holding more than ``limit`` stored starts: id,
        stored start, attempts, handler starts (for the report of a violation)."""
        starts = sorted(
            (info.started_at.timestamp(), task_id)
            for task_id, (kind, _) in self.submitter.expected.items()
            if kind == "rated"
            and (info := self.infos.get(task_id)) is not None
            and info.started_at is not None
        )
        for index in range(len(starts) - limit):
            if starts[index + limit][0] - starts[index][0] < window:
                return [
                    (
                        task_id,
                        round(at, 6),
                        self.infos[task_id].attempts,
                        [round(r.start, 6) for r in self.runs.get(task_id, [])],
                    )
                    for at, task_id in starts[index : index + limit + 1]
                ]
        return []

    def check_batches(self) -> dict[str, Any]:
        callbacks: dict[str, set[str]] = defaultdict(set)
        for record in self.records:
            if record["event"] == "report":
                callbacks[record["batch"]].add(record["task"])
        for batch_id in self.submitter.batches:
            found = callbacks.get(batch_id, set())
            if len(found) != 1:
                self.bad(
                    "batch_callbacks_not_once",
                    f"batch {batch_id}: {len(found)} callbacks ran ({sorted(found)})",
                )
        return {"batches": len(self.submitter.batches)}

    def check_dependencies(self) -> None:
        for chain in self.submitter.chains:
            for before, after in zip(chain, chain[1:], strict=False):
                returned = [
                    run.end
                    for run in self.runs.get(before, [])
                    if self.outcomes.get((before, run.attempt, run.pid)) == "return"
                ]
                later = self.runs.get(after, [])
                if later and (not returned or later[0].start < min(returned)):
                    self.bad(
                        "dependency_order",
                        f"{after} started at {later[0].start:.3f}, "
                        f"its dependency {before} returned at {returned}",
                    )

    def check_unique(self) -> None:
        for key, task_ids in self.submitter.unique.items():
            spans = []
            for task_id in task_ids:
                runs = self.runs.get(task_id, [])
                if runs:
                    ends = [self.held_until(r) for r in runs]
                    last = max((e for e in ends if e is not None), default=time.time())
                    spans.append((runs[0].start, last, task_id))
            spans.sort()
            for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
                if start < end:
                    self.bad(
                        "unique_overlap",
                        f"key {key}: {second} started at {start:.3f}, "
                        f"before {first} ended at {end:.3f}: {self.runs.get(first)}",
                    )

    def latency(self, baseline_end: float) -> dict[str, Any]:
        first_start = {}
        for task_id in self.submitter.submitted_at:
            runs = self.runs.get(task_id, [])
            if runs and runs[0].attempt == 1:
                first_start[task_id] = runs[0].start
        baseline, chaos = [], []
        for task_id, started in first_start.items():
            submitted = self.submitter.submitted_at[task_id]
            (baseline if submitted < baseline_end else chaos).append((started - submitted) * 1000)
        return {"no_faults": percentiles(baseline), "chaos": percentiles(chaos)}

    def series(self, end: float) -> list[dict[str, Any]]:
        """Per BUCKET_S: handler ends a second, and the quick tasks' latency by submit time."""
        buckets = int((end - self.start) // BUCKET_S) + 1
        ends = [0] * buckets
        for record in self.records:
            if record["event"] == "end":
                index = int((record["t"] - self.start) // BUCKET_S)
                if 0 <= index < buckets:
                    ends[index] += 1
        latencies: list[list[float]] = [[] for _ in range(buckets)]
        for task_id, submitted in self.submitter.submitted_at.items():
            runs = self.runs.get(task_id, [])
            index = int((submitted - self.start) // BUCKET_S)
            if runs and runs[0].attempt == 1 and 0 <= index < buckets:
                latencies[index].append((runs[0].start - submitted) * 1000)
        return [
            {
                "t_s": round(i * BUCKET_S, 1),
                "ended_per_s": round(ends[i] / BUCKET_S, 1),
                **{k: v for k, v in percentiles(latencies[i]).items() if k != "n"},
            }
            for i in range(buckets)
        ]


def get_task(task_id: str) -> Any:
    """executor.get_task, asked again after a connection error: the last fault may have
    killed this process's pooled connections, which a caller sees once."""
    from django_reliable_executor import executor

    for attempt in range(5):
        try:
            return executor.get_task(task_id)
        except Exception:
            if attempt == 4:
                raise
            Submitter._discard_connections()
            time.sleep(0.5)
    raise AssertionError("unreachable")


def chores_interval(args: argparse.Namespace) -> float:
    """The master's chores round (worker.py: min(1 s, MASTER_LOCK_TTL / 4))."""
    return min(1.0, args.master_lock_ttl / 4)


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------
def wait_drained(deadline: float, workers: list[Worker]) -> float | None:
    """Seconds until nothing was unfinished, or None at the deadline."""
    from django_reliable_executor import TaskStatus, executor

    began = time.time()
    while time.time() < deadline:
        try:
            counts = executor.count_by_status()
            left = sum(
                counts[s] for s in (TaskStatus.CREATED, TaskStatus.PENDING, TaskStatus.RUNNING)
            )
            if left == 0:
                return time.time() - began
        except Exception as exc:
            log(f"drain: {type(exc).__name__}: {exc}")
            Submitter._discard_connections()
        for worker in workers:
            if not worker.alive():
                log(f"drain: worker {worker.index} is gone: starting it again")
                worker.start()
        time.sleep(1.0)
    return None


def plot(path: Path, report: dict[str, Any]) -> None:
    """Throughput and latency over the run, with the faults marked."""
    soak_report.require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = report["series"]
    minutes = [s["t_s"] / 60 for s in series]
    figure, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    axes[0].plot(minutes, [s["ended_per_s"] for s in series], label="handler ends/s")
    axes[0].set_ylabel("throughput (ends/s)")
    nan = float("nan")
    for key in ("p50_ms", "p99_ms"):
        axes[1].plot(minutes, [nan if s[key] is None else s[key] for s in series], label=key)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("submit→start, quick tasks (ms)")
    axes[1].set_xlabel("minutes")
    colours = {"kill": "red", "kill_connections": "purple", "restart": "black"}
    seen: set[str] = set()
    freeze_from = None
    for event in report["faults"]["events"]:
        at = event["t_s"] / 60
        fault = event["fault"]
        if fault == "freeze":
            freeze_from = at
        elif fault == "thaw" and freeze_from is not None:
            for axis in axes:
                axis.axvspan(
                    freeze_from,
                    at,
                    color="orange",
                    alpha=0.2,
                    label=None if "frozen" in seen else "SIGSTOP",
                )
            seen.add("frozen")
        elif fault in colours and "skipped" not in event:
            for axis in axes:
                axis.axvline(
                    at,
                    color=colours[fault],
                    alpha=0.5,
                    linestyle="--",
                    label=None if fault in seen else fault,
                )
            seen.add(fault)
    axes[0].axvline(report["baseline_s"] / 60, color="green", label="faults start")
    for axis in axes:
        axis.legend(loc="upper right", fontsize="small")
    figure.suptitle(
        f"chaos soak {report['storage']} {report['rate']:g}/s seed {report['seed']}: "
        f"{'PASS' if report['ok'] else 'FAIL'}"
    )
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    throughput.add_store_arguments(parser, "reliable_executor_chaos")
    parser.add_argument("--minutes", type=float, default=60.0, help="submitting time")
    parser.add_argument("--rate", type=float, default=30.0, help="submits a second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help="runexecutor processes (8 threads each)"
    )
    parser.add_argument("--no-faults", action="store_true", help="the whole run fault-free")
    parser.add_argument(
        "--baseline-fraction",
        type=float,
        default=0.2,
        help="the fault-free start of the run (its latency is the reference)",
    )
    parser.add_argument(
        "--kill-every",
        type=float,
        nargs=2,
        default=(20.0, 45.0),
        metavar=("MIN", "MAX"),
        help="seconds between worker kills",
    )
    parser.add_argument("--conn-kill-every", type=float, default=300.0)
    parser.add_argument("--restart-every", type=float, default=900.0)
    parser.add_argument("--lease-timeout", type=float, default=10.0)
    parser.add_argument("--master-lock-ttl", type=float, default=4.0)
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument("--drain-seconds", type=float, default=180.0)
    parser.add_argument("--out", metavar="JSON", default=None, help="also write the report here")
    parser.add_argument("--plot", metavar="PNG", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.minutes <= 0:
        parser.error("--rate and --minutes must be > 0")
    if args.workers < (1 if args.no_faults else 2):
        # A kill during the freeze needs a worker that is not frozen.
        parser.error("--workers must be >= 2 (>= 1 with --no-faults)")
    if not 0 <= args.baseline_fraction <= 1:
        parser.error("--baseline-fraction must be within [0, 1]")
    args.threads = THREADS
    args.count_queries = None
    args.conn_max_age = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot:
        soak_report.require_matplotlib()
    workdir = Path(tempfile.mkdtemp(prefix="reliable_executor_chaos_"))
    workdir.chmod(0o755)  # the private PostgreSQL runs as the postgres user
    if args.db_name == "reliable_executor_chaos":  # concurrent runs on one server never share
        args.db_name = f"reliable_executor_chaos_{os.getpid()}"
    if args.sqlite_path.endswith("reliable_executor_chaos_bench.sqlite3"):
        args.sqlite_path = str(workdir / "chaos.sqlite3")
    server = SERVERS[args.storage]()
    workers: list[Worker] = []
    threads: list[Chaos] = []  # the chaos thread ends last: servers it restarted are its children
    store = None
    try:
        with throughput.terminate_on_sigterm():
            server.before_setup(args, workdir)
            os.environ.update(
                RE_JOURNAL=str(workdir / "journal.jsonl"),
                RE_LEASE_TIMEOUT=str(args.lease_timeout),
                RE_MASTER_LOCK_TTL=str(args.master_lock_ttl),
                RE_LOG_LEVEL=os.environ.get("RE_LOG_LEVEL", "CRITICAL"),
                # The checks read every task afterwards: a retention shorter than the run
                # purged its first tasks before the checks (the 60-minute MariaDB run's 364
                # "lost" were its first 12 seconds of submits).
                RE_BENCH_FINISHED_RETENTION=str(int(args.minutes * 60 + args.drain_seconds) + 3600),
            )
            store = throughput.open_store(args)
            store.clear()
            report = run(args, store, server, workers, threads, workdir)
    except (throughput.BenchError, RuntimeError) as exc:
        log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.stop()
        if store is not None:
            with contextlib.suppress(Exception):
                if args.storage == "mariadb":
                    soak.drop(store, True, False)
                store.close()
        with contextlib.suppress(Exception):
            server.close()
        for thread in threads:
            thread.release.set()
            thread.join(10)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    text = json.dumps(report, indent=1)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.plot:
        plot(Path(args.plot), report)
    return 0 if report["ok"] else 1


def run(
    args, store, server: Server, workers: list[Worker], threads: list[Chaos], workdir: Path
) -> dict[str, Any]:
    from django_reliable_executor import executor

    # Only now: these import pytest, which the test project's settings must not see at setup.
    from tests.support.journal import Faults, Journal

    journal = Journal(workdir / "journal.jsonl")
    faults = Faults()
    code = throughput.code_version()  # at the start: the code that ran, not the HEAD at the end
    log(f"store: {store.describe()}; code: {code}")
    load_before = throughput.machine_load()
    log(load_before)
    env = dict(os.environ)
    workers.extend(Worker(i, args, env) for i in range(args.workers))
    for worker in workers:
        worker.start()
    executor.schedule(
        SCHEDULE_ID,
        "demo.chaos",
        {"scheduled": True},
        every=SCHEDULE_EVERY_S,
        retry_limit=RETRY_LIMIT,
    )
    duration = args.minutes * 60
    baseline = duration if args.no_faults else duration * args.baseline_fraction
    start = time.time()
    plan = [] if args.no_faults else fault_plan(args, baseline, duration)
    chaos = Chaos(plan, workers, server, faults, start)
    threads.append(chaos)
    submitter = Submitter(args)
    chaos.start()

    def tick() -> None:
        chaos.watch_workers()
        elapsed = time.time() - start
        if int(elapsed) % 10 == 0:
            log(
                f"t={elapsed:.0f}s submitted {sum(submitter.counts.values())}, "
                f"errors {dict(submitter.errors)}"
            )

    submitter.run(start, duration, tick)
    submitted_until = time.time()
    with chaos.lock:  # a fault under way (a worker starting again) finishes first
        chaos.done.set()
    chaos.thaw_all()
    with contextlib.suppress(Exception):
        executor.delete_schedule(SCHEDULE_ID)
    log("submitting done; draining")
    drained = wait_drained(time.time() + args.drain_seconds, workers)
    log(f"drained in {drained}s" if drained is not None else "NOT drained by the deadline")
    gone_at_drain = [
        {"worker": index, "pid": worker.pid, "code": worker.process.process.returncode}
        for index, worker in enumerate(workers)
        if worker.process is not None and worker.process.process is not None
        and not worker.alive()
    ]  # fmt: skip
    for worker in workers:
        worker.stop()
    end = time.time()
    analysis = Analysis(args, submitter, journal, faults, chaos, start)
    for event in [e for e in chaos.events if e["fault"] == "exited"] + gone_at_drain:
        analysis.bad("worker_exited", f"{event}")
    analysis.check_tasks()
    analysis.check_runs()
    limits = {**analysis.check_limits(), **analysis.check_key_concurrency()}
    batches = analysis.check_batches()
    analysis.check_dependencies()
    analysis.check_unique()
    counts = {name: len(found) for name, found in analysis.violations.items()}
    reclaims = analysis.reclaims
    report: dict[str, Any] = {
        "storage": args.storage,
        "seed": args.seed,
        "rate": args.rate,
        "minutes": args.minutes,
        "no_faults": args.no_faults,
        "baseline_s": round(baseline, 1),
        "command": "python bench/chaos_soak.py " + " ".join(sys.argv[1:]),
        "code": code,
        "settings": {
            "workers": args.workers,
            "threads": THREADS,
            "lease_timeout_s": args.lease_timeout,
            "master_lock_ttl_s": args.master_lock_ttl,
            "chores_interval_s": chores_interval(args),
            "poll_interval_s": args.poll_interval,
            "kill_every_s": list(args.kill_every),
            "conn_kill_every_s": args.conn_kill_every,
            "restart_every_s": args.restart_every,
        },
        "submitted": dict(submitter.counts),
        "tasks_checked": len(submitter.expected),
        "submit_errors": dict(submitter.errors),
        "submits_uncertain": len(submitter.uncertain),
        "unique_deduplicated": submitter.deduplicated,
        "handler_runs": sum(len(runs) for runs in analysis.runs.values()),
        "drained_after_s": None if drained is None else round(drained, 1),
        "submitting_s": round(submitted_until - start, 1),
        "faults": {
            "planned": len(plan),
            "done": Counter(
                e["fault"] for e in chaos.events if "skipped" not in e and "error" not in e
            ),
            "skipped": sorted({e["skipped"] for e in chaos.events if "skipped" in e}),
            "errors": [e for e in chaos.events if "error" in e],
            "events": chaos.events,
        },
        "reexecutions": dict(analysis.reexecutions),
        "finished_runs_rerun_after_store_fault": analysis.outcome_lost[:50],
        "longest_store_fault_s": round(
            max((end - begin for begin, end in chaos.store_faults), default=0.0), 2
        ),
        "start_epoch": round(start, 3),
        "reclaim_s": {
            "n": len(reclaims),
            "max": round(max(reclaims), 2) if reclaims else None,
            "median": round(statistics.median(reclaims), 2) if reclaims else None,
            "bound_without_master_loss": (
                args.lease_timeout + chores_interval(args) + args.poll_interval
            ),
            "bound_after_master_loss": (
                args.master_lock_ttl
                + 1.5 * args.lease_timeout / 4
                + chores_interval(args)
                + args.poll_interval
            ),
            "worst_margin": (None if not reclaims else round(-analysis.longest_over_bound, 2)),
            **analysis.reclaim_summary(),
        },
        "limits": limits,
        **batches,
        "latency": analysis.latency(start + baseline),
        "checks": {name: {"violations": counts[name], "means": CHECKS[name]} for name in CHECKS},
        "violations": {name: found[:20] for name, found in analysis.violations.items() if found},
        "load_before": load_before,
        "load_after": throughput.machine_load(),
        "series": analysis.series(end),
    }
    fault_errors = report["faults"]["errors"]
    report["ok"] = not any(counts.values()) and drained is not None and not fault_errors
    return report


if __name__ == "__main__":
    sys.exit(main())
