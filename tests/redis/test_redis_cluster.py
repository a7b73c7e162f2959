"""The Redis storage on a real 3-master Redis Cluster (started by the tests/support/redis_servers.py
fixture): tasks submitted, run by a real Worker thread and finished through a RedisCluster
client, with every key of a prefix in the prefix's one hash slot, on one node."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis.cluster
import redis.exceptions

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.conf import ExecutorSettings
from django_reliable_executor.registry import FLOW_LIMITS
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage import build_storage
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.sharding import directory_of
from django_reliable_executor.worker.worker import Worker, WorkerOptions
from tests.support.processes import most_in_a_window, peak_overlap

if TYPE_CHECKING:
    from tests.support.redis_servers import RedisServer

pytest_plugins = ["tests.support.redis_servers"]  # redis_cluster, redis_cluster_nodes

QUEUES = ("default", "alpha", "beta", "prio", "orphan")
LEASE = 2.0  # seconds: short, so an abandoned claim is recovered within the test
LIVE = (TaskStatus.CREATED, TaskStatus.PENDING, TaskStatus.RUNNING)


# -- helpers ----------------------------------------------------------------------------------
def cluster_settings(url: str, prefix: str, shards: int = 1) -> ExecutorSettings:
    return ExecutorSettings(
        REDIS_SHARDS=shards,
        STORAGE="redis",
        REDIS_URL=url,
        REDIS_CLUSTER=True,
        KEY_PREFIX=prefix,
        POLL_INTERVAL=0.2,
        LEASE_TIMEOUT=LEASE,
        MASTER_LOCK_TTL=1.0,
        DEFAULT_RETRY_INTERVAL=100,
        CORE_POOL_SIZE=4,
        MAX_POOL_SIZE=8,
        QUEUE_CAPACITY=20,
    )


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.05)


def live_count(executor: ReliableExecutor) -> int:
    counts = executor.count_by_status()
    return sum(counts[status] for status in LIVE)


@contextlib.contextmanager
def running(
    executor: ReliableExecutor, worker_id: str, queues: tuple[str, ...] = QUEUES
) -> Iterator[Worker]:
    """A Worker with the executor's settings, run in a thread; stopped and joined on exit."""
    options = WorkerOptions.from_settings(executor, queues=queues, worker_id=worker_id)
    worker = Worker(options, executor)
    thread = threading.Thread(target=worker.run, name=f"worker-{worker_id}", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        thread.join(30)
        assert not thread.is_alive(), f"worker {worker_id} did not stop"


def slot_of(node: RedisServer, prefix: str) -> int:
    """CLUSTER KEYSLOT of the prefix's hash tag, asked of a node."""
    with node.client() as admin:
        return int(admin.execute_command("CLUSTER", "KEYSLOT", "{" + prefix + "}:counts"))


def keys_on(node: RedisServer, prefix: str) -> set[str]:
    """The keys of one prefix stored on one node (SCAN sees only the node's own keys)."""
    with node.client() as admin:
        return set(admin.scan_iter(match="{" + prefix + "}:*", count=1000))


def master_of(nodes: list[RedisServer], key: str) -> RedisServer:
    """The master serving ``key``'s slot: the one node that does not answer MOVED."""
    owners = []
    for node in nodes:
        with node.client() as admin:
            try:
                admin.exists(key)
            except redis.exceptions.MovedError:
                continue
        owners.append(node)
    assert len(owners) == 1, owners
    return owners[0]


def owner_of(nodes: list[RedisServer], prefix: str) -> RedisServer:
    """The master serving the prefix's slot (the one hash tag of an unsharded prefix)."""
    return master_of(nodes, "{" + prefix + "}:counts")


def assert_in_one_slot_on_one_node(nodes: list[RedisServer], prefix: str) -> set[str]:
    """Every key of the prefix hashes to one slot, lives on the slot's master, and no other
    node holds a key of the prefix. Returns the keys."""
    owner = owner_of(nodes, prefix)
    slot = slot_of(owner, prefix)
    keys = keys_on(owner, prefix)
    assert keys, f"no key of {prefix} on {owner}"
    with owner.client() as admin:
        slots = {int(admin.execute_command("CLUSTER", "KEYSLOT", key)) for key in keys}
        in_slot = set(admin.execute_command("CLUSTER", "GETKEYSINSLOT", slot, len(keys) + 1000))
    assert slots == {slot}
    assert keys <= in_slot
    for node in nodes:
        if node is not owner:
            assert keys_on(node, prefix) == set(), f"keys of {prefix} on {node}"
            with node.client() as admin:  # the slot is not served there at all
                assert int(admin.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) == 0
    return keys


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture
def prefixes(redis_cluster_nodes: list[RedisServer]) -> Iterator[list[str]]:
    """Key prefixes a test uses (append to it); their keys are deleted from every node after."""
    used: list[str] = []
    yield used
    for node in redis_cluster_nodes:
        with node.client() as admin:
            for prefix in used:
                keys = list(admin.scan_iter(match="{" + prefix + "}:*", count=1000))
                for start in range(0, len(keys), 500):
                    admin.delete(*keys[start : start + 500])  # one slot: a multi-key DEL is fine
                # REDIS_SHARDS: a node may hold several shards (slots): one key at a time
                for key in admin.scan_iter(match="{" + prefix + ":shard-*", count=1000):
                    admin.delete(key)


@pytest.fixture
def make_executor(redis_cluster: list[str]) -> Iterator[Callable[..., ReliableExecutor]]:
    """Executors on the Cluster through RedisCluster clients built by connect(); closed after."""
    made: list[RedisStorage] = []

    def make(prefix: str, node: int = 0, shards: int = 1) -> ReliableExecutor:
        settings = cluster_settings(redis_cluster[node], prefix, shards)
        storage = build_storage(settings, flow_limits=FLOW_LIMITS)
        assert isinstance(storage, RedisStorage)
        made.append(storage)
        return ReliableExecutor(storage, settings=settings)

    yield make
    for storage in made:
        storage.close()


# -- tests ------------------------------------------------------------------------------------
def test_submit_run_and_finish_tasks_through_a_cluster(
    make_executor, prefixes, redis_cluster_nodes: list[RedisServer]
):
    prefix = f"cluster-{uuid.uuid4().hex[:10]}"
    prefixes.append(prefix)
    executor = make_executor(prefix, node=1)
    storage = executor.storage
    assert isinstance(storage, RedisStorage)
    assert isinstance(storage.client, redis.cluster.RedisCluster)
    assert len(storage.client.get_primaries()) == 3
    assert storage.where == f"cluster via {redis_cluster_nodes[1].url}"

    # submit, one at a time and in a batch, over several queues and priorities
    singles = {
        f"one-{i}": executor.submit(
            "demo.echo", {"one": i}, task_id=f"one-{i}", priority=i % 3
        ).parameter
        for i in range(20)
    }
    batch_queues = ("default", "alpha", "beta")
    requests = [
        TaskSubmitRequest(
            task_name="demo.echo",
            task_parameter={"many": i},
            task_id=f"many-{i}",
            queue=batch_queues[i % 3],
            priority=i % 5 - 2,
        )
        for i in range(300)
    ]
    infos = executor.submit_many(requests)
    assert [info.task_id for info in infos] == [f"many-{i}" for i in range(300)]
    assert {info.status for info in infos} == {TaskStatus.CREATED}
    # Idempotent: a known id returns the stored task, nothing is queued twice.
    again = executor.submit("demo.echo", {"other": 1}, task_id="many-7", queue="beta")
    assert (again.parameter, again.queue) == ({"many": 7}, "alpha")
    # priorities: claimed highest first, FIFO within one priority
    for i, priority in enumerate([0, 5, -3, 5, 0, 9]):
        executor.submit("demo.echo", {"p": i}, task_id=f"p-{i}", queue="prio", priority=priority)
    delayed = executor.submit("demo.echo", "late", task_id="delayed", delay_millis=1500)
    executor.submit("demo.flaky", {"fail_times": 2}, task_id="flaky", retry_limit=3)
    executor.submit("demo.always_fails", None, task_id="doomed", retry_limit=1)
    executor.submit("demo.echo", "never", task_id="cancelled", delay_millis=60_000)
    executor.submit("demo.echo", "orphaned", task_id="orphan", queue="orphan")
    total = 20 + 300 + 6 + 5
    assert executor.cancel_task("cancelled") is True
    assert executor.cancel_task("cancelled") is False

    counts = executor.count_by_status()
    assert counts[TaskStatus.CREATED] == total - 1
    assert counts[TaskStatus.CANCELLED] == 1
    assert sum(counts.values()) == total
    assert executor.count_by_status(queue="beta")[TaskStatus.CREATED] == 100
    assert executor.count_by_status(queue="prio")[TaskStatus.CREATED] == 6
    assert [t.task_id for t in executor.list_tasks(queue="prio")] == [
        f"p-{i}"
        for i in reversed(range(6))  # newest first
    ]
    assert [t.task_id for t in executor.list_tasks(status=TaskStatus.CANCELLED)] == ["cancelled"]
    assert len(executor.list_tasks(queue="alpha", limit=1000)) == 100
    assert len(executor.list_tasks(status=TaskStatus.CREATED, limit=50, offset=300)) == 30

    # A short lease, abandoned: recover_expired hands unstarted claims back (no attempt) and
    # counts a failed attempt for a started one.
    claims = storage.claim("probe", ["prio"], 10, 0.5)
    assert [c.task_id for c in claims] == ["p-5", "p-1", "p-3", "p-0", "p-4", "p-2"]
    assert storage.start(claims[0], 0.5) is not None
    assert storage.recover_expired(100) == []  # not expired yet
    time.sleep(0.6)
    recovered = storage.recover_expired(100)
    assert [(t.task.task_id, t.task.status) for t in recovered] == [("p-5", TaskStatus.PENDING)]
    assert "worker lost: probe" in executor.get_task("p-5").last_error
    back = storage.get_many([f"p-{i}" for i in range(5)])
    assert {(t.status, t.attempts, t.worker_id) for t in back.values()} == {
        (TaskStatus.CREATED, 0, None)
    }
    # Another one abandoned while running: the master's chores must recover this one.
    [orphan] = storage.claim("ghost", ["orphan"], 10, 1.0)
    assert storage.start(orphan, 1.0) is not None

    with running(executor, "cluster-worker"):
        wait_for(lambda: live_count(executor) == 0, 60, "every task to finish")
        doomed = executor.get_task("doomed")
        assert (doomed.status, doomed.attempts) == (TaskStatus.FAILED, 2)
        # manual retry: back to PENDING with a fresh budget, run twice more by the worker
        assert executor.retry_task("doomed") is True
        assert executor.retry_task("one-0") is False  # COMPLETED is not retryable by hand
        wait_for(
            lambda: executor.get_task("doomed").attempts == 4 and live_count(executor) == 0,
            30,
            "the manual retry to run out",
        )

    counts = executor.count_by_status()
    assert counts[TaskStatus.COMPLETED] == total - 2
    assert (counts[TaskStatus.FAILED], counts[TaskStatus.CANCELLED]) == (1, 1)
    assert sum(counts.values()) == total
    assert executor.get_task("doomed").status is TaskStatus.FAILED
    assert "this task always fails" in executor.get_task("doomed").last_error

    everything = storage.get_many(
        [*singles, *(f"many-{i}" for i in range(300)), *(f"p-{i}" for i in range(6))]
    )
    assert len(everything) == 20 + 300 + 6
    for task_id, info in everything.items():
        assert info.status is TaskStatus.COMPLETED, task_id
        assert info.result == info.parameter, task_id
        assert info.started_at is not None and info.finished_at is not None
        assert info.finished_at >= info.started_at >= info.created_at
    assert {everything[f"p-{i}"].attempts for i in range(5)} == {1}
    assert everything["p-5"].attempts == 2  # the started claim's lost attempt counts
    late = executor.get_task("delayed")
    assert late.status is TaskStatus.COMPLETED and late.result == "late"
    assert (late.started_at - delayed.created_at).total_seconds() >= 1.5
    flaky = executor.get_task("flaky")
    assert (flaky.status, flaky.attempts, flaky.result) == (
        TaskStatus.COMPLETED,
        3,
        "succeeded on attempt 3",
    )
    orphaned = executor.get_task("orphan")
    assert (orphaned.status, orphaned.attempts, orphaned.worker_id) == (
        TaskStatus.COMPLETED,
        2,
        "cluster-worker",
    )
    assert "worker lost: ghost" in orphaned.last_error

    keys = assert_in_one_slot_on_one_node(redis_cluster_nodes, prefix)
    p = "{" + prefix + "}:"
    assert len([key for key in keys if key.startswith(p + "t:")]) == total
    assert {p + "counts", p + "finished", p + "queues"} <= keys


def test_two_key_prefixes_on_different_masters(
    make_executor, prefixes, redis_cluster_nodes: list[RedisServer]
):
    """Two apps sharing a Cluster: prefixes whose slots live on different masters, the same
    task ids in both, each worker sees only its own prefix's tasks."""
    by_owner: dict[int, str] = {}
    for _ in range(100):
        candidate = f"app-{uuid.uuid4().hex[:10]}"
        by_owner.setdefault(owner_of(redis_cluster_nodes, candidate).port, candidate)
        if len(by_owner) == 2:
            break
    first, second = by_owner.values()
    prefixes.extend([first, second])
    assert slot_of(redis_cluster_nodes[0], first) != slot_of(redis_cluster_nodes[0], second)
    executors = {first: make_executor(first, node=0), second: make_executor(second, node=2)}
    for prefix, executor in executors.items():
        executor.submit_many(
            [
                TaskSubmitRequest(
                    task_name="demo.echo",
                    task_parameter={"app": prefix, "i": i},
                    task_id=f"shared-{i}",
                    queue=QUEUES[i % 2],
                )
                for i in range(50)
            ]
        )
        assert executor.count_by_status()[TaskStatus.CREATED] == 50

    with running(executors[first], "first-worker"), running(executors[second], "second-worker"):
        wait_for(
            lambda: all(live_count(executor) == 0 for executor in executors.values()),
            30,
            "both apps' tasks to finish",
        )

    owners = {prefix: owner_of(redis_cluster_nodes, prefix) for prefix in executors}
    assert owners[first] is not owners[second]
    for prefix, executor in executors.items():
        assert executor.count_by_status()[TaskStatus.COMPLETED] == 50
        tasks = executor.storage.get_many([f"shared-{i}" for i in range(50)])
        assert {t.status for t in tasks.values()} == {TaskStatus.COMPLETED}
        assert {t.result["app"] for t in tasks.values()} == {prefix}
        expected_worker = "first-worker" if prefix == first else "second-worker"
        assert {t.worker_id for t in tasks.values()} == {expected_worker}
        keys = assert_in_one_slot_on_one_node(redis_cluster_nodes, prefix)
        assert keys == keys_on(owners[prefix], prefix)


def test_shards_spread_queues_over_the_masters_and_one_worker_drains_them(
    make_executor, prefixes, redis_cluster_nodes: list[RedisServer]
):
    """REDIS_SHARDS = 3 on 3 masters: each shard's hash tag on its own master, six queues over
    the shards, every key of a queue on its shard's master; one worker serving all six queues
    drains them."""
    prefix = f"sharded-{uuid.uuid4().hex[:10]}"
    prefixes.append(prefix)
    executor = make_executor(prefix, node=0, shards=3)
    storage = executor.storage
    assert isinstance(storage, RedisStorage)
    owners = [master_of(redis_cluster_nodes, p + "counts").port for p in storage.prefixes]
    assert len(set(owners)) == 3  # each shard's slot range lies on another master
    queues = ("orphan", "emails", "default", "alpha", "prio", "search")  # two per shard
    assert sorted(storage.layout.shard_of(q) for q in queues) == [0, 0, 1, 1, 2, 2]
    ids = [
        info.task_id
        for info in executor.submit_many(
            [
                TaskSubmitRequest("demo.echo", {"i": i}, queue=queues[i % 6], priority=i % 3)
                for i in range(120)
            ]
        )
    ]
    given = executor.submit("demo.echo", {"given": 1}, task_id="given-id", queue="search")
    again = executor.submit("demo.echo", {"other": 1}, task_id="given-id", queue="orphan")
    assert (again.queue, again.parameter) == ("search", {"given": 1})
    assert executor.count_by_status()[TaskStatus.CREATED] == 121
    for queue in queues:  # a queue's keys on its shard's master only
        shard = storage.layout.shard_of(queue)
        owner = master_of(redis_cluster_nodes, storage.prefixes[shard] + "counts")
        with owner.client() as admin:
            assert admin.zcard(f"{storage.prefixes[shard]}prio:{queue}") > 0
    with running(executor, "sharded-worker", queues):
        wait_for(lambda: live_count(executor) == 0, 60, "every shard's tasks to finish")
    counts = executor.count_by_status()
    assert counts[TaskStatus.COMPLETED] == 121 and sum(counts.values()) == 121
    assert {t.status for t in storage.get_many([*ids, given.task_id]).values()} == {
        TaskStatus.COMPLETED
    }
    assert len(executor.list_tasks(status=TaskStatus.COMPLETED, limit=500)) == 121


def test_schedules_live_fire_and_move_on_their_queues_masters(
    make_executor, prefixes, redis_cluster_nodes: list[RedisServer]
):
    """REDIS_SHARDS = 3 on 3 masters: a schedule of each shard's queue, its hash on that
    shard's master; listed and paused across masters; each fire stored on its master with an
    id native to its shard; a schedule moved to a queue of another master fires there next."""
    prefix = f"sched-sharded-{uuid.uuid4().hex[:10]}"
    prefixes.append(prefix)
    executor = make_executor(prefix, node=1, shards=3)
    storage = executor.storage
    assert isinstance(storage, RedisStorage)
    queues = ("orphan", "emails", "default", "alpha", "prio", "search")
    by_shard = {storage.layout.shard_of(q): q for q in queues}
    assert sorted(by_shard) == [0, 1, 2]

    def holders(schedule_id: str) -> list[int]:
        found = []
        for shard, shard_prefix in enumerate(storage.prefixes):
            owner = master_of(redis_cluster_nodes, shard_prefix + "counts")
            with owner.client() as admin:
                if admin.exists(shard_prefix + "s:" + schedule_id):
                    found.append(shard)
        return found

    for shard, queue in by_shard.items():
        executor.schedule(f"c{shard}", "demo.echo", {"s": shard}, every=60, queue=queue)
        assert holders(f"c{shard}") == [shard]
    assert [s.schedule_id for s in executor.list_schedules()] == ["c0", "c1", "c2"]
    assert executor.pause_schedule("c1").paused
    assert executor.count_schedules() == {"active": 2, "paused": 1}
    assert not executor.resume_schedule("c1").paused
    first = executor.get_schedule("c0").next_run_at

    def fire_at(when: dt.datetime) -> list:
        return storage.fire_due(
            when, 1000, grace=dt.timedelta(hours=1), catch_up_limit=10, max_tasks=5000
        ).created

    fired = fire_at(first + dt.timedelta(seconds=1))
    assert sorted(t.queue for t in fired) == sorted(by_shard.values())
    for task in fired:
        home = storage.layout.shard_of(task.queue)
        assert directory_of(task.task_id, 3) == home
        assert executor.get_task(task.task_id).queue == task.queue
    moved = executor.schedule("c0", "demo.echo", {"s": 0}, every=60, queue=by_shard[2])
    assert holders("c0") == [2] and moved.next_run_at == first + dt.timedelta(seconds=60)
    again = fire_at(moved.next_run_at + dt.timedelta(seconds=1))
    [c0] = [t for t in again if t.task_id.startswith("c0@")]
    assert (c0.queue, c0.run_at) == (by_shard[2], moved.next_run_at)
    assert directory_of(c0.task_id, 3) == 2


def test_a_chain_and_a_batch_across_the_masters_of_three_shards(make_executor, prefixes):
    """REDIS_SHARDS = 3 on 3 masters: a chain whose steps alternate between the shards, and a
    batch whose members are on all three with callbacks on two others, run by one worker: the
    messages between the masters (each shard's outbox) release each step after the one before
    and call the batch back once."""
    prefix = f"xsharded-{uuid.uuid4().hex[:10]}"
    prefixes.append(prefix)
    executor = make_executor(prefix, node=0, shards=3)
    storage = executor.storage
    assert isinstance(storage, RedisStorage)
    queues = ("orphan", "default", "prio")  # shards 0, 1, 2
    steps = [
        TaskSubmitRequest("demo.echo", {"i": i}, task_id=f"step{i}", queue=queues[i % 3])
        for i in range(7)
    ]
    executor.chain(steps)
    members = [
        TaskSubmitRequest("demo.echo", {"m": i}, task_id=f"m{i}", queue=queues[i % 3])
        for i in range(30)
    ]
    executor.submit_batch(
        members,
        batch_id="across",
        on_complete=TaskSubmitRequest("demo.echo", {}, task_id="cb-done", queue="prio"),
        on_success=TaskSubmitRequest("demo.echo", {}, task_id="cb-ok", queue="default"),
    )
    with running(executor, "xsharded-worker", queues):
        wait_for(lambda: live_count(executor) == 0, 60, "the chain, the batch and its callbacks")
    tasks = storage.get_many([s.task_id for s in steps])
    finished = sorted((tasks[s.task_id].finished_at, s.task_id) for s in steps)
    # In chain order. (Not started_at against the step before's finished_at: on Redis a
    # task's started_at is its claim's clock reading, taken before the claim is sent, which
    # may precede the delivery that released it; tests/races/test_process_shards.py checks the
    # order from the handlers' own journal.)
    assert [task_id for _, task_id in finished] == [s.task_id for s in steps]
    batch = executor.get_batch("across")
    assert (batch.total, batch.completed, batch.finished_at is not None) == (30, 30, True)
    callbacks = storage.get_many(["cb-done", "cb-ok"])
    assert {t.status for t in callbacks.values()} == {TaskStatus.COMPLETED}
    counts = executor.count_by_status()
    assert counts[TaskStatus.COMPLETED] == 7 + 30 + 2 == sum(counts.values())
    assert storage.deliver_messages(500) == 0


def test_attempt_timeout_over_the_masters_of_three_shards(make_executor, prefixes):
    """REDIS_SHARDS = 3 on 3 masters: tasks with an attempt_timeout on each shard keep it (the
    task hash's field, read by the claim) and are timed out by a worker thread; a chain whose
    first step times out and is retried releases the next one only after it completed."""
    prefix = f"xtimeout-{uuid.uuid4().hex[:10]}"
    prefixes.append(prefix)
    executor = make_executor(prefix, node=2, shards=3)
    queues = ("orphan", "default", "prio")  # shards 0, 1, 2
    for i, queue in enumerate(queues):
        executor.submit(
            "demo.slow",
            {"seconds": 30},
            task_id=f"slow-{i}",
            queue=queue,
            attempt_timeout=0.3,
            retry_limit=0,
        )
    executor.chain(
        [
            TaskSubmitRequest(  # its first attempt times out, its second completes
                "demo.cooperative",
                {"sleep": 30, "sleep_attempts": 1},
                task_id="first",
                queue="orphan",
                attempt_timeout=dt.timedelta(milliseconds=300),
                retry_limit=1,
            ),
            TaskSubmitRequest("demo.echo", 1, task_id="next", queue="prio"),
        ]
    )
    assert [executor.get_task(f"slow-{i}").attempt_timeout for i in range(3)] == [0.3] * 3
    assert executor.get_task("first").attempt_timeout == 0.3
    with running(executor, "xtimeout-worker", queues):
        wait_for(lambda: live_count(executor) == 0, 60, "every task to end")
    for i in range(3):
        slow = executor.get_task(f"slow-{i}")
        assert slow.status is TaskStatus.FAILED, slow
        assert slow.last_error.startswith("attempt timed out after 0.3 s (attempt_timeout): ")
    first, after = executor.get_task("first"), executor.get_task("next")
    assert (first.status, first.attempts) == (TaskStatus.COMPLETED, 2), first
    # (finish times, not started_at: see the test above)
    assert after.status is TaskStatus.COMPLETED and after.finished_at >= first.finished_at


def test_a_limited_name_keeps_one_cap_and_one_rate_over_the_masters_of_three_shards(
    make_executor, prefixes, redis_cluster_nodes: list[RedisServer]
):
    """REDIS_SHARDS = 3 on 3 masters: demo.capped (max_concurrency=2) and demo.rated
    (rate_limit="5/s"), whose own queue "default" is of shard 1, submitted to "orphan" and
    "prio" (shards 0 and 2, two other masters) are stored on shard 1's master; two workers
    serving only those two queues run them all, never more than two capped ones at once nor
    more than five rated starts in a second, by the handlers' own clocks."""
    prefix = f"limits-{uuid.uuid4().hex[:10]}"
    prefixes.append(prefix)
    executor = make_executor(prefix, node=0, shards=3)
    storage = executor.storage
    assert isinstance(storage, RedisStorage)
    queues = ("orphan", "prio")
    assert [storage.layout.shard_of(q) for q in ("default", *queues)] == [1, 0, 2]
    requests = [
        TaskSubmitRequest("demo.capped", {"sleep": 0.15}, queue=queues[i % 2]) for i in range(8)
    ]
    requests += [TaskSubmitRequest("demo.rated", {}, queue=queues[i % 2]) for i in range(15)]
    infos = executor.submit_many(requests)
    home = master_of(redis_cluster_nodes, storage.prefixes[1] + "counts")
    with home.client() as admin:
        assert all(admin.exists(storage.prefixes[1] + "t:" + i.task_id) for i in infos)
    second = make_executor(prefix, node=1, shards=3)
    with running(executor, "limits-1", queues), running(second, "limits-2", queues):
        wait_for(lambda: live_count(executor) == 0, 90, "every limited task to finish")
    done = storage.get_many([i.task_id for i in infos])
    assert {t.status for t in done.values()} == {TaskStatus.COMPLETED}
    capped = [done[i.task_id].result for i in infos[:8]]
    assert peak_overlap([(r["started"], r["ended"]) for r in capped]) <= 2, capped
    rated = [done[i.task_id] for i in infos[8:]]
    starts = [t.result for t in rated]
    # The stored starts span W + margin / 2 per six (test_rate_limits.py); the handlers' own,
    # that less the longest delay from a stored start to its handler's first line.
    written = [t.started_at.timestamp() for t in rated]
    assert most_in_a_window(written, 1.05 - 0.002) <= 5, sorted(written)
    delay = max(0.0, max(s - w for s, w in zip(starts, written, strict=True)))
    assert most_in_a_window(starts, min(1.0, 1.05 - delay - 0.002)) <= 5, (delay, starts)
    assert max(starts) - min(starts) >= 2.0  # 15 starts at 5 a second: one rate, not two


def test_parameter_index_filled_and_searched_over_the_masters_of_three_shards(
    make_executor, prefixes
):
    prefix = f"cluster-pidx-{uuid.uuid4().hex[:8]}"
    prefixes.append(prefix)
    plain = make_executor(prefix, shards=3)
    storage = plain.storage
    for n, queue in enumerate(("default", "alpha", "beta") * 2):
        plain.submit("demo.echo", {"customer_id": n % 2}, task_id=f"p{n}", queue=queue)
    searchable = dataclasses.replace(plain.settings, SEARCHABLE_PARAMETERS=("customer_id",))
    indexed = ReliableExecutor(storage, settings=searchable)
    assert indexed.list_tasks(parameter={"customer_id": 1}) == []  # stored before: no entry
    after, read = None, 0
    while True:  # executor index-parameters: SCAN steps on each shard's master
        step = storage.index_parameters(("customer_id",), after, 2)
        read += step.tasks
        if step.last_task_id is None:
            break
        after = step.last_task_id
    assert read == 6
    found = indexed.list_tasks(parameter={"customer_id": 1})
    assert sorted(t.task_id for t in found) == ["p1", "p3", "p5"]
