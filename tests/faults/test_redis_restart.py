"""Redis (AOF, ``appendfsync always``) SIGKILLed mid-drain and started again on the same port and
data directory: nothing acknowledged is lost, no handler runs twice, and the same runexecutor
processes carry on by themselves. A quarter of the handlers are async, on the event loop."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.storage.redis import RedisStorage
from tests.conftest import db_params
from tests.support.journal import Run, check_runs
from tests.support.processes import MASTER_TTL, Backend, service_for, wait_until
from tests.support.redis_support import index_problems

if TYPE_CHECKING:
    from tests.support.redis_servers import SpareServers

pytest_plugins = ["tests.support.redis_servers"]  # spare_redis

LEASE = 8.0  # seconds: far longer than the outage, so no lease can lapse during it
FAST = {"lease_timeout": LEASE, "master_lock_ttl": MASTER_TTL}
POOL = (
    *("--core-pool-size", "4", "--max-pool-size", "4", "--queue-capacity", "1"),
    *("--async-concurrency", "4"),
)
TASKS = 200
DOWN = 3.0  # seconds Redis stays down


@pytest.mark.parametrize("alias", db_params(["redis"]))
def test_redis_killed_and_restarted_mid_drain(
    alias, spare_redis: SpareServers, workers, journal, faults
):
    server = spare_redis("--appendonly", "yes", "--appendfsync", "always")
    backend = Backend(alias, "restart", redis_url=server.url)
    service = service_for(backend)
    ids = [f"drain-{i:04d}" for i in range(TASKS)]
    # Every one of these was acknowledged (the call returned): each must end COMPLETED.
    service.submit_many(
        [
            TaskSubmitRequest(
                "demo.async_journal" if n % 4 == 0 else "demo.journal",
                {"sleep": 0.2},
                task_id=i,
                retry_limit=20,
            )
            for n, i in enumerate(ids)
        ]
    )
    running = [workers.start(backend, *POOL, env=journal.env(), **FAST) for _ in range(2)]

    pids = {p.pid for p in running}
    wait_until(
        lambda: pids <= journal.pids_running_after(0) and journal.started() >= TASKS // 5,
        60,
        "the drain did not start on both workers",
        logs=workers.logs,
    )
    killed_at = time.time()
    server.kill()  # SIGKILL: only what the AOF already holds survives
    # Longer than redis-py's retries (0.7 s in all), shorter than a lease: the workers meet
    # the outage (refused connections, failed writes) and their leases outlive it.
    time.sleep(DOWN)
    server.start()  # same port, same directory: the AOF is replayed before it answers PING
    restarted_at = time.time()
    outage = restarted_at - killed_at

    wait_until(
        lambda: service.count_by_status()[TaskStatus.COMPLETED] == TASKS,
        LEASE * 3 + 120,
        "the drain did not finish after the restart",
        logs=workers.logs,
    )

    def repeat_allowed(earlier: Run, later: Run) -> bool:
        """A run may repeat only if its lease could have lapsed while Redis was down: it was
        under way at the kill, and the outage outlasted the shortest remaining lease (a lease
        is renewed every LEASE/4). Nothing else may repeat: with ``appendfsync always`` every
        acknowledged write is on disk, a write whose reply the kill swallowed is sent again
        with its nonce and recognised as done, and one that never reached the disk was never
        acknowledged, so its worker still holds the claim and writes it again."""
        under_way = earlier.start <= killed_at and (earlier.end is None or earlier.end >= killed_at)
        return under_way and outage > LEASE * 3 / 4

    problems = check_runs(journal, faults, service, ids, repeat_allowed=repeat_allowed)
    assert not problems, "\n".join(problems[:20])
    # The indexes the AOF replay rebuilt are whole (and the queue set holds only live queues).
    assert isinstance(service.storage, RedisStorage)
    assert index_problems(service.storage) == []
    # The same processes, never restarted, met the outage and ran handlers after it.
    for process in running:
        assert "cannot be reached" in process.log(), process.log()
    assert pids <= journal.pids_running_after(restarted_at)
    for process in running:
        process.terminate()
    for process in running:
        assert process.wait(30) == 0, process.log()
    service.storage.close()
