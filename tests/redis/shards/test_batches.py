"""Batches across shards: members of any shard counted exactly on shard 0 (batch_join.lua and
their endings' messages), callbacks stored once on their own queues' shards."""

from __future__ import annotations

import pytest

from django_reliable_executor.storage.redis import RedisStorage

from .conftest import LEASE, S0, S0B, S1, S2, complete, due, fail, outbox_lengths, step

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


def test_a_batch_over_three_shards_counts_exactly_and_calls_back_once(executor, storage):
    members = [step(f"m{i}", (S0, S1, S2, S0B)[i % 4]) for i in range(12)]
    info = executor.submit_batch(
        members,
        batch_id="fan",
        on_complete=step("done", S2),
        on_success=step("ok", S1),
    )
    assert (info.total, info.pending, info.sealed) == (12, 12, True)
    listed = executor.list_tasks(batch_id="fan", limit=50)
    assert sorted(t.task_id for t in listed) == sorted(m.task_id for m in members)
    by_queue: dict[str, list[str]] = {}
    for member in members:
        by_queue.setdefault(member.queue, []).append(member.task_id)
    for queue in (S2, S1, S0, S0B):
        claims = storage.claim("w1", [queue], 10, LEASE)
        assert sorted(c.task_id for c in claims) == sorted(by_queue[queue])
        storage.complete_many([(storage.start(c, LEASE), None) for c in claims])
        assert executor.get_batch("fan").completed == sum(
            len(by_queue[q]) for q in (S2, S1, S0, S0B)[: (S2, S1, S0, S0B).index(queue) + 1]
        )
    batch = executor.get_batch("fan")
    assert (batch.total, batch.completed, batch.failed, batch.cancelled) == (12, 12, 0, 0)
    assert batch.finished_at is not None
    assert due(executor, "done")  # on shard 2
    assert due(executor, "ok")  # on shard 1
    assert storage.get("done").batch_id == "fan"
    # Delivered again (as after a crash before the removal): nothing changes.
    assert storage.deliver_messages(500) == 0
    assert storage.claim("w1", [S2], 10, LEASE)[0].task_id == "done"
    assert [c.task_id for c in storage.claim("w1", [S1], 10, LEASE)] == ["ok"]


def test_a_failed_member_of_another_shard_counts_and_a_retry_reopens_it(executor, storage):
    executor.submit_batch([step("a", S1), step("b", S2)], batch_id="r", on_success=step("won", S0B))
    complete(storage, S1, "a")
    fail(storage, S2, "b")
    batch = executor.get_batch("r")
    assert (batch.completed, batch.failed, batch.finished_at is not None) == (1, 1, True)
    assert executor.get_task("won") is None  # not every member completed
    assert executor.retry_task("b")
    batch = executor.get_batch("r")
    assert (batch.completed, batch.failed) == (1, 0)
    complete(storage, S2, "b")
    batch = executor.get_batch("r")
    assert (batch.completed, batch.failed) == (2, 0)
    assert executor.get_task("won") is None  # a finished batch stays finished: no callback


def test_a_member_ending_before_its_join_is_counted_once(executor, storage, monkeypatch):
    """A member of another shard is counted by batch_join after it is stored; one that ends
    (and is delivered) before that is counted by its message, and the join then adds none."""
    run = storage._run
    calls: list[str] = []

    def end_first(name, *args, **kwargs):
        if name == "batch_join" and not calls:
            calls.append(name)
            complete(storage, S1, "early")
        return run(name, *args, **kwargs)

    monkeypatch.setattr(storage, "_run", end_first)
    info = executor.submit_batch([step("early", S1), step("late", S2)], batch_id="j")
    assert calls == ["batch_join"]
    assert (info.total, info.completed) == (2, 1)
    complete(storage, S2, "late")
    batch = executor.get_batch("j")
    assert (batch.total, batch.completed, batch.finished_at is not None) == (2, 2, True)


def test_a_dependent_member_cancelled_on_its_shard_counts_in_the_batch(executor, storage):
    executor.submit("demo.echo", {}, task_id="gate", queue=S0)
    executor.submit_batch(
        [step("m", S2, depends_on=["gate"])], batch_id="d", on_complete=step("cb", S1)
    )
    fail(storage, S0, "gate")
    batch = executor.get_batch("d")
    assert (batch.cancelled, batch.finished_at is not None) == (1, True)
    assert due(executor, "cb")


def test_purging_members_of_other_shards_empties_their_batchs_index(executor, storage, clock):
    executor.submit_batch([step("p1", S1), step("p2", S2), step("p0", S0)], batch_id="gone")
    for queue, task_id in ((S1, "p1"), (S2, "p2"), (S0, "p0")):
        complete(storage, queue, task_id)
    clock.advance(3600)
    assert storage.purge_finished(clock.now(), 100) == 3
    assert not [k for k in keys_of_batch(storage, "gone") if ":bm:" in k]
    assert storage.purge_batches(clock.now(), 100) == 1
    assert keys_of_batch(storage, "gone") == set()


def keys_of_batch(storage: RedisStorage, batch_id: str) -> set[str]:
    pattern = "{" + storage.key_prefix + ":shard-*"
    return {
        key
        for key in storage.client.scan_iter(match=pattern, count=1000)
        if key.endswith(":" + batch_id) or f":{batch_id}:" in key
    }


def test_a_member_cancelled_at_its_submit_counts_in_its_batch_of_another_shard(executor, storage):
    executor.submit("demo.echo", {}, task_id="gone-wrong", queue=S0)
    fail(storage, S0, "gone-wrong")
    info = executor.submit_batch(
        [step("doomed", S2, depends_on=["gone-wrong"]), step("fine", S1)],
        batch_id="c",
        on_complete=step("cb", S1),
    )
    assert (info.total, info.cancelled) == (2, 1)
    assert outbox_lengths(storage) == [0, 0, 0]
    complete(storage, S1, "fine")
    batch = executor.get_batch("c")
    assert (batch.completed, batch.cancelled, batch.finished_at is not None) == (1, 1, True)


def test_a_member_of_another_shard_from_a_purged_batch_never_counts_in_its_id_used_again(
    executor, storage, clock
):
    """A batch id used again after its purge: an old member of shard 1, retried by hand and
    ending again, sends its messages to shard 0 carrying its batch's generation, so neither its
    retry nor its ending moves the new batch's counters (nor joins its total)."""
    executor.submit_batch([step("old", S1)], batch_id="again")
    fail(storage, S1, "old")
    assert executor.get_batch("again").finished_at is not None
    clock.advance(10)
    assert storage.purge_batches(clock.now(), 10) == 1
    executor.submit_batch([step("new", S2)], batch_id="again", on_complete=step("done", S0B))
    assert executor.retry_task("old")
    complete(storage, S1, "old")
    batch = executor.get_batch("again")
    assert (batch.total, batch.completed, batch.failed, batch.pending) == (1, 0, 0, 1)
    assert executor.get_task("done") is None
    complete(storage, S2, "new")
    batch = executor.get_batch("again")
    assert (batch.total, batch.completed, batch.pending) == (1, 1, 0)
    assert due(executor, "done")
