"""A Redis Cluster of 3 masters with a replica each: the master serving the key prefix's slot is
failed over mid-drain (``CLUSTER FAILOVER`` on its replica, then the old master killed or put
to sleep). The same runexecutor processes follow the new topology by themselves, every task
acknowledged before the failover's sync point completes, and no handler runs twice."""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.storage.redis import RedisStorage

from ..processes import MASTER_TTL, Backend, service_for, wait_until
from ..redis_support import index_problems
from .journal import Faults, Journal, check_runs

if TYPE_CHECKING:
    from tests.redis_servers import Cluster

pytest_plugins = ["tests.redis_servers"]  # redis_replicated_cluster

# Longer than anything the failover makes a worker wait (a manual failover switches in well
# under a second; a call caught on the sleeping old master waits out socket_timeout, 10 s), so
# no lease can lapse: any second run of a handler is then a lost write, not a recovery.
LEASE = 16.0
QUEUES = ("default", "alpha", "beta", "gamma")
POOL = ("--core-pool-size", "4", "--max-pool-size", "4", "--queue-capacity", "2")
TASKS = 160  # submitted before the drain, 0.1 s of work each
SLEEP = 6.0  # seconds the old master sleeps (DEBUG SLEEP) with then="sleep"


class Submitter(threading.Thread):
    """Submits one task at a time until stopped; records each id once its submit returned
    (acknowledged by the master) with when, and each submit that raised."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(name="submitter", daemon=True)
        self.service = service_for(backend)
        self.acknowledged: dict[str, float] = {}
        self.refused: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            task_id = f"live-{n:04d}"
            n += 1
            try:
                self.service.submit(
                    "demo.journal", {"sleep": 0.05}, task_id=task_id, queue=QUEUES[n % 4]
                )
            except Exception as exc:  # noqa: BLE001 - an unacknowledged submit is allowed
                self.refused.append(f"{task_id}: {exc!r}")
                time.sleep(0.05)
                continue
            self.acknowledged[task_id] = time.time()
            time.sleep(0.02)


@pytest.mark.parametrize("then", ["kill", "sleep"])
def test_workers_follow_a_cluster_failover_mid_drain(
    then, redis_replicated_cluster: Cluster, workers, journal: Journal, faults: Faults
):
    cluster = redis_replicated_cluster
    prefix = f"failover-{uuid.uuid4().hex[:8]}"
    master = cluster.master_of("{" + prefix + "}:counts")
    # The workers' REDIS_URL names another master: the node failed over is not their seed.
    seed = next(node for node in cluster.masters() if node is not master)
    backend = Backend("redis", prefix, redis_url=seed.url, redis_cluster=True)
    service = service_for(backend)
    ids = [f"drain-{i:04d}" for i in range(TASKS)]
    service.submit_many(
        [
            TaskSubmitRequest(
                "demo.journal", {"sleep": 0.1}, task_id=task_id, queue=QUEUES[n % 4], retry_limit=5
            )
            for n, task_id in enumerate(ids)
        ]
    )
    running = [
        workers.start(
            backend,
            "--queues",
            ",".join(QUEUES),
            *POOL,
            env=journal.env(),
            lease_timeout=LEASE,
            master_lock_ttl=MASTER_TTL,
        )
        for _ in range(2)
    ]
    pids = {process.pid for process in running}
    submitter = Submitter(backend)
    submitter.start()
    wait_until(
        lambda: pids <= journal.pids_running_after(0) and journal.started() >= TASKS // 4,
        60,
        "the drain did not start on both workers",
        logs=workers.logs,
    )

    # The sync point: every write the old master acknowledged is on its replica when the
    # replica takes over. A manual failover pauses the master's writers and lets the replica
    # catch up first, so offset_before (read before it began) is within what the new master has.
    acknowledged_before = set(submitter.acknowledged)
    failover = cluster.fail_over(master, then=then, sleep_seconds=SLEEP)
    assert failover.new is not master
    assert failover.offset_before > 0
    assert failover.offset_before <= failover.sync_offset
    assert cluster.master_of("{" + prefix + "}:counts") is failover.new
    time.sleep(2.0)  # keep submitting through the switch and a little after it
    submitter.stop.set()
    submitter.join(30)
    assert not submitter.is_alive()
    acknowledged = set(submitter.acknowledged)
    assert acknowledged_before < acknowledged  # submits went on after the failover
    assert any(at > failover.switched_at for at in submitter.acknowledged.values())

    everything = [*ids, *sorted(acknowledged)]
    wait_until(
        lambda: service.count_by_status()[TaskStatus.COMPLETED] >= len(everything),
        90,
        "the drain did not finish after the failover",
        logs=workers.logs,
    )
    # Every task acknowledged (not only before the sync point: a manual failover loses nothing)
    # completed, and no handler ran twice: no write was lost, no lease lapsed.
    problems = check_runs(journal, faults, service, everything)
    assert not problems, "\n".join(problems[:20]) + f"\n{failover}\n" + workers.logs()[-5000:]
    assert {t.attempts for t in service.storage.get_many(everything).values()} == {1}
    counts = service.count_by_status()
    assert counts[TaskStatus.COMPLETED] == len(everything), counts
    assert sum(counts.values()) == len(everything), counts
    # The drain was under way: tasks submitted before it started on both sides of the switch.
    starts = {r["task"]: r["t"] for r in journal.records() if r["event"] == "start"}
    assert any(starts[task_id] < failover.started_at for task_id in ids)
    assert any(starts[task_id] > failover.down_at for task_id in ids)
    # The same processes, never restarted, ran handlers after the failover.
    assert pids <= journal.pids_running_after(failover.down_at), workers.logs()
    assert all(process.alive() for process in running)
    # Every key of the prefix is on the new master, and its indexes are whole.
    storage = service.storage
    assert isinstance(storage, RedisStorage)
    assert index_problems(storage) == []
    with failover.new.client() as admin:
        assert admin.exists("{" + prefix + "}:counts") == 1
    for process in running:
        process.terminate()
    for process in running:
        assert process.wait(30) == 0, process.log()
    storage.close()
    submitter.service.storage.close()
