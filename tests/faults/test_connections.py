"""The workers' database connections killed under them (as a restart, failover, proxy or idle
timeout does), and the database server itself restarted, during a drain: every thread drops
its dead connection and reconnects, so the living workers finish every task and one of them is
master again, without being restarted and without running anything twice. A quarter of the
drain's handlers are async: their starts, written by the event loop's feeder thread, meet the
dead connections too."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from django.db import connections

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import IN_CI, SERVERS, db_params, require
from tests.support.journal import check_runs
from tests.support.processes import MASTER_TTL, Backend, executions, service_for, wait_until

# Longer than the shared LEASE: a heartbeat lost to a killed connection must not let a lease
# lapse, since nothing may run twice here.
LEASE = 3.0  # seconds
FAST = {"lease_timeout": LEASE, "master_lock_ttl": MASTER_TTL}
KILL_SECONDS = 15.0
SERVER_WAIT = 60.0  # seconds for a restarted server to answer


def _own_id(alias: str) -> int:
    """The server-side id of this test's own connection, which the killing spares."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT pg_backend_pid()" if alias == "postgres" else "SELECT CONNECTION_ID()"
        )
        return int(cursor.fetchone()[0])


def kill_connections(alias: str) -> int:
    """Terminate every server-side connection to this test's database but the test's own;
    returns how many. The killing runs on a connection of its own to another database."""
    database = connections[alias].settings_dict["NAME"]
    spared = _own_id(alias)
    host, port = SERVERS[alias]
    if alias == "postgres":
        import psycopg

        with psycopg.connect(
            host=host, port=port, user="postgres", dbname="postgres", autocommit=True
        ) as admin:
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid() AND pid <> %s",
                [database, spared],
            ).fetchall()
        return len(rows)
    import MySQLdb

    admin = MySQLdb.connect(host=host, port=port, user="root")
    try:
        cursor = admin.cursor()
        cursor.execute(
            "SELECT id FROM information_schema.processlist "
            "WHERE db = %s AND id <> CONNECTION_ID() AND id <> %s",
            [database, spared],
        )
        killed = 0
        for (connection_id,) in cursor.fetchall():
            try:
                cursor.execute(f"KILL CONNECTION {int(connection_id)}")
                killed += 1
            except MySQLdb.OperationalError:
                pass  # it went away by itself meanwhile
        return killed
    finally:
        admin.close()


def _answers(alias: str) -> bool:
    host, port = SERVERS[alias]
    command = (
        ["pg_isready", "-q", "-h", host, "-p", str(port)]
        if alias == "postgres"
        else ["mariadb-admin", "--protocol=tcp", "-h", host, "-P", str(port), "-uroot", "ping"]
    )
    return subprocess.run(command, capture_output=True).returncode == 0


def _start_server(alias: str) -> None:
    """Start the server the way .ci/run does (a no-op when it is running)."""
    if alias == "postgres":
        version = sorted(os.listdir("/etc/postgresql"))[-1]
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
            capture_output=True,
        )
    else:
        subprocess.run(["install", "-d", "-o", "mysql", "-g", "mysql", "/run/mysqld"], check=True)
        subprocess.run(
            [
                "start-stop-daemon",
                "--start",
                "--oknodo",
                "--background",
                "--exec",
                "/usr/sbin/mariadbd",
            ],
            check=True,
        )


@contextlib.contextmanager
def server_stopped(alias: str) -> Iterator[None]:
    """Stop the database server; start it again on leaving, whatever happened meanwhile, and
    wait until it answers."""
    try:
        if alias == "postgres":
            version = sorted(os.listdir("/etc/postgresql"))[-1]
            subprocess.run(
                [
                    "pg_ctlcluster",
                    "--skip-systemctl-redirect",
                    version,
                    "main",
                    "stop",
                    "-m",
                    "fast",
                ],
                check=True,
                capture_output=True,
            )
        else:
            host, port = SERVERS[alias]
            subprocess.run(
                [
                    "mariadb-admin",
                    "--protocol=tcp",
                    "-h",
                    host,
                    "-P",
                    str(port),
                    "-uroot",
                    "shutdown",
                ],
                check=True,
                capture_output=True,
            )
            # mariadb-admin returns once the server was told to stop; wait until it has.
            wait_until(lambda: not _answers(alias), SERVER_WAIT, "MariaDB did not stop")
            time.sleep(1.0)
        yield
    finally:
        deadline = time.monotonic() + SERVER_WAIT
        while not _answers(alias) and time.monotonic() < deadline:
            _start_server(alias)
            for _ in range(20):
                if _answers(alias):
                    break
                time.sleep(0.5)
        assert _answers(alias), f"{alias} did not start again"
        connections[alias].close()  # the test's own connection died with the server


