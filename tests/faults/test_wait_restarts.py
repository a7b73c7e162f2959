"""Durable sleeps across restarts, read from the handlers' own journal: a task sleeping while its
database server (MariaDB, PostgreSQL) or Redis (AOF) is stopped and started again, or while its
worker is SIGKILLed and another started (SQLite), is resumed on time, once, by the same or the
new worker, its step before the sleep never run again."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import db_params, require
from tests.faults.test_connections import server_stopped
from tests.support.processes import MASTER_TTL, Backend, service_for, wait_until

if TYPE_CHECKING:
    from tests.support.redis_servers import SpareServers

pytest_plugins = ["tests.support.redis_servers"]  # spare_redis

LEASE = 3.0  # seconds
FAST = {"lease_timeout": LEASE, "master_lock_ttl": MASTER_TTL}
SLEEP = 8.0  # seconds the task sleeps; the outage falls inside it
LATE = 6.0  # at most this much after its end is "on time" here (poll, reconnects, the master)


def sleeping(service, journal, logs) -> float:
    """Submit demo.waits sleeping SLEEP s; wait until it waits. Returns when its sleep ends."""
    service.submit("demo.waits", {"wait": "sleep", "seconds": SLEEP}, task_id="nap")
    first = wait_until(lambda: journal.events("nap", "start"), 30, "never started", logs=logs)
    wait_until(
        lambda: (t := service.get_task("nap")) is not None and t.waiting,
        30,
        "never waited",
        logs=logs,
    )
    return first[0]["t"] + SLEEP


def check_woke_on_time(service, journal, until: float, logs) -> None:
    done = wait_until(
        lambda: (t := service.get_task("nap")) is not None and t.is_terminal and t,
        SLEEP + 60,
        "the sleeping task did not end",
        logs=logs,
    )
    assert done.status is TaskStatus.COMPLETED, done.last_error
    assert (done.attempts, done.resumptions) == (1, 1)
    starts = journal.events("nap", "start")
    assert [r["resumptions"] for r in starts] == [0, 1]
    assert until - 0.05 <= starts[1]["t"] <= until + LATE, (starts[1]["t"] - until, logs())
    assert [r["step"] for r in journal.events("nap", "step")] == ["before", "after"]


@pytest.mark.restarts_servers  # alone under pytest-xdist (tests/conftest.py)
@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres"]))
def test_a_sleep_across_a_database_restart_wakes_on_time(alias, key_prefix, workers, journal):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    workers.start(backend, env=journal.env(), **FAST)
    until = sleeping(service, journal, workers.logs)
    with server_stopped(alias):
        time.sleep(2.0)
    assert time.time() < until, "the outage outlasted the sleep: make SLEEP longer"
    check_woke_on_time(service, journal, until, workers.logs)


@pytest.mark.parametrize("alias", db_params(["default"]))
def test_a_sleep_across_a_worker_killed_and_replaced_wakes_on_time(
    alias, key_prefix, workers, journal
):
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    first = workers.start(backend, env=journal.env(), **FAST)
    until = sleeping(service, journal, workers.logs)
    first.kill()  # SIGKILL: nothing of the sleep is in the worker
    workers.start(backend, env=journal.env(), **FAST)
    check_woke_on_time(service, journal, until, workers.logs)


@pytest.mark.parametrize("alias", db_params(["redis"]))
def test_a_sleep_across_a_redis_restart_wakes_on_time(
    alias, spare_redis: SpareServers, workers, journal
):
    server = spare_redis("--appendonly", "yes", "--appendfsync", "always")
    backend = Backend(alias, "wait-restart", redis_url=server.url)
    service = service_for(backend)
    workers.start(backend, env=journal.env(), **FAST)
    until = sleeping(service, journal, workers.logs)
    server.kill()  # SIGKILL: only what the AOF holds survives, the waiting task included
    time.sleep(2.0)
    server.start()
    assert time.time() < until, "the outage outlasted the sleep: make SLEEP longer"
    check_woke_on_time(service, journal, until, workers.logs)
