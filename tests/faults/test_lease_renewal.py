"""The heartbeat of a real runexecutor: lease renewal depends on no other write, repeated
errors cannot keep the master from recovering a dead worker's tasks, and a heartbeat round that
came late (a handler holding the GIL) is logged."""

from __future__ import annotations

import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.master.chores import MasterChores
from tests.conftest import db_params, require
from tests.support.journal import check_runs
from tests.support.processes import Backend, service_for, wait_until
from tests.support.refusals import refused

LEASE = 1.5  # seconds: shorter than the shared LEASE; a renewal that stops shows sooner


@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres", "redis"]))
def test_many_long_queue_names_keep_leases_renewed(alias, key_prefix, workers, journal, faults):
    """11 queue names of 98 characters once overflowed the worker registry's column, and the
    failing registry write stopped lease renewal: tasks outliving the lease ran again."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    queues = [f"q{i:02d}-" + "x" * 94 for i in range(11)]
    assert all(len(queue) == 98 for queue in queues)
    ids = [f"long-{i}" for i in range(3)]
    service.submit_many(
        [
            TaskSubmitRequest("demo.journal", {"sleep": 3 * LEASE}, task_id=i, queue=queues[-1])
            for i in ids
        ]
    )
    worker = workers.start(
        backend, "--queues", ",".join(queues), env=journal.env(), lease_timeout=LEASE
    )
    wait_until(
        lambda: service.count_by_status()[TaskStatus.COMPLETED] == len(ids),
        30,
        "the tasks did not complete",
        logs=workers.logs,
    )
    problems = check_runs(journal, faults, service, ids)
    assert not problems, "\n".join(problems) + "\n" + worker.log()
    registered = {info.worker_id: info for info in service.storage.workers()}
    assert registered[worker.worker_id].queues == tuple(queues)
    worker.terminate()
    assert worker.wait(30) == 0, worker.log()


@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres"]))
def test_a_master_whose_registry_writes_fail_still_recovers(
    alias, key_prefix, workers, journal, faults
):
    """Every beat of the master fails to write the worker registry: it must still recover the
    tasks of a worker that was killed (each failed beat used to push recovery back again)."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    ids = [f"orphan-{i}" for i in range(3)]
    service.submit_many(
        [TaskSubmitRequest("demo.journal", {"sleep": 60}, task_id=i, queue="victim") for i in ids]
    )
    fast = {"lease_timeout": LEASE, "master_lock_ttl": 1.0}
    victim = workers.start(backend, "--queues", "victim", env=journal.env(), **fast)
    wait_until(lambda: journal.started() == len(ids), 30, "not started", logs=workers.logs)
    faults.kill(victim)
    with refused(alias, "reliable_executor_worker", events=("INSERT", "UPDATE")):
        master = workers.start(
            backend, "--queues", "default", env=journal.env(), log_level="INFO", **fast
        )
        wait_until(
            lambda: service.storage.lock_owner("master") == master.worker_id,
            30,
            "the second worker did not become master",
            logs=workers.logs,
        )
        # Recovered as "worker lost" (nothing else serves the victim queue: they then wait).
        wait_until(
            lambda: all(
                (task := service.get_task(i)) is not None
                and task.status is not TaskStatus.RUNNING
                and "worker lost" in (task.last_error or "")
                for i in ids
            ),
            LEASE * 2 + 15,
            "the master never recovered the killed worker's tasks",
            logs=workers.logs,
        )
        assert "could not write the worker registry" in master.log(), master.log()
    master.terminate()
    assert master.wait(30) == 0, master.log()


@pytest.mark.parametrize("alias", db_params(["postgres"]))
def test_a_handler_holding_the_gil_is_reported(alias, key_prefix, workers, journal):
    """A handler in one long C call starves the heartbeat thread: the late round is logged."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.journal", {"spin": 3 * LEASE}, task_id="spinner", retry_limit=0)
    worker = workers.start(backend, env=journal.env(), lease_timeout=LEASE)
    wait_until(
        lambda: "heartbeat came" in worker.log(),
        60,
        "no warning about the late heartbeat",
        logs=workers.logs,
    )
    line = next(line for line in worker.log().splitlines() if "heartbeat came" in line)
    assert "WARNING" in line and f"LEASE_TIMEOUT / 2 = {LEASE / 2:.2f}s" in line, line
    delay = float(line.split("heartbeat came ")[1].split("s ")[0])
    assert delay > LEASE / 2, line
    worker.terminate()
    worker.wait(60)


def test_recovery_waits_once_per_long_outage_and_never_on_every_error():
    """The chores' own rule, without a storage: errors alone never hold recovery back; the
    first success after an outage of ``outage_seconds`` or more does, once; writes that fail
    every other time, with successes in between, never do."""
    chores = MasterChores(None, 0, settle_seconds=30.0, outage_seconds=0.2)  # type: ignore[arg-type]
    held_back = lambda: chores._recover_from > time.monotonic()  # noqa: E731
    chores.storage_reached()
    for _ in range(5):  # failing and succeeding in turn, well within the outage threshold
        chores.storage_failed()
        assert not held_back()
        chores.storage_reached()
        assert not held_back()
    chores.storage_failed()
    time.sleep(0.25)  # an outage long enough for live workers' leases to lapse
    chores.storage_failed()
    assert not held_back()
    chores.storage_reached()
    assert held_back()
    chores._recover_from = 0.0
    chores.storage_reached()  # no new outage: no new wait
    assert not held_back()
