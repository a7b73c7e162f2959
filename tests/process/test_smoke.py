"""A first end-to-end check through the service and an in-process worker on every backend."""

from __future__ import annotations

import threading

from django_reliable_executor import TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.worker.worker import Worker, WorkerOptions


def test_submit_claim_run_complete(executor, storage, clock):
    info = executor.submit("demo.echo", {"x": 1}, task_id="smoke-1")
    assert info.status is TaskStatus.CREATED
    claims = storage.claim("w1", ["default"], 10, 60)
    assert [c.task_id for c in claims] == ["smoke-1"]
    started = storage.start(claims[0], 60)
    assert started is not None
    assert storage.complete(started, {"x": 1}) is not None
    done = executor.get_task("smoke-1")
    assert done.status is TaskStatus.COMPLETED
    assert done.result == {"x": 1}
    assert done.attempts == 1


def test_a_burst_ends_with_its_last_task_not_a_poll_interval_later(make_storage):
    """No ending wakes a wait for new work: a burst whose last claim came back empty while its
    last tasks ran (or waited for the completion writer) would wait out POLL_INTERVAL (60 s
    here) before it looked again."""
    service = ReliableExecutor(make_storage())  # the real clock
    for round_ in range(3):
        ids = [service.submit("demo.echo", {"i": i}).task_id for i in range(20)]
        worker = Worker(WorkerOptions(burst=True, poll_interval=60.0), service)
        thread = threading.Thread(target=worker.run)
        thread.start()
        thread.join(20)
        assert not thread.is_alive(), f"round {round_}: the burst still runs after 20 s"
        assert {service.get_task(i).status for i in ids} == {TaskStatus.COMPLETED}


def test_worker_burst_runs_everything(make_storage):
    service = ReliableExecutor(make_storage())  # the real clock
    ids = [service.submit("demo.echo", {"i": i}).task_id for i in range(30)]
    worker = Worker(WorkerOptions(burst=True, poll_interval=0.05), service)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert {service.get_task(i).status for i in ids} == {TaskStatus.COMPLETED}