def _drain(backend: Backend, workers, journal, count: int, sleep: float):
    service = service_for(backend)
    ids = [f"conn-{i:04d}" for i in range(count)]
    service.submit_many(
        [
            TaskSubmitRequest(
                "demo.async_journal" if n % 4 == 0 else "demo.journal",
                {"sleep": sleep},
                task_id=i,
                retry_limit=20,
            )
            for n, i in enumerate(ids)
        ]
    )
    started = [
        workers.start(backend, wait_ready=False, env=journal.env(), **FAST) for _ in range(2)
    ]
    for process in started:
        process.wait_ready()
    wait_until(lambda: journal.started() > 0, 30, "no handler started", logs=workers.logs)
    return service, ids, started


def _finish(service, ids, started, workers, journal, faults) -> None:
    """The outcome every scenario here requires, once the fault ended."""
    completed = lambda: service.count_by_status()[TaskStatus.COMPLETED] == len(ids)  # noqa: E731
    wait_until(completed, LEASE + 10, "not every task completed in time", logs=workers.logs)
    problems = check_runs(journal, faults, service, ids)
    assert not problems, "\n".join(problems[:20])
    assert all(process.alive() for process in started), workers.logs()
    owner = wait_until(
        lambda: service.storage.lock_owner("master"), LEASE + 10, "no master", logs=workers.logs
    )
    assert owner in {process.worker_id for process in started}
    # Nothing still waits for a master's recovery: no claim was left behind.
    assert not [
        t
        for t in service.list_tasks(limit=len(ids))
        if t.worker_id and t.status is not TaskStatus.COMPLETED
    ]
    for process in started:
        process.terminate()
    for process in started:
        assert process.wait(30) == 0, process.log()


@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres"]))
def test_connections_killed_every_second_during_a_drain(
    alias, key_prefix, workers, journal, faults
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service, ids, started = _drain(backend, workers, journal, 1000, 0.15)

    killed: list[tuple[int, int]] = []  # (connections killed, tasks not completed) per round
    deadline = time.monotonic() + KILL_SECONDS
    while time.monotonic() < deadline:
        left = len(ids) - service.count_by_status()[TaskStatus.COMPLETED]
        killed.append((kill_connections(alias), left))
        time.sleep(1.0)
    # The fault was real: connections were killed while tasks were still being drained.
    assert any(n > 0 and left > 0 for n, left in killed), killed
    assert sum(n for n, _ in killed) >= len(killed), killed
    _finish(service, ids, started, workers, journal, faults)


@pytest.mark.restarts_servers  # alone under pytest-xdist (tests/conftest.py)
@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres"]))
def test_database_server_restarted_during_a_drain(alias, key_prefix, workers, journal, faults):
    require(alias)
    if os.geteuid() != 0 and not IN_CI:  # under CI it runs, and fails if it cannot
        pytest.skip("restarting the database server needs root (runs under CI=true)")
    backend = Backend(alias, key_prefix)
    service, ids, started = _drain(backend, workers, journal, 400, 0.1)
    time.sleep(1.0)
    left = len(ids) - service.count_by_status()[TaskStatus.COMPLETED]
    assert left > 0, "the drain ended before the restart: nothing was tested"
    with server_stopped(alias):
        time.sleep(2.0)
    _finish(service, ids, started, workers, journal, faults)


@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres"]))
def test_async_handlers_orm_calls_survive_killed_connections(alias, key_prefix, workers, journal):
    """Async handlers reach the ORM through ``sync_to_async``, in asgiref's thread, not in one of
    the worker's own. Once the database killed that thread's connection, the next call there
    fails (as a pool thread's first query after a kill does), and the worker must then close
    the dead connection, or every ORM call of every async handler fails for good."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    workers.start(backend, env=journal.env(), **FAST)

    def drain(prefix: str) -> list[str]:
        ids = [f"{prefix}-{i}" for i in range(8)]
        service.submit_many(
            [
                TaskSubmitRequest("demo.async_journal", {"record": True}, task_id=i, retry_limit=3)
                for i in ids
            ]
        )
        wait_until(
            lambda: all(service.get_task(i).status.is_terminal for i in ids),
            LEASE * 3 + 20,
            f"the {prefix} tasks did not end",
            logs=workers.logs,
        )
        return ids

    before = drain("before")  # asgiref's thread now holds a connection of its own
    assert all(service.get_task(i).attempts == 1 for i in before)
    assert kill_connections(alias) > 0
    for round_ in range(2):
        for task_id in drain(f"after-{round_}"):
            task = service.get_task(task_id)
            assert task.status is TaskStatus.COMPLETED, (task.status, task.last_error)
            # The calls on the dead connection failed once; the retries had a new one.
            assert task.attempts <= 2, (task.attempts, task.last_error)
            rows = executions(backend, task_id).filter(attempt=task.attempts)
            assert rows.count() == 1, list(rows)
