"""A Redis Cluster of 3 masters with a replica each: the master serving the key prefix's slot is
failed over mid-drain (``CLUSTER FAILOVER`` on its replica, then the old master killed or put
to sleep), or the master is killed and its replica forced to take over. The same runexecutor
processes follow the new topology by themselves, every task acknowledged before the failover's
sync point completes, and no handler runs twice at the same time (nor at all twice, after a
manual failover, which loses no write). The sync point is defined in docs/redis.md."""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.states import LIVE_STATUSES
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from tests.support.journal import Faults, Journal, Run, check_runs
from tests.support.processes import MASTER_TTL, Backend, service_for, wait_until
from tests.support.redis_support import index_problems

if TYPE_CHECKING:
    from tests.support.redis_clusters import Cluster

pytest_plugins = ["tests.support.redis_servers"]  # redis_replicated_cluster

# Far longer than anything a failover makes a worker wait (a manual failover switches in well
# under a second, a forced one in about one), so no lease lapses while the workers live: a
# second run of a handler can only come from a lost write, which only a forced failover allows.
LEASE = 8.0
QUEUES = ("default", "alpha", "beta", "gamma")
POOL = ("--core-pool-size", "4", "--max-pool-size", "4", "--queue-capacity", "2")
TASKS = 400  # submitted before the drain, 0.1 s of work each: 5 s for 8 threads
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


def _drained(service: ReliableExecutor, guaranteed: list[str]) -> bool:
    """Every task that must complete did, and nothing is left waiting or running."""
    counts = service.count_by_status()
    if any(counts[status] for status in LIVE_STATUSES):
        return False
    tasks = service.storage.get_many(guaranteed)
    return len(tasks) == len(guaranteed) and all(
        task.status is TaskStatus.COMPLETED for task in tasks.values()
    )


@pytest.mark.parametrize(
    ("then", "force"),
    [
        pytest.param("kill", False, id="failover-then-kill"),
        pytest.param("sleep", False, id="failover-then-sleep"),
        pytest.param("kill", True, id="kill-then-forced-failover"),
    ],
)
def test_workers_follow_a_cluster_failover_mid_drain(
    then: str,
    force: bool,
    redis_replicated_cluster: Cluster,
    workers,
    journal: Journal,
    faults: Faults,
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
        lambda: (
            pids <= journal.pids_running_after(0)
            and journal.started() >= TASKS // 4
            and len(submitter.acknowledged) >= 10
        ),
        60,
        "the drain did not start on both workers",
        logs=workers.logs,
    )

    failover = cluster.fail_over(master, then=then, force=force, sleep_seconds=SLEEP)
    # The sync point: the new master holds the old one's stream up to sync_offset, and every
    # write the old master acknowledged before offset_at is at or below offset_before.
    assert failover.new is not master
    assert 0 < failover.offset_before <= failover.sync_offset
    assert cluster.master_of("{" + prefix + "}:counts") is failover.new
    time.sleep(2.0)  # keep submitting through the switch and a little after it
    submitter.stop.set()
    submitter.join(30)
    assert not submitter.is_alive()
    acknowledged = submitter.acknowledged
    assert any(at > failover.switched_at for at in acknowledged.values())  # submits went on
    # Acknowledged before the sync point: each must complete. After it: a manual failover
    # loses nothing either; a forced one may lose what the old master acknowledged after its
    # replica's last copy (the few milliseconds between offset_at and the kill here): such a
    # task is gone, not half-stored.
    before = sorted(task_id for task_id, at in acknowledged.items() if at < failover.offset_at)
    after = sorted(set(acknowledged) - set(before))
    assert before and after
    guaranteed = [*ids, *before] + ([] if force else after)
    wait_until(
        lambda: _drained(service, guaranteed),
        60,
        "the drain did not finish after the failover",
        logs=workers.logs,
    )
    kept = sorted(service.storage.get_many(after))
    if not force:
        assert kept == after
    everything = [*ids, *before, *(task_id for task_id in after if task_id in kept)]

    def repeat_allowed(earlier: Run, later: Run) -> bool:
        """Forced failover only: a run whose outcome write the old master may have
        acknowledged after the replica's copy ended (it ended after offset_at) can run again
        once its lease lapses. A manual failover loses no write: nothing may repeat."""
        return force and (earlier.end is None or earlier.end >= failover.offset_at)

    problems = check_runs(journal, faults, service, everything, repeat_allowed=repeat_allowed)
    assert not problems, "\n".join(problems[:20]) + f"\n{failover}"
    counts = service.count_by_status()
    assert counts[TaskStatus.COMPLETED] == sum(counts.values()) == len(everything), counts
    if not force:
        assert {t.attempts for t in service.storage.get_many(everything).values()} == {1}
    # The drain was under way: tasks submitted before it started on both sides of the switch.
    starts = {r["task"]: r["t"] for r in journal.records() if r["event"] == "start"}
    assert any(starts[task_id] < failover.offset_at for task_id in ids)
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
