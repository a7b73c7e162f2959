"""Heartbeat writes that fail for a while on a living worker: every task still completes, the
worker renews its leases again by itself once the writes go through, and a task runs again only
where its lease really could lapse.

The fault: on the databases, a trigger makes the heartbeat's UPDATE (and only it) fail for
``WINDOW`` seconds; on Redis, a server of the test's own refuses every write for as long
(``min-replicas-to-write`` with no replica: claims, outcomes and heartbeats all fail). The
window is longer than ``LEASE_TIMEOUT``, so leases of tasks held through it do lapse.

What is asserted, besides every task COMPLETED and none lost (check_runs):
- a task runs again, or two of its runs overlap, only when its earlier run was held by the
  worker during the window and the later one started at least ``LEASE_TIMEOUT / 2`` after the
  window opened. A lease cannot lapse sooner: it was last renewed at most a heartbeat interval
  (``LEASE_TIMEOUT / 4``) before the window and lasts ``LEASE_TIMEOUT``. Anything else is a
  re-run while the lease was still good: a broken promise;
- the worker logged failed renewals (the fault happened) and ran handlers after the window
  without being restarted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.conftest import BACKENDS, db_params, new_storage, redis_client, require
from tests.support.journal import Run, check_runs
from tests.support.processes import FAST, LEASE, Backend, service_for, wait_until
from tests.support.refusals import HEARTBEAT, refused

pytest_plugins = ["tests.support.redis_servers"]

WINDOW = 2 * LEASE
TASKS = 60


@contextlib.contextmanager
def redis_refusing_writes(client) -> Iterator[None]:
    client.config_set("min-replicas-to-write", 1)
    try:
        yield
    finally:
        client.config_set("min-replicas-to-write", 0)


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_failing_heartbeat_writes(alias, key_prefix, workers, journal, faults, spare_redis):
    require(alias)
    backend = Backend(alias, key_prefix)
    env = journal.env()
    if alias == "redis":
        server = spare_redis()  # its own server: refusing writes must not touch the shared one
        env["RE_REDIS_URL"] = server.url
        client = redis_client(server.url)
        service = ReliableExecutor(new_storage("redis", key_prefix, redis_url=server.url))
        fault = redis_refusing_writes(client)
    else:
        service = service_for(backend)
        fault = refused(alias, "reliable_executor_task", condition=HEARTBEAT)
    ids = [f"beat-{i:03d}" for i in range(TASKS)]
    # Most tasks are short; every fifth of the first twenty outlives the lease, so it is running
    # when the window opens (the first started; the short ones fill the window after them).
    service.submit_many(
        [
            TaskSubmitRequest(
                "demo.journal",
                {"sleep": 2.5 * LEASE if i % 5 == 0 and i < 20 else 0.3},
                task_id=task_id,
                retry_limit=20,
            )
            for i, task_id in enumerate(ids)
        ]
    )
    worker = workers.start(
        backend,
        "--core-pool-size",
        "4",
        "--max-pool-size",
        "4",
        env=env,
        **FAST,
    )
    wait_until(lambda: journal.started() >= 4, 30, "no handler started", logs=workers.logs)
    time.sleep(LEASE)  # leases renewed a few times before the fault
    opened = time.time()
    with fault:
        time.sleep(WINDOW)
    closed = time.time()

    wait_until(
        lambda: service.count_by_status()[TaskStatus.COMPLETED] == TASKS,
        LEASE * 4 + 60,
        "the tasks did not all complete",
        logs=workers.logs,
    )

    def lease_could_lapse(earlier: Run, later: Run) -> bool:
        return earlier.start < closed and later.start >= opened + LEASE / 2

    problems = check_runs(
        journal,
        faults,
        service,
        ids,
        repeat_allowed=lease_could_lapse,
        overlap_allowed=lease_could_lapse,
    )
    assert not problems, "\n".join(problems[:20])
    assert "heartbeat: renewing" in worker.log(), worker.log()
    assert worker.pid in journal.pids_running_after(closed), worker.log()
    worker.terminate()
    assert worker.wait(30) == 0, worker.log()
