"""Losing Redis is survivable: a redis-server with AOF (appendfsync always) is stopped mid-run,
gracefully or with SIGKILL, and started again on the same port and data directory. Meanwhile
submits raise a StorageUnavailableError naming the server; the same Worker object logs, backs
off and resumes by itself; no task acknowledged before the outage is lost."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from django.db import transaction

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.conf import ExecutorSettings
from django_reliable_executor.core.records import TaskInfo
from django_reliable_executor.core.states import TERMINAL_STATUSES
from django_reliable_executor.exceptions import StorageUnavailableError
from django_reliable_executor.master.lock import MASTER_LOCK_NAME
from django_reliable_executor.registry import FLOW_LIMITS
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage import build_storage
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.worker.worker import Worker, WorkerOptions

if TYPE_CHECKING:
    from tests.support.redis_servers import RedisServer, SpareServers

pytest_plugins = ["tests.support.redis_servers"]  # spare_redis

pytestmark = pytest.mark.django_db(
    transaction=True, databases=["default"], available_apps=["django_reliable_executor", "demo"]
)

LEASE = 2.0  # seconds: leases of the tasks held at the outage expire while Redis is down
LOGGER = "django_reliable_executor"


# -- helpers ----------------------------------------------------------------------------------
def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.05)


def task(executor: ReliableExecutor, task_id: str) -> TaskInfo:
    info = executor.get_task(task_id)
    assert info is not None, f"task {task_id} is not stored"
    return info


def unreachable(server: RedisServer) -> str:
    """The start of the message of a StorageUnavailableError for this server."""
    return re.escape(f"Redis at {server.url} cannot be reached: ")


@contextlib.contextmanager
def running(
    executor: ReliableExecutor, worker_id: str, queues: tuple[str, ...] = ("default",)
) -> Iterator[tuple[Worker, threading.Thread]]:
    """A Worker with the executor's settings, run in a thread; stopped and joined on exit."""
    options = WorkerOptions.from_settings(executor, worker_id=worker_id, queues=queues)
    worker = Worker(options, executor)
    thread = threading.Thread(target=worker.run, name=f"worker-{worker_id}", daemon=True)
    thread.start()
    try:
        yield worker, thread
    finally:
        worker.request_stop()
        thread.join(30)
        assert not thread.is_alive(), f"worker {worker_id} did not stop"


def messages(caplog: pytest.LogCaptureFixture, start: str, after: float = 0.0) -> list[str]:
    """Messages of our logger starting with ``start``, logged at or after ``after`` (epoch)."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == LOGGER
        and record.getMessage().startswith(start)
        and record.created >= after
    ]


def executions() -> Counter[str]:
    """How often demo.record's handler ran, per task id."""
    from demo.models import Execution

    return Counter(Execution.objects.values_list("task_id", flat=True))


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture
def aof_server(spare_redis: SpareServers) -> RedisServer:
    """A throw-away server that fsyncs its AOF before acknowledging each write."""
    return spare_redis("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def executor(aof_server: RedisServer) -> Iterator[ReliableExecutor]:
    """The service on the AOF server, its storage built from settings as runexecutor does."""
    settings = ExecutorSettings(
        STORAGE="redis",
        REDIS_URL=aof_server.url,
        KEY_PREFIX="outage",
        POLL_INTERVAL=0.2,
        LEASE_TIMEOUT=LEASE,
        MASTER_LOCK_TTL=1.0,
        DEFAULT_RETRY_INTERVAL=100,
        CORE_POOL_SIZE=4,
        MAX_POOL_SIZE=4,
        QUEUE_CAPACITY=4,
    )
    storage = build_storage(settings, flow_limits=FLOW_LIMITS)
    assert isinstance(storage, RedisStorage)
    yield ReliableExecutor(storage, settings=settings)
    storage.close()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=LOGGER)
    return caplog


