"""Queue isolation: ``runexecutor --queues slow:1,fast:4`` caps how many tasks of each queue one
worker holds and runs, so slow tasks never occupy every thread (real backends, no mocks)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from django_reliable_executor import TaskStatus
from django_reliable_executor.management.commands.runexecutor import parse_queues
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.worker.worker import Worker, WorkerOptions, format_queues
from tests.conftest import db_params, require
from tests.support.contract_support import GATE
from tests.support.processes import Backend, service_for

# -- parsing and validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "queues", "limits"),
    [
        ("default", ("default",), {}),
        ("a,b", ("a", "b"), {}),
        (" a , b ,", ("a", "b"), {}),
        (
            "mail:2,reports:1,default:5",
            ("mail", "reports", "default"),
            {
                "mail": 2,
                "reports": 1,
                "default": 5,
            },
        ),
        ("mail:2,default", ("mail", "default"), {"mail": 2}),
        (" mail : 3 ", ("mail",), {"mail": 3}),
    ],
)
def test_parse_queues(value, queues, limits):
    assert parse_queues(value) == (queues, limits)
    assert format_queues(queues, limits) == ",".join(
        f"{q}:{limits[q]}" if q in limits else q for q in queues
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("mail:0", "the limit of queue 'mail' must be an integer >= 1, not '0'"),
        ("mail:-1", "the limit of queue 'mail' must be an integer >= 1, not '-1'"),
        ("mail:two", "the limit of queue 'mail' must be an integer >= 1, not 'two'"),
        ("mail:1.5", "the limit of queue 'mail' must be an integer >= 1, not '1.5'"),
        ("mail:", "the limit of queue 'mail' must be an integer >= 1, not ''"),
        ("mail:2,default,mail:1", "queue 'mail' is named twice"),
        ("a,a", "queue 'a' is named twice"),
        (":2", "empty queue name in ':2'"),
        ("a,:", "empty queue name in ':'"),
        (",", "--queues needs at least one queue name"),
    ],
)
def test_bad_queues_are_a_command_error(value, message):
    with pytest.raises(CommandError) as excinfo:
        parse_queues(value)
    assert message in str(excinfo.value)
    with pytest.raises(CommandError) as excinfo:
        call_command("runexecutor", "--queues", value)
    assert message in str(excinfo.value)


# -- an in-process worker on each backend -----------------------------------------------------


def _wait_for(
    predicate: Callable[[], bool], timeout: float = 20.0, every: Callable[[], None] = lambda: None
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        every()
        if predicate():
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_a_full_queue_never_takes_every_thread(make_storage, caplog):
    service = ReliableExecutor(make_storage())  # the real clock
    slow = [service.submit("contract.gate", None, queue="slow").task_id for _ in range(6)]
    fast = [service.submit("demo.echo", i, queue="fast").task_id for i in range(20)]
    options = WorkerOptions(
        queues=("slow", "fast"),
        queue_limits={"slow": 1, "fast": 4},
        core_pool_size=5,
        max_pool_size=5,
        # Long: a slot freed in a limited queue must wake the claim loop, not the next poll.
        poll_interval=2.0,
        worker_id="iso",
    )
    worker = Worker(options, service)
    GATE.clear()
    peaks = {"running slow": 0, "held slow": 0, "held fast": 0}

    def sample() -> None:
        running = service.list_tasks(status=TaskStatus.RUNNING, queue="slow")
        held = worker.pool.held_by_queue()
        for key, value in (
            ("running slow", len(running)),
            ("held slow", held.get("slow", 0)),
            ("held fast", held.get("fast", 0)),
        ):
            peaks[key] = max(peaks[key], value)

    def all_done(ids: list[str]) -> bool:
        return {service.get_task(i).status for i in ids} == {TaskStatus.COMPLETED}

    caplog.set_level(logging.INFO, logger="django_reliable_executor")
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        # Every fast task completes while the slow ones block: one slow task runs, the rest
        # wait in the storage, unclaimed.
        _wait_for(lambda: all_done(fast), every=sample)
        time.sleep(0.3)  # plenty of claim rounds: none may take more of slow
        sample()
        assert [t.task_id for t in service.list_tasks(status=TaskStatus.RUNNING)] == [slow[0]]
        waiting = service.list_tasks(status=TaskStatus.CREATED, queue="slow")
        assert len(waiting) == 5
        assert {t.worker_id for t in waiting} == {None}
        assert worker.pool.held_by_queue() == {"slow": 1}
        # Work submitted to fast now still flows (the idle claim loop is woken or polls).
        more = [service.submit("demo.echo", i, queue="fast").task_id for i in range(10)]
        _wait_for(lambda: all_done(more), every=sample)
        # Opening the gate: each finished slow task frees its slot at once.
        opened = time.monotonic()
        GATE.set()
        _wait_for(lambda: all_done(slow), every=sample)
        assert time.monotonic() - opened < options.poll_interval * 1.5
    finally:
        GATE.set()
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    assert peaks == {"running slow": 1, "held slow": 1, "held fast": peaks["held fast"]}
    assert peaks["held fast"] <= 4
    assert worker.pool.held_by_queue() == {}
    assert "queues=slow:1,fast:4" in caplog.text
    GATE.clear()
    connections.close_all()


def test_unlimited_queues_share_the_pool_beside_a_limited_one(make_storage):
    """``--queues slow:1,other``: the unlimited queue takes what the pool has room for."""
    service = ReliableExecutor(make_storage())
    slow = [service.submit("contract.gate", None, queue="slow").task_id for _ in range(3)]
    other = [service.submit("contract.gate", None, queue="other").task_id for _ in range(6)]
    options = WorkerOptions(
        queues=("slow", "other"),
        queue_limits={"slow": 1},
        core_pool_size=4,
        max_pool_size=4,
        queue_capacity=0,
        poll_interval=0.05,
        worker_id="mixed",
    )
    worker = Worker(options, service)
    GATE.clear()
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        _wait_for(lambda: worker.pool.held_by_queue() == {"slow": 1, "other": 3})
        time.sleep(0.3)
        assert worker.pool.held_by_queue() == {"slow": 1, "other": 3}
        assert len(service.list_tasks(status=TaskStatus.RUNNING)) == 4
    finally:
        GATE.set()
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    done = {service.get_task(i).status for i in slow + other}
    assert TaskStatus.RUNNING not in done
    GATE.clear()
    connections.close_all()


def test_pool_counts_held_claims_per_queue(executor, storage):
    """No threads: the counts follow submit, a lost lease's drop, and the shutdown hand-back."""
    from django_reliable_executor.worker.pool import BoundedPool

    for queue in ("slow", "slow", "fast"):
        executor.submit("demo.echo", None, queue=queue)
    claims = storage.claim("w1", ["slow", "fast"], 10, 60)
    freed: list[int] = []
    pool = BoundedPool(
        lambda claim: None,
        core_size=0,
        max_size=0,
        queue_capacity=10,
        queue_limits={"slow": 2},
        on_freed=lambda: freed.append(pool.version),
    )
    for claim in claims:
        pool.submit(claim)
    assert pool.held_by_queue() == {"slow": 2, "fast": 1}
    fast = next(c for c in claims if c.task.queue == "fast")
    slow = next(c for c in claims if c.task.queue == "slow")
    pool.drop({fast.task_id})  # an unlimited queue: no wake-up
    assert (pool.held_by_queue(), pool.version, freed) == ({"slow": 2}, 0, [])
    pool.drop({slow.task_id})
    assert (pool.held_by_queue(), pool.version, freed) == ({"slow": 1}, 1, [1])
    assert len(pool.take_queued()) == 1
    assert pool.held_by_queue() == {}
    pool.close()


