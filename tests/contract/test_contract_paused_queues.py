"""Contract: paused queues on every backend — claims take nothing from a paused queue (from any
storage object at once), other queues flow, submits and schedule fires are accepted and wait,
resume makes them claimable and wakes idle workers; idempotence; names refused."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.exceptions import InvalidQueueError
from django_reliable_executor.master.schedule_firing import ScheduleFiring
from tests.support.contract_support import LEASE, claim_and_start


def claimed_ids(storage, queues, limit=100):
    return sorted(claim.task_id for claim in storage.claim("w1", queues, limit, LEASE))


def test_a_paused_queue_gives_no_claims_while_others_flow(executor, storage):
    executor.submit("demo.echo", None, task_id="m1", queue="mail", priority=9)
    executor.submit("demo.echo", None, task_id="r1", queue="reports")
    assert executor.pause_queue("mail") is True
    # Submits are still accepted into the paused queue.
    executor.submit("demo.echo", None, task_id="m2", queue="mail", priority=9)
    assert executor.paused_queues() == {"mail"}
    assert claimed_ids(storage, ["mail", "reports"]) == ["r1"]
    assert claimed_ids(storage, ["mail"]) == []
    assert {t.status for t in executor.list_tasks(queue="mail")} == {TaskStatus.CREATED}
    assert executor.resume_queue("mail") is True
    assert executor.paused_queues() == set()
    assert claimed_ids(storage, ["mail", "reports"]) == ["m1", "m2"]


def test_a_pause_holds_at_once_for_every_storage_object(executor, make_storage, clock):
    """Another worker's storage (another connection or client) sees the pause in its very next
    claim: no cache, no POLL_INTERVAL wait (Redis: claim.lua reads the set)."""
    other = make_storage(clock)
    other.claim("w2", ["mail"], 1, LEASE)  # a worker that has claimed before the pause
    executor.submit("demo.echo", None, task_id="m1", queue="mail")
    executor.pause_queue("mail")
    assert other.claim("w2", ["mail"], 10, LEASE) == []
    assert other.paused_queues() == {"mail"}
    executor.resume_queue("mail")
    assert [c.task_id for c in other.claim("w2", ["mail"], 10, LEASE)] == ["m1"]


def test_a_capped_name_is_paused_with_its_queue(executor, storage):
    """max_concurrency's own claim path (a lock per capped name) leaves paused queues out too,
    and a parked task of a paused queue (Redis) waits for the resume."""
    # A name the registry caps (max_concurrency=1): sharded Redis stores all its tasks on the
    # name's home shard, so one cap holds over "mail" and "default" whatever their shards. A
    # cap given to claim() for a name the registry does not limit is kept per shard there
    # (docs/redis-shards.md, "What is not exact"), which is not what this test is about.
    name = "demo.outlive_capped"
    for task_id, queue in (("m1", "mail"), ("m2", "mail"), ("d1", "default")):
        executor.submit(name, None, task_id=task_id, queue=queue)
    executor.pause_queue("mail")
    caps = {name: 1}
    first = storage.claim("w1", ["mail", "default"], 10, LEASE, name_limits=caps)
    assert [c.task_id for c in first] == ["d1"]
    assert storage.claim("w1", ["mail", "default"], 10, LEASE, name_limits=caps) == []
    executor.resume_queue("mail")
    assert storage.claim("w1", ["mail", "default"], 10, LEASE, name_limits=caps) == []  # at cap
    storage.release(first)
    executor.cancel_task("d1")
    taken = storage.claim("w1", ["mail", "default"], 10, LEASE, name_limits=caps)
    assert [c.task_id for c in taken] == ["m1"]


def test_running_tasks_of_a_paused_queue_finish(executor, storage):
    executor.submit("demo.echo", None, task_id="m1", queue="mail")
    claim = claim_and_start(storage, queue="mail")
    executor.pause_queue("mail")
    assert storage.complete(claim, "done") is not None
    assert executor.get_task("m1").status is TaskStatus.COMPLETED


def test_delayed_and_retried_tasks_wait_while_paused(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="later", queue="mail", delay_millis=5_000)
    executor.pause_queue("mail")
    clock.advance(10)
    storage.promote_due(100)
    assert claimed_ids(storage, ["mail"]) == []
    executor.resume_queue("mail")
    assert claimed_ids(storage, ["mail"]) == ["later"]


def test_schedules_still_fire_into_a_paused_queue(executor, storage, clock):
    executor.schedule("tick", "demo.echo", every=60, queue="mail")
    executor.pause_queue("mail")
    clock.advance(61)
    ScheduleFiring(executor).run_once()
    fired = [t for t in executor.list_tasks(queue="mail") if t.task_id.startswith("tick@")]
    assert len(fired) == 1 and fired[0].status is TaskStatus.CREATED
    assert claimed_ids(storage, ["mail"]) == []
    executor.resume_queue("mail")
    assert claimed_ids(storage, ["mail"]) == [fired[0].task_id]


def test_pause_and_resume_are_idempotent(executor, storage):
    executor.submit("demo.echo", None, task_id="m1", queue="mail")
    assert executor.pause_queue("mail") is True
    assert executor.pause_queue("mail") is False
    assert executor.paused_queues() == {"mail"}
    assert executor.resume_queue("mail") is True
    assert executor.resume_queue("mail") is False
    assert executor.resume_queue("default") is False  # known, never paused: no error
    assert executor.paused_queues() == set()
    assert claimed_ids(storage, ["mail"]) == ["m1"]


def test_a_pause_outlives_the_queues_tasks(executor, storage):
    """Paused with no task left (purged): still paused, and still known to resume it."""
    executor.submit("demo.echo", None, task_id="m1", queue="mail")
    executor.pause_queue("mail")
    executor.cancel_task("m1")
    assert executor.purge_finished(executor.clock.now().replace(year=2100)) == 1
    assert executor.count_by_queue() == {}
    assert executor.paused_queues() == {"mail"}
    executor.submit("demo.echo", None, task_id="m2", queue="mail")
    assert claimed_ids(storage, ["mail"]) == []
    assert executor.resume_queue("mail") is True


@pytest.mark.parametrize("name", ["", "two words", "a,b", "x" * 101, None, 7, "tab\there"])
def test_a_name_breaking_the_queue_rule_is_refused_naming_it(executor, name):
    for operation in (executor.pause_queue, executor.resume_queue):
        with pytest.raises(InvalidQueueError, match="queue must be 1..100 characters") as info:
            operation(name)
        assert info.value.field == "queue"
    assert executor.paused_queues() == set()


def test_an_unknown_queue_is_refused_naming_it(executor):
    with pytest.raises(InvalidQueueError, match="unknown queue 'mial'"):
        executor.pause_queue("mial")
    with pytest.raises(InvalidQueueError, match="unknown queue 'mial'"):
        executor.resume_queue("mial")
    assert executor.paused_queues() == set()


def test_known_queues_are_those_of_tasks_workers_handlers_and_default(executor, storage):
    executor.submit("demo.echo", None, task_id="t1", queue="stored")
    storage.worker_seen("w1", {"hostname": "h", "pid": 1, "queues": ["served"]})
    handler_queue = "contract-handler-queue"
    from django_reliable_executor.registry import TaskHandler, register, unregister

    register(TaskHandler(lambda p: p, name="contract.queued", queue=handler_queue))
    try:
        for queue in ("stored", "served", handler_queue, "default"):
            assert executor.pause_queue(queue) is True
    finally:
        unregister("contract.queued")
    assert executor.paused_queues() == {"stored", "served", handler_queue, "default"}


def test_queue_names_are_exact(executor, storage):
    """Case matters, as in task queues (MariaDB's paused table compares bytes too)."""
    executor.submit("demo.echo", None, task_id="lower", queue="mail")
    executor.submit("demo.echo", None, task_id="upper", queue="Mail")
    executor.pause_queue("Mail")
    assert executor.paused_queues() == {"Mail"}
    assert claimed_ids(storage, ["mail", "Mail"]) == ["lower"]
    executor.pause_queue("mail")
    assert executor.paused_queues() == {"Mail", "mail"}


def test_resume_wakes_an_idle_worker(executor, storage):
    """A worker blocked in wait_for_work on the queue returns when it is resumed, as after a
    submit (Redis: a wake token; PostgreSQL: a NOTIFY; SQLite: the marker file; MariaDB: the
    waiters of this process, other processes' idle workers poll)."""
    executor.submit("demo.echo", None, task_id="m1", queue="mail")
    executor.pause_queue("mail")
    assert storage.claim("w1", ["mail"], 10, LEASE) == []
    # Settle the waiter (the first wait of SQLite and PostgreSQL returns at once; on Redis it
    # takes the submit's token), so that only the resume can end the next one early.
    storage.wait_for_work(["mail"], 0.01)
    storage.wait_for_work(["mail"], 0.01)
    executor.resume_queue("mail")
    try:
        woken = storage.wait_for_work(["mail"], 20)
        claimed = claimed_ids(storage, ["mail"])
        if not claimed and getattr(storage, "sharded", False):
            # Sharded Redis: the resume wakes every shard, and the wait returns at the first
            # token; the pop that takes the token of m1's shard may end a moment later, and
            # that shard counts as quiet for this claim. The worker's next wait returns at
            # once with that token (it is kept, never lost), and its claim finds m1.
            woken = storage.wait_for_work(["mail"], 20) and woken
            claimed = claimed_ids(storage, ["mail"])
    finally:
        storage.stop_waiting()
    assert woken is True
    assert claimed == ["m1"]