# -- tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
def test_worker_rides_out_a_redis_restart_and_loses_nothing(
    aof_server: RedisServer, executor: ReliableExecutor, logs: pytest.LogCaptureFixture, hard
):
    before = [f"before-{i}" for i in range(40)]
    executor.submit_many(
        [TaskSubmitRequest("demo.record", {"sleep": 0.1}, task_id=task_id) for task_id in before]
    )
    with running(executor, "survivor") as (worker, thread):
        wait_for(
            lambda: executor.count_by_status()[TaskStatus.COMPLETED] >= 8, 20, "the run to start"
        )
        assert executor.count_by_status()[TaskStatus.COMPLETED] < len(before)  # mid-run
        aof_server.stop(hard=hard)
        down_at = time.monotonic()

        # While Redis is down: a clear error naming the server, and nothing stored.
        with pytest.raises(StorageUnavailableError, match=unreachable(aof_server)):
            executor.submit("demo.record", {}, task_id="during")
        with pytest.raises(StorageUnavailableError, match=unreachable(aof_server)):
            executor.count_by_status()
        # The worker logs each failure and backs off; stay down until it failed twice and the
        # leases it held have expired.
        wait_for(lambda: len(messages(logs, "claiming failed")) >= 2, 20, "two failed claim rounds")
        time.sleep(max(0.0, down_at + LEASE + 0.5 - time.monotonic()))
        assert thread.is_alive()
        up_at = time.time()  # before start(): the worker may be back before start() returns
        aof_server.start()  # same port, same data directory

        after = [f"after-{i}" for i in range(10)]
        for task_id in after:
            executor.submit("demo.record", {}, task_id=task_id)
        everything = before + after
        wait_for(
            lambda: executor.count_by_status()[TaskStatus.COMPLETED] == len(everything),
            40,
            "every task to complete after the restart",
        )
        assert thread.is_alive()  # the same worker, never restarted
        assert worker.last_poll_at is not None and worker.last_poll_at > up_at

    # Nothing acknowledged is lost; nothing refused was stored; every handler ran.
    assert executor.get_task("during") is None
    counts = executor.count_by_status()
    assert counts[TaskStatus.COMPLETED] == len(everything) == sum(counts.values())
    tasks = executor.storage.get_many(everything)
    assert set(tasks) == set(everything)
    for task_id, info in tasks.items():
        assert info.status is TaskStatus.COMPLETED, task_id
        assert isinstance(info.result, int), task_id  # demo.record returns the worker's pid
        assert info.worker_id == "survivor"
        assert info.attempts >= 1
    ran = executions()
    assert set(ran) == set(everything)  # at least once each; a lost completion may repeat one
    assert all(ran[task_id] >= 1 for task_id in everything)

    # What the worker logged: the failure (naming Redis), a backoff, then work again.
    failures = [
        record
        for record in logs.records
        if record.name == LOGGER and record.getMessage().startswith("claiming failed")
    ]
    assert failures[0].levelno == logging.ERROR
    assert failures[0].exc_info is not None
    error = failures[0].exc_info[1]
    assert isinstance(error, StorageUnavailableError)
    assert re.match(unreachable(aof_server), str(error))
    waits = [float(m.rsplit(" ", 1)[1].rstrip("s")) for m in messages(logs, "claiming failed")]
    # docs/redis.md: "tries again after 0.5 s, doubling up to 5 s"
    assert len(waits) >= 2
    assert waits == [min(0.5 * 2**n, 5.0) for n in range(len(waits))]
    assert messages(logs, "worker survivor lost the master lock")
    assert messages(logs, "worker survivor took the master lock", after=up_at)
    assert messages(logs, "task after-", after=up_at)  # "task after-N (demo.record): ... COMPLETED"


def test_master_lock_and_chores_resume_after_the_outage(
    aof_server: RedisServer, executor: ReliableExecutor, logs: pytest.LogCaptureFixture
):
    """Delayed work due during and after the outage runs; a lease that expired while Redis was
    down is recovered by the chores, which only the master runs."""
    storage = executor.storage
    soon = executor.submit("demo.record", {}, task_id="due-during", delay_millis=1500)
    later = executor.submit("demo.record", {}, task_id="due-after", delay_millis=6000)
    executor.submit("demo.flaky", {"fail_times": 1}, task_id="retry", retry_interval=1500)
    executor.submit("demo.record", {}, task_id="orphan", queue="ghosts")
    [orphan] = storage.claim("ghost", ["ghosts"], 1, 1.0)
    assert storage.start(orphan, 1.0) is not None  # a worker that dies now, holding a lease

    with running(executor, "keeper", ("default", "ghosts")) as (_, thread):
        wait_for(lambda: storage.lock_owner(MASTER_LOCK_NAME) == "keeper", 10, "the master lock")
        wait_for(
            lambda: task(executor, "retry").status is TaskStatus.PENDING, 10, "a first failure"
        )
        aof_server.kill()
        down_at = time.monotonic()
        wait_for(
            lambda: messages(logs, "worker keeper lost the master lock"), 10, "mastership lost"
        )
        time.sleep(max(0.0, down_at + 3.0 - time.monotonic()))  # past the orphan's lease
        up_at = time.time()
        aof_server.start()
        assert task(executor, "due-after").status is TaskStatus.CREATED  # not due yet
        wait_for(
            lambda: all(
                task(executor, task_id).status in TERMINAL_STATUSES
                for task_id in ("due-during", "due-after", "retry", "orphan")
            ),
            20,
            "every task to finish",
        )
        assert storage.lock_owner(MASTER_LOCK_NAME) == "keeper"
        assert thread.is_alive()

    due_during, due_after = task(executor, "due-during"), task(executor, "due-after")
    assert due_during.status is TaskStatus.COMPLETED and due_during.started_at is not None
    assert due_during.started_at >= soon.run_at
    assert due_after.status is TaskStatus.COMPLETED and due_after.started_at is not None
    assert due_after.started_at >= later.run_at
    assert due_after.started_at.timestamp() > up_at
    retried = task(executor, "retry")
    assert (retried.status, retried.attempts) == (TaskStatus.COMPLETED, 2)
    recovered = task(executor, "orphan")
    assert (recovered.status, recovered.attempts, recovered.worker_id) == (
        TaskStatus.COMPLETED,
        2,
        "keeper",
    )
    assert "worker lost: ghost stopped renewing its lease" in (recovered.last_error or "")
    assert set(executions()) == {"due-during", "due-after", "orphan"}
    assert messages(logs, "master lock: storage error, giving up mastership")
    assert messages(logs, "worker keeper took the master lock", after=up_at)


