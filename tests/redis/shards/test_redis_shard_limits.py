"""max_concurrency, max_concurrency_per_key and rate_limit across Redis shards: a limited name's
tasks, whatever queue they are submitted to, are stored on its home shard (the shard of its own
queue), so its caps and rate hold across every queue; workers of each queue claim them there,
and reading, cancelling, retrying, pausing and schedules find them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.flow_limits import NO_FLOW_LIMITS
from django_reliable_executor.core.rate_limits import RateLimit
from django_reliable_executor.master.schedule_firing import ScheduleFiring
from django_reliable_executor.registry import FLOW_LIMITS
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.sharding import directory_of, shard_of
from tests.conftest import sharded_redis_storage
from tests.support.redis_support import assert_consistent

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

SHARDS = 3
# demo.capped (max_concurrency=2), demo.keyed (max_concurrency_per_key=2) and demo.rated
# (rate_limit="5/s") have the queue "default", of shard 1: their home. "orphan" is of shard 0,
# "prio" of shard 2.
HOME, ORPHAN, PRIO = 1, "orphan", "prio"
CAPS = {"demo.capped": 2}
KEY_CAPS = {"demo.keyed": 2}
RATES = {"demo.rated": RateLimit(5, 1.0)}
LEASE = 30.0


@pytest.fixture
def storage(clock) -> Iterator[RedisStorage]:
    with sharded_redis_storage("shard-limits", SHARDS, clock) as made:
        yield made


def stored_on(storage: RedisStorage, task_id: str) -> list[int]:
    """The shards holding a hash of this task."""
    return [s for s in range(SHARDS) if storage.client.exists(storage._tkey(task_id, s))]


def claim(storage: RedisStorage, worker: str, queues: tuple[str, ...], n: int = 10) -> list:
    return storage.claim(worker, queues, n, LEASE, name_limits=CAPS, rate_limits=RATES)


def test_the_layout_this_file_relies_on():
    assert [shard_of(q, SHARDS) for q in ("default", ORPHAN, PRIO)] == [HOME, 0, 2]


def test_a_limited_name_s_tasks_are_stored_on_its_home_shard(executor, storage):
    capped = [executor.submit("demo.capped", {}, queue=q) for q in (ORPHAN, PRIO, "default")]
    given = executor.submit("demo.capped", {}, queue=PRIO, task_id="given-capped-1")
    plain = executor.submit("demo.echo", 1, queue=ORPHAN)
    for task in capped:
        assert stored_on(storage, task.task_id) == [HOME]
        # A generated id is native to the shard it is stored on: found with one read.
        assert directory_of(task.task_id, SHARDS) == HOME
    assert stored_on(storage, given.task_id) == [HOME]
    assert stored_on(storage, plain.task_id) == [0]  # an unlimited name: its queue's shard
    # Under its queue, on the home shard: listed, counted and read as usual.
    assert [t.queue for t in capped] == [ORPHAN, PRIO, "default"]
    assert executor.get_task(given.task_id).queue == PRIO
    listed = {t.task_id for t in executor.list_tasks(queue=ORPHAN)}
    assert listed == {capped[0].task_id, plain.task_id}
    assert executor.count_by_status(ORPHAN)[TaskStatus.CREATED] == 2
    assert executor.count_by_status(PRIO)[TaskStatus.CREATED] == 2
    assert executor.storage.oldest_due(ORPHAN) is not None
    # Submitting it again by id returns it, whatever queue is named.
    again = executor.submit_many([TaskSubmitRequest("demo.capped", {}, task_id="given-capped-1")])
    assert again[0].queue == PRIO and stored_on(storage, "given-capped-1") == [HOME]


def test_the_cap_holds_across_queues_of_different_shards(executor, storage):
    for queue in (ORPHAN, PRIO):
        for _ in range(3):
            executor.submit("demo.capped", {}, queue=queue)
    first = claim(storage, "w-orphan", (ORPHAN,))
    assert len(first) == 2 and {c.shard for c in first} == {HOME}
    # Before, a worker of "prio" (shard 2) took two more there: the cap was per shard.
    assert claim(storage, "w-prio", (PRIO,)) == []
    started = [storage.start(c, LEASE) for c in first]
    assert all(started)
    assert storage.complete(started[0], "done") is not None
    # One slot free: one task more, taken by the worker of the queue of the name's next
    # task (its parked tasks keep their order across queues, as on one shard).
    (next_one,) = claim(storage, "w-prio", (PRIO,)) + claim(storage, "w-orphan", (ORPHAN,))
    assert next_one.shard == HOME
    # Failure and release go to the shard the claim came from.
    assert storage.fail(storage.start(next_one, LEASE), "boom", retryable=False) is not None
    assert storage.release(claim(storage, "w-orphan", (ORPHAN, PRIO))) == 1
    assert storage.complete(started[1], None) is not None
    # Every task runs in the end, never more than two held at once.
    held_key = storage.prefixes[HOME] + "held"
    while (
        executor.count_by_status()[TaskStatus.CREATED]
        + executor.count_by_status()[TaskStatus.PENDING]
    ):
        held = claim(storage, "w-both", (ORPHAN, PRIO))
        assert 0 < len(held) <= 2
        assert int(storage.client.hget(held_key, "demo.capped")) == len(held)
        for c in held:
            assert storage.complete(storage.start(c, LEASE), None) is not None
    counts = executor.count_by_status()
    assert counts[TaskStatus.COMPLETED] == 5 and counts[TaskStatus.FAILED] == 1


def test_the_cap_per_key_holds_across_queues_of_different_shards(executor, storage, clock):
    by_key: dict[str, list[str]] = {"a": [], "b": []}
    for queue in (ORPHAN, PRIO):
        for key in ("a", "b"):
            for _ in range(2):
                task = executor.submit("demo.keyed", {}, queue=queue, concurrency_key=key)
                by_key[key].append(task.task_id)
                assert stored_on(storage, task.task_id) == [HOME]
                clock.advance(0.001)

    def claim_keyed(worker: str, queues: tuple[str, ...]) -> list:
        claims = storage.claim(worker, queues, 10, LEASE, key_limits=KEY_CAPS)
        assert_consistent(storage)  # every shard's held counts and parked sets by key
        return claims

    first = claim_keyed("w-orphan", (ORPHAN,))
    assert sorted(c.task.concurrency_key for c in first) == ["a", "a", "b", "b"]
    assert {c.shard for c in first} == {HOME}
    # Both keys are full on the home shard, whatever queue (and shard) the worker claims for.
    assert claim_keyed("w-prio", (PRIO,)) == []
    home = storage.prefixes[HOME]
    assert storage.client.hgetall(home + "heldkey:demo.keyed") == {"a": "2", "b": "2"}
    assert storage.client.smembers(home + "kparked") == {"demo.keyed"}
    # A slot of "a" frees: the next task of "a" (of "prio"), and nothing of "b".
    done = next(c for c in first if c.task.concurrency_key == "a")
    assert storage.complete(storage.start(done, LEASE), None) is not None
    again = claim_keyed("w-prio", (PRIO,))
    assert [c.task_id for c in again] == [by_key["a"][2]]
    # Every task runs in the end, never more than two of a key held at once.
    held = [c for c in first if c is not done] + again
    while held:
        for one in held:
            assert storage.complete(storage.start(one, LEASE), None) is not None
        held = claim_keyed("w-both", (ORPHAN, PRIO))
        counts = storage.client.hgetall(home + "heldkey:demo.keyed")
        assert all(1 <= int(n) <= 2 for n in counts.values()), counts
    assert executor.count_by_status()[TaskStatus.COMPLETED] == 8
    assert not storage.client.exists(home + "heldkey:demo.keyed", home + "kparked")


def test_tasks_parked_by_key_are_claimed_once_the_cap_per_key_is_gone(executor, storage):
    ids = [
        executor.submit("demo.keyed", {}, queue=ORPHAN, concurrency_key="a").task_id
        for _ in range(4)
    ]
    first = storage.claim("w-orphan", (ORPHAN,), 10, LEASE, key_limits=KEY_CAPS)
    assert len(first) == 2
    # A worker whose registry has no cap per key any more (removed in a deploy): no freed slot
    # is needed, its claim on the home shard takes the tasks parked by key.
    rest = storage.claim("w-new", (ORPHAN,), 10, LEASE)
    assert sorted(c.task_id for c in first + rest) == sorted(ids)
    assert {c.shard for c in rest} == {HOME}
    assert_consistent(storage)
    assert not storage.client.exists(storage.prefixes[HOME] + "kparked")


def test_the_rate_holds_across_queues_of_different_shards(executor, storage, clock):
    for queue in (ORPHAN, PRIO):
        for _ in range(4):
            executor.submit("demo.rated", {}, queue=queue)
    taken = claim(storage, "w-orphan", (ORPHAN,)) + claim(storage, "w-prio", (PRIO,))
    # 4 of each queue waiting: 5 in the window in all, not 4 + 4 (one log per shard before).
    assert len(taken) == 5
    assert claim(storage, "w-orphan", (ORPHAN,)) + claim(storage, "w-prio", (PRIO,)) == []
    clock.advance(1.5)
    more = claim(storage, "w-orphan", (ORPHAN,)) + claim(storage, "w-prio", (PRIO,))
    assert len(more) == 3


def test_cancel_retry_and_pause_reach_the_home_shard(executor, storage):
    a = executor.submit("demo.capped", {}, queue=ORPHAN)
    b = executor.submit("demo.capped", {}, queue=ORPHAN)
    assert executor.cancel_task(a.task_id)
    assert executor.get_task(a.task_id).status is TaskStatus.CANCELLED
    assert executor.retry_task(a.task_id)
    assert executor.get_task(a.task_id).status is TaskStatus.PENDING
    assert stored_on(storage, a.task_id) == [HOME]
    assert executor.pause_queue(ORPHAN)
    assert executor.storage.paused_queues() == {ORPHAN}
    # Paused on the home shard too: claim.lua there reads its own flag.
    assert claim(storage, "w-orphan", (ORPHAN,)) == []
    assert executor.resume_queue(ORPHAN)
    assert executor.storage.paused_queues() == set()
    assert {c.task_id for c in claim(storage, "w-orphan", (ORPHAN,))} == {a.task_id, b.task_id}


def test_an_idle_worker_of_the_queue_is_woken_by_a_submit_to_the_home_shard(executor, storage):
    assert claim(storage, "w-orphan", (ORPHAN,)) == []
    executor.submit("demo.capped", {}, queue=ORPHAN)
    assert storage.wait_for_work([ORPHAN], 2.0) is True
    assert len(claim(storage, "w-orphan", (ORPHAN,))) == 1


def test_a_schedule_of_a_limited_name_lives_and_fires_on_its_home_shard(executor, storage, clock):
    executor.schedule("capped-orphan", "demo.capped", {}, every=60, queue=ORPHAN)
    key = "s:capped-orphan"
    assert [s for s in range(SHARDS) if storage.client.exists(storage.prefixes[s] + key)] == [HOME]
    clock.advance(61)
    fired = ScheduleFiring(executor).fire_due()[0]
    assert len(fired) == 1 and fired[0].queue == ORPHAN
    assert stored_on(storage, fired[0].task_id) == [HOME]
    assert len(claim(storage, "w-orphan", (ORPHAN,))) == 1
    assert executor.storage.get_schedules(["capped-orphan"])


def test_a_task_stored_by_a_submitter_without_the_limit_is_claimed_on_its_queue_s_shard(
    storage, clock
):
    # A storage not told the name's limit (as an ALLOW_UNKNOWN_TASKS submitter that does not
    # know it) stores it on its queue's shard; a worker of the queue still claims it, under
    # that shard's own accounting.
    unaware = ReliableExecutor(storage, clock=clock)
    storage.flow_limits = NO_FLOW_LIMITS
    task = unaware.submit("demo.capped", {}, queue=ORPHAN)
    assert stored_on(storage, task.task_id) == [0]
    storage.flow_limits = FLOW_LIMITS  # told again: a worker's view
    (claimed,) = claim(storage, "w-orphan", (ORPHAN,))
    assert claimed.task_id == task.task_id and claimed.shard == 0
    assert storage.complete(storage.start(claimed, LEASE), None) is not None


def test_tasks_left_on_a_home_shard_after_the_limit_is_gone_are_still_claimed(
    executor, storage, clock
):
    task = executor.submit("demo.capped", {}, queue=ORPHAN)
    assert stored_on(storage, task.task_id) == [HOME]
    # A worker whose registry has no limited name any more (the limit removed in a deploy):
    # the home shard's queue set names "orphan", so it claims there all the same.
    storage.flow_limits = NO_FLOW_LIMITS
    fresh = RedisStorage(
        storage.client, storage.key_prefix, clock=clock, shards=SHARDS, owns_client=False
    )
    assert fresh._queue_shards(ORPHAN) == [0, HOME]
    (claimed,) = fresh.claim("w-new", (ORPHAN,), 10, LEASE)
    assert claimed.task_id == task.task_id and claimed.shard == HOME
    assert fresh.complete(fresh.start(claimed, LEASE), None) is not None
    assert executor.get_task(task.task_id).status is TaskStatus.COMPLETED
    fresh.close()
