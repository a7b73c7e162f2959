"""The thread pool's starts: a thread starts claims only for itself and the threads waiting for
work (so a started claim runs at once), in one write, and hands them over (real backends)."""

from __future__ import annotations

import threading
import time

from django_reliable_executor.core.records import Claim
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.worker.pool import BoundedPool


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_claims_are_started_only_for_threads_free_to_run_them(executor, storage, clock):
    """Two threads held in their handlers: the three claims queued behind them stay unstarted
    in the storage until a thread is free; every claim a thread runs was started first."""
    ids = [executor.submit("demo.echo", n).task_id for n in range(5)]
    claims = storage.claim("w1", ["default"], 5, 60)
    assert len(claims) == 5
    gate = threading.Event()
    lock = threading.Lock()
    batches: list[list[str]] = []
    ran: list[tuple[str, TaskStatus]] = []

    def start(batch: list[Claim]) -> list[Claim | None]:
        with lock:
            batches.append([claim.task_id for claim in batch])
        return list(storage.start_many(batch, 60))

    def run(claim: Claim) -> None:
        with lock:
            ran.append((claim.task_id, claim.task.status))
        gate.wait(10)

    pool = BoundedPool(run, core_size=2, max_size=2, queue_capacity=10, start=start)
    try:
        pool.submit_many(claims)
        wait_until(lambda: len(ran) == 2)
        time.sleep(0.2)  # the queued three would be started by now, were they to be
        assert len(ran) == 2
        started = [task_id for batch in batches for task_id in batch]
        assert sorted(started) == sorted(task_id for task_id, _ in ran)
        stored = {task_id: storage.get(task_id).status for task_id in ids}
        assert sorted(stored.values()) == sorted(
            [TaskStatus.RUNNING] * 2 + [TaskStatus.CREATED] * 3
        ), stored
        assert pool.held_by_queue() == {"default": 5}
        gate.set()
        assert pool.wait_idle(10)
        assert sorted(task_id for task_id, _ in ran) == sorted(ids)
        assert {status for _, status in ran} == {TaskStatus.RUNNING}  # started before its run
        assert sorted(task_id for batch in batches for task_id in batch) == sorted(ids)
        assert all(storage.get(task_id).status is TaskStatus.RUNNING for task_id in ids)
        assert pool.held_by_queue() == {}
    finally:
        gate.set()
        pool.close()
        pool.join(5)


def test_claims_started_for_waiting_threads_share_one_write(executor, storage, clock):
    """Threads all waiting for work: the first claims of a batch are started in one write for
    them all, and a claim no longer ours (cancelled since) is not run and leaves the pool."""
    for n in range(4):
        executor.submit("demo.echo", n)
    claims = storage.claim("w1", ["default"], 4, 60)
    executor.cancel_task(claims[3].task_id)  # its claim's start is refused now
    batches: list[int] = []
    ran: list[str] = []
    lock = threading.Lock()

    def start(batch: list[Claim]) -> list[Claim | None]:
        with lock:
            batches.append(len(batch))
        return list(storage.start_many(batch, 60))

    def run(claim: Claim) -> None:
        with lock:
            ran.append(claim.task_id)

    pool = BoundedPool(run, core_size=4, max_size=4, queue_capacity=10, start=start)
    try:
        wait_until(lambda: pool.idle_threads() == 4)
        pool.submit_many(claims)
        assert pool.wait_idle(10)
        assert batches == [4]
        # The claims' order, not the submits': tasks submitted at one instant come in any order.
        assert sorted(ran) == sorted(claim.task_id for claim in claims[:3])
        assert pool.held_by_queue() == {}
        assert storage.get(claims[3].task_id).status is TaskStatus.CANCELLED
    finally:
        pool.close()
        pool.join(5)
