"""A paused queue with real runexecutor workers: nothing of it runs, the pause outlives a worker
restart, and a resume runs its tasks. What ran is read from the handler's own records (one
Execution row per run of demo.record)."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import db_params, require
from tests.support.processes import Backend, executions, service_for, wait_until


def ran(backend: Backend, task_id: str) -> bool:
    return executions(backend, task_id).filter(finished=True).exists()


def test_a_paused_queue_runs_nothing_across_a_restart_until_resumed(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.record", None, task_id="m0", queue="mail")
    first = workers.start(backend, "--queues", "mail,default")
    wait_until(lambda: ran(backend, "m0"), 60, "the worker ran nothing", logs=workers.logs)

    assert service.pause_queue("mail") is True
    service.submit("demo.record", None, task_id="m1", queue="mail")
    # Submitted after m1 with the same priority: a claim takes m1 first, unless mail is paused.
    service.submit("demo.record", None, task_id="d1", queue="default")
    wait_until(lambda: ran(backend, "d1"), 60, "d1 did not run", logs=workers.logs)
    assert not executions(backend, "m1").exists()
    assert service.get_task("m1").status is TaskStatus.CREATED

    first.terminate()
    assert first.wait(60) == 0
    second = workers.start(backend, "--queues", "mail,default")
    assert service.paused_queues() == {"mail"}
    service.submit("demo.record", None, task_id="d2", queue="default")
    wait_until(lambda: ran(backend, "d2"), 60, "d2 did not run", logs=workers.logs)
    assert not executions(backend, "m1").exists()
    # Logged after the banner that start waits for, but before the worker's first claim.
    assert "paused queues, claimed from once resumed: mail" in second.log()

    assert service.resume_queue("mail") is True
    wait_until(lambda: ran(backend, "m1"), 60, "m1 did not run once resumed", logs=workers.logs)
    assert executions(backend, "m1").count() == 1
    wait_until(
        lambda: service.get_task("m1").status is TaskStatus.COMPLETED,
        60,
        "m1's outcome was not recorded",
        logs=workers.logs,
    )


@pytest.mark.parametrize("alias", db_params(["redis"]), indirect=True)
def test_redis_pauses_and_resumes_a_running_worker_at_once(alias, key_prefix, workers):
    """With POLL_INTERVAL at 60 s, a worker that has been claiming from the queue stops at once
    when it is paused: the submits wake it, and its next claim takes d1 but not m1 (older, the
    same priority: a worker claiming from a stale list of queues would take it first). The
    resume's wake token is tested in the contract suite (test_resume_wakes_an_idle_worker);
    here the worker then runs m1."""
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.record", None, task_id="m0", queue="mail")
    workers.start(backend, "--queues", "mail,default", poll_interval=60)
    wait_until(lambda: ran(backend, "m0"), 30, "the worker ran nothing", logs=workers.logs)

    service.pause_queue("mail")
    service.submit("demo.record", None, task_id="m1", queue="mail")
    service.submit("demo.record", None, task_id="d1", queue="default")
    wait_until(lambda: ran(backend, "d1"), 30, "d1 did not run", logs=workers.logs)
    assert not executions(backend, "m1").exists()

    service.resume_queue("mail")
    wait_until(
        lambda: ran(backend, "m1"), 30, "the resume did not wake the worker", logs=workers.logs
    )
    service.storage.close()


def test_a_burst_worker_does_not_wait_for_a_paused_queue(alias, key_prefix, workers):
    """--burst exits once nothing claimable is near: a paused queue's due task does not keep
    it running (it would otherwise wait for it for ever)."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.record", None, task_id="m1", queue="mail")
    service.submit("demo.record", None, task_id="d1", queue="default")
    service.pause_queue("mail")
    burst = workers.start(backend, "--burst", "--queues", "mail,default")
    assert burst.wait(60) == 0
    assert ran(backend, "d1")
    assert not executions(backend, "m1").exists()
    assert service.get_task("m1").status is TaskStatus.CREATED