def test_submit_in_atomic_with_redis_down(aof_server: RedisServer, executor: ReliableExecutor):
    """Redis storage writes on commit (DESIGN §2, transactional submit). What Redis being down
    does to a submit inside transaction.atomic() on the default database, precisely."""
    from demo.models import Execution

    aof_server.stop()
    # Down already at submit: submit reads Redis at once (ids already stored are returned as
    # stored), so it raises inside the block, and the caller's transaction rolls back with it.
    with (
        pytest.raises(StorageUnavailableError, match=unreachable(aof_server)),
        transaction.atomic(),
    ):
        Execution.objects.create(task_id="business-1", attempt=0, pid=0)
        executor.submit("demo.echo", "x", task_id="tx-1")
    assert not Execution.objects.filter(task_id="business-1").exists()

    # Up at submit, down at commit: submit returns the task as it will be; the write runs in
    # on_commit, after the database committed, and its error comes out of the atomic block.
    # The business row is committed, the task is not stored: the caller must handle it.
    # The caller's own on_commit hooks registered after the submit are skipped (Django runs
    # the hooks in order and stops at one that raises).
    aof_server.start()
    hooks_run: list[str] = []
    with (
        pytest.raises(StorageUnavailableError, match=unreachable(aof_server)),
        transaction.atomic(),
    ):
        Execution.objects.create(task_id="business-2", attempt=0, pid=0)
        transaction.on_commit(lambda: hooks_run.append("before submit"))
        info = executor.submit("demo.echo", "y", task_id="tx-2")
        assert info.status is TaskStatus.CREATED
        transaction.on_commit(lambda: hooks_run.append("after submit"))
        aof_server.stop()
    assert Execution.objects.filter(task_id="business-2").exists()
    assert hooks_run == ["before submit"]
    aof_server.start()
    assert executor.get_task("tx-1") is None
    assert executor.get_task("tx-2") is None
    assert sum(executor.count_by_status().values()) == 0


def test_a_handler_that_succeeded_during_the_outage_is_not_failed_by_its_own_master(
    aof_server: RedisServer, executor: ReliableExecutor
):
    """The handler returns while Redis is down, for longer than LEASE_TIMEOUT. When Redis is
    back, the master (this same worker) must let the heartbeat renew the lease before it
    recovers expired ones: otherwise it records "worker lost" for a task that succeeded —
    FAILED, with no retry left."""
    executor.submit("demo.record", {"sleep": 1.0}, task_id="pay", retry_limit=0)
    with running(executor, "w"):
        wait_for(lambda: task(executor, "pay").status is TaskStatus.RUNNING, 10, "the start")
        aof_server.stop(hard=True)
        time.sleep(LEASE + 1)  # the handler returns meanwhile; its lease looks expired
        aof_server.start()
        wait_for(lambda: task(executor, "pay").status in TERMINAL_STATUSES, 20, "the outcome")
    done = task(executor, "pay")
    assert (done.status, done.attempts, done.last_error) == (TaskStatus.COMPLETED, 1, None)
    assert executions() == {"pay": 1}
