"""Redis forgets a queue once it holds nothing: purge of its last task (and the master's sweep of
names left behind) drops it from the queue set, the counts hash and its per-queue keys, never a
queue that still holds a task, and never in a way a submit racing it can lose."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.master.chores import MasterChores
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from tests.redis.scripts.conftest import redis_storage
from tests.support.redis_support import (
    LEASE,
    WORKER_A,
    assert_consistent,
    call,
    claim_one,
    index_problems,
    snapshot,
    submit,
    unchanged,
)

NAMES = 500


def queue_set(storage: RedisStorage) -> set[str]:
    return set(storage.client.smembers(storage.p + "queues"))


def keys_naming(storage: RedisStorage, queues: set[str]) -> list[str]:
    """Keys of the prefix, and fields of the counts hash, that name one of these queues."""
    snap = snapshot(storage)
    found = [key for key in snap if key.partition(":")[2].rpartition(":")[0] in queues]
    found += [key for key in snap if key.partition(":")[2] in queues]
    counts = snap.get("counts", ("hash", {}))[1]
    found += [f"counts {field}" for field in counts if field.partition(":")[2] in queues]
    return found


def drained(storage: RedisStorage, queues: list[str]) -> None:
    """Every task of these queues claimed, started and completed."""
    claims = storage.claim(WORKER_A, queues, len(queues) * 2, LEASE)
    started = storage.start_many(claims, LEASE)
    assert all(started)
    done = storage.complete_many([(claim, "ok") for claim in started if claim])
    assert all(done)


# -- names forgotten ---------------------------------------------------------------------------
def test_queues_whose_tasks_were_purged_are_forgotten(storage, executor, clock):
    names = [f"q-{i:03d}" for i in range(NAMES)]
    executor.submit_many(
        [
            TaskSubmitRequest("demo.echo", {"i": i}, task_id=f"t{i}", queue=q)
            for i, q in enumerate(names)
        ]
    )
    executor.submit("demo.echo", {}, task_id="kept", queue="busy")  # still waiting: stays
    assert queue_set(storage) == {*names, "busy"}
    drained(storage, names)
    assert queue_set(storage) == {*names, "busy"}  # finished, not purged yet: still listed
    clock.advance(10)

    # The master's own rounds purge (retention 1 s); a full batch asks for another round.
    chores = MasterChores(executor, retention_seconds=1)
    rounds = 0
    while chores.run_once():
        rounds += 1
        assert rounds < 10
    assert executor.count_by_status()[TaskStatus.COMPLETED] == 0
    assert queue_set(storage) == {"busy"}
    assert keys_naming(storage, set(names)) == []
    assert set(storage.count_by_queue()) == {"busy"}
    assert_consistent(storage)
    # What a round walks is the queue set: the next submit to a forgotten name adds it again.
    executor.submit("demo.echo", {}, task_id="again", queue=names[7])
    assert queue_set(storage) == {"busy", names[7]}
    assert claim_one(storage, queue=names[7]).task_id == "again"
    assert_consistent(storage)


def test_the_sweep_forgets_names_left_behind_and_keeps_the_others(storage, executor, clock):
    """Names an older version left in the set (zero count fields, a wake token) go a bounded
    step per purge round; a queue holding a task stays."""
    leaked = {f"old-{i:03d}" for i in range(NAMES)}
    pipe = storage.client.pipeline(transaction=False)
    for queue in leaked:
        pipe.sadd(storage.p + "queues", queue)
        pipe.hset(storage.p + "counts", mapping={f"CREATED:{queue}": 0, f"COMPLETED:{queue}": 0})
        pipe.lpush(storage.p + "wake:" + queue, "1")
    pipe.execute()
    submit(executor, "waiting", queue="old-042")
    assert "queues set lists old-001, which holds no task" in index_problems(storage)

    for _ in range(20):  # SSCAN steps of QUEUE_SWEEP names: a few rounds cover 500
        storage.purge_finished(clock.now(), 100)
    assert queue_set(storage) == {"old-042"}
    assert keys_naming(storage, leaked - {"old-042"}) == []
    assert_consistent(storage)


# -- queues kept ---------------------------------------------------------------------------------
def into_state(storage, executor, clock, state: str, queue: str) -> None:
    """One task "x" of ``queue`` in the given unfinished state."""
    if state == "ready":
        submit(executor, "x", queue=queue)
    elif state == "delayed":
        submit(executor, "x", queue=queue, delay_millis=3_600_000)
    elif state == "pending after a failure":
        submit(executor, "x", queue=queue, retry_interval=3_600_000)
        claim = storage.start(claim_one(storage, queue=queue), LEASE)
        assert storage.fail(claim, "boom", retryable=True).task.status is TaskStatus.PENDING
    elif state == "claimed":
        submit(executor, "x", queue=queue)
        claim_one(storage, queue=queue)
    elif state == "running":
        submit(executor, "x", queue=queue)
        assert storage.start(claim_one(storage, queue=queue), LEASE)
    elif state == "parked":
        submit(executor, "x", queue=queue)
        assert storage.claim(WORKER_A, [queue], 1, LEASE, name_limits={"demo.echo": 0}) == []
        assert storage.client.exists(storage.p + "parked:demo.echo:0")
    else:
        raise AssertionError(state)


STATES = [
    "ready",
    "delayed",
    "pending after a failure",
    "claimed",
    "running",
    "parked",
    "finished after the cutoff",
]


@pytest.mark.parametrize("state", STATES)
def test_a_queue_holding_a_task_in_any_state_is_kept(storage, executor, clock, state):
    submit(executor, "old", queue="q")
    drained(storage, ["q"])
    clock.advance(10)
    cutoff = clock.now()
    clock.advance(10)
    if state == "finished after the cutoff":
        submit(executor, "x", queue="q")
        drained(storage, ["q"])
    else:
        into_state(storage, executor, clock, state, "q")

    assert storage.purge_finished(cutoff, 100) == 1  # the old task's deletion keeps q
    assert "q" in queue_set(storage)
    assert storage.get("x") is not None
    assert_consistent(storage)
    with unchanged(storage):
        assert call(storage, "forget_queues", "q") == 0


# -- races with submits ----------------------------------------------------------------------------
def test_a_submit_after_the_forgetting_adds_the_queue_again(storage, executor, clock):
    submit(executor, "old", queue="q")
    drained(storage, ["q"])
    clock.advance(10)
    assert storage.purge_finished(clock.now(), 100) == 1
    assert queue_set(storage) == set()
    submit(executor, "delayed", queue="q", delay_millis=1000)
    assert queue_set(storage) == {"q"}
    clock.advance(2)
    assert storage.promote_due(100) == 1  # the master's promote walks the queue again
    assert claim_one(storage, queue="q").task_id == "delayed"
    assert_consistent(storage)


def test_the_forgetting_of_a_name_a_submit_took_meanwhile_keeps_it(storage, executor):
    """The sweep read a name as empty, then a submit came: the script checks again."""
    storage.client.sadd(storage.p + "queues", "q")
    submit(executor, "new", queue="q")
    with unchanged(storage):
        assert call(storage, "forget_queues", "q") == 0


def test_submits_racing_the_forgetting_are_never_lost(key_prefix, clock):
    """One client keeps emptying queues (cancel, purge, sweep: each purge forgets the queue)
    while another submits into the same queues, ready and delayed: every submitted task stays
    reachable (its queue listed, claimable, its delayed tasks promoted) and the indexes hold."""
    queues = [f"q{i}" for i in range(5)]
    rounds = 400
    errors: list[BaseException] = []

    def churn() -> None:
        storage = redis_storage(key_prefix, clock)
        executor = ReliableExecutor(storage, clock=clock)
        try:
            for i in range(rounds):
                task_id = f"churn-{i}"
                submit(executor, task_id, queue=queues[i % len(queues)])
                assert executor.cancel_task(task_id)
                storage.purge_finished(clock.now() + dt.timedelta(seconds=1), 100)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            storage.close()

    def submitter() -> None:
        storage = redis_storage(key_prefix, clock)
        executor = ReliableExecutor(storage, clock=clock)
        try:
            for i in range(rounds):
                delay = 60_000 if i % 2 else 0
                submit(executor, f"keep-{i}", queue=queues[i % len(queues)], delay_millis=delay)
        except BaseException as exc:
            errors.append(exc)
        finally:
            storage.close()

    threads = [threading.Thread(target=churn), threading.Thread(target=submitter)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors

    storage = redis_storage(key_prefix, clock)
    try:
        assert_consistent(storage)
        clock.advance(120)  # the delayed half is due: the master's promote must find it
        storage.promote_due(10_000)
        claimed = storage.claim(WORKER_A, queues, rounds * 2, LEASE)
        assert sorted(c.task_id for c in claimed) == sorted(f"keep-{i}" for i in range(rounds))
        assert_consistent(storage)
    finally:
        storage.close()