# -- the command, as a real process -----------------------------------------------------------


@pytest.mark.parametrize("alias", db_params(["postgres", "redis"]))
def test_runexecutor_runs_every_queue_under_its_limit(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    ids = [
        service.submit("demo.record", None, queue=queue).task_id
        for queue in ("mail", "reports", "default")
        for _ in range(5)
    ]
    process = workers.start(
        backend, "--queues", "mail:2,reports:1,default", "--burst", wait_ready=False
    )
    assert process.wait(60) == 0, workers.logs()
    assert {service.get_task(i).status for i in ids} == {TaskStatus.COMPLETED}
    log = process.log()
    assert f"runexecutor {process.worker_id}: queues mail:2,reports:1,default" in log
    assert "queues=mail:2,reports:1,default" in log


@pytest.mark.parametrize(
    "worker_id, message",
    [
        ("w" * 192, "--worker-id must be 1..191 characters, got 192"),
        ("", "--worker-id must be 1..191 characters, got 0"),
        ("a b", "--worker-id 'a b' contains whitespace or a control character"),
    ],
)
def test_a_worker_id_the_storage_cannot_hold_is_refused_at_start(worker_id, message):
    with pytest.raises(CommandError) as excinfo:
        call_command("runexecutor", "--worker-id", worker_id)
    assert message in str(excinfo.value)
