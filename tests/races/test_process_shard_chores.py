"""runexecutor on a sharded Redis storage: the shards' chore locks spread over the workers, and
a killed holder's shards are taken over before its tasks' leases could lapse."""

from __future__ import annotations

import time

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.storage.lock_names import MASTER_LOCK_NAME, chore_lock_name
from django_reliable_executor.storage.redis.sharding import shard_of
from tests.conftest import db_params, require
from tests.support.processes import Backend, executions, service_for, wait_until

SHARDS = 4
# A lease long enough for the lock take-over (TTL, then a TTL more while the dead worker still
# counts as live, then a round) to come well within it; the lock TTL the other process tests'.
LEASE = 10.0
MASTER_TTL = 2.0
TIMINGS = {"lease_timeout": LEASE, "master_lock_ttl": MASTER_TTL}
NAMES = [chore_lock_name(shard) for shard in range(SHARDS)]


@pytest.mark.parametrize("alias", db_params(["redis"]))
def test_chore_locks_spread_and_a_killed_holders_shards_are_taken_over(alias, key_prefix, workers):
    require(alias)
    backend = Backend("redis", key_prefix, shards=SHARDS)
    service = service_for(backend)
    storage = service.storage
    pair = [workers.start(backend, wait_ready=False, **TIMINGS) for _ in range(2)]
    for process in pair:
        process.wait_ready()

    def spread():
        owners = storage.lock_owners(NAMES)
        held = sorted(owners.values(), key=str)
        ids = sorted(p.worker_id for p in pair)
        return owners if held == [ids[0], ids[0], ids[1], ids[1]] else None

    owners = wait_until(spread, 30, "the chore locks never spread two each", logs=workers.logs)
    assert NAMES[0] == MASTER_LOCK_NAME and service.master() == owners[MASTER_LOCK_NAME]

    # A task on a queue of shard 3 that hangs in its first attempt, until its worker is killed.
    assert shard_of("default", SHARDS) == 3
    task_id = service.submit(
        "demo.record", {"sleep": 30, "sleep_attempts": 1}, retry_interval=100
    ).task_id
    row = wait_until(
        lambda: executions(backend, task_id).first(), 20, "never started", logs=workers.logs
    )
    (runner,) = [p for p in pair if p.pid == row.pid]
    (survivor,) = [p for p in pair if p is not runner]
    assert owners[NAMES[3]] in {runner.worker_id, survivor.worker_id}
    runner.kill()
    killed_at = time.monotonic()

    def taken_over():
        owners = storage.lock_owners(NAMES)
        return set(owners.values()) == {survivor.worker_id}

    wait_until(taken_over, 30, "the survivor never held every chore lock", logs=workers.logs)
    # Before the killed worker's lease on the task lapsed: its recovery is not delayed by it.
    assert time.monotonic() - killed_at < LEASE
    done = wait_until(
        lambda: (t := service.get_task(task_id)) and t.status is TaskStatus.COMPLETED and t,
        60,
        "the killed worker's task was never recovered and run again",
        logs=workers.logs,
    )
    assert done.attempts == 2 and done.worker_id == survivor.worker_id
    assert "worker lost" in (done.last_error or "")
    storage.close()
