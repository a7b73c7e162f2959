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


def test_worker_burst_runs_everything(make_storage):
    service = ReliableExecutor(make_storage())  # the real clock
    ids = [service.submit("demo.echo", {"i": i}).task_id for i in range(30)]
    worker = Worker(WorkerOptions(burst=True, poll_interval=0.05), service)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert {service.get_task(i).status for i in ids} == {TaskStatus.COMPLETED}
