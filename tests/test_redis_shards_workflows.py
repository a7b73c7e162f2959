"""Dependencies and batches across the shards of a sharded Redis storage (REDIS_SHARDS > 1), on
the shared Redis: an ending on one shard reaches its dependents and batch on others through the
shard's outbox (lua/_common.lua, storage/redis/outbox.py), at least once and applied once, also
when the process delivering it is killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator

import pytest

from django_reliable_executor import InvalidDependencyError, TaskStatus, TaskSubmitRequest
from django_reliable_executor.clock import FakeClock
from django_reliable_executor.dependencies import WAITING_RUN_AT
from django_reliable_executor.records import Claim
from django_reliable_executor.service import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from tests.conftest import REDIS_URL, delete_prefix, redis_client, require
from tests.redis_support import index_problems

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

SHARDS = 3
LEASE = 30.0
# One queue of each shard (pinned in test_redis_shards.py: the hash is part of the layout),
# and a second queue of shard 0.
S0, S1, S2, S0B = "orphan", "default", "prio", "emails"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def storage(clock) -> Iterator[RedisStorage]:
    require("redis")
    client = redis_client()
    prefix = f"xshards-{zlib.crc32(str(id(client)).encode()):08x}"
    made = RedisStorage(client, prefix, clock=clock, shards=SHARDS)
    try:
        yield made
        assert index_problems(made) == []
    finally:
        made.close()
        cleaner = redis_client()
        delete_prefix(cleaner, prefix)
        for shard in range(SHARDS):  # the shards' tags are not "{prefix}"
            keys = list(cleaner.scan_iter(match=_pattern(made, shard), count=1000))
            if keys:
                cleaner.delete(*keys)
        cleaner.close()


def _pattern(storage: RedisStorage, shard: int) -> str:
    return storage.prefixes[shard].replace("{", "\\{").replace("}", "\\}") + "*"


@pytest.fixture
def executor(storage: RedisStorage, clock) -> ReliableExecutor:
    return ReliableExecutor(storage, clock=clock)


def claim(storage: RedisStorage, queue: str, task_id: str) -> Claim:
    """Claim and start exactly ``task_id`` (the only due task of ``queue``)."""
    claims = storage.claim("w1", [queue], 10, LEASE)
    assert [c.task_id for c in claims] == [task_id]
    started = storage.start(claims[0], LEASE)
    assert started is not None
    return started


def complete(storage: RedisStorage, queue: str, task_id: str) -> None:
    assert storage.complete(claim(storage, queue, task_id), {"id": task_id}) is not None


def fail(storage: RedisStorage, queue: str, task_id: str) -> None:
    assert storage.fail(claim(storage, queue, task_id), "boom", retryable=False) is not None


def status(executor: ReliableExecutor, task_id: str) -> TaskStatus:
    return executor.get_task(task_id).status


def outbox_lengths(storage: RedisStorage) -> list[int]:
    return [storage.client.llen(prefix + "outbox") for prefix in storage.prefixes]


def due(executor: ReliableExecutor, task_id: str) -> bool:
    """Whether ``task_id`` waits for nothing but a claim (a dependent released, a new task)."""
    task = executor.get_task(task_id)
    return (
        task.status in (TaskStatus.CREATED, TaskStatus.PENDING)
        and task.waiting_for == ()
        and task.run_at != WAITING_RUN_AT
    )


def step(task_id: str, queue: str, **options) -> TaskSubmitRequest:
    return TaskSubmitRequest("demo.echo", {"id": task_id}, task_id=task_id, queue=queue, **options)


# -- dependencies ------------------------------------------------------------------------------
def test_a_chain_over_three_shards_runs_one_step_after_another(executor, storage):
    executor.chain([step("a", S0), step("b", S1), step("c", S2), step("d", S0B)])
    assert [due(executor, i) for i in "abcd"] == [True, False, False, False]
    assert executor.dependents_of("a") == ["b"]  # kept on a's shard as "<shard> <id>"
    assert storage.claim("w1", [S1, S2, S0B], 10, LEASE) == []  # none of them due
    for done, queue, following in (("a", S0, "b"), ("b", S1, "c"), ("c", S2, "d")):
        complete(storage, queue, done)
        assert status(executor, done) is TaskStatus.COMPLETED
        # Delivered by the ending call itself: the next step is due at once.
        assert due(executor, following)
        assert executor.get_task(following).waiting_for == ()
        assert outbox_lengths(storage) == [0, 0, 0]
    complete(storage, S0B, "d")
    assert status(executor, "d") is TaskStatus.COMPLETED


def test_a_dependent_waits_for_every_shard_of_its_dependencies(executor, storage):
    for task_id, queue in (("x0", S0), ("x1", S1), ("x2", S2)):
        executor.submit("demo.echo", {}, task_id=task_id, queue=queue)
    fan_in = executor.submit("demo.echo", {}, task_id="in", queue=S1, depends_on=["x0", "x1", "x2"])
    assert fan_in.waiting_for == ("x0", "x1", "x2")
    complete(storage, S2, "x2")
    complete(storage, S0, "x0")
    assert executor.get_task("in").waiting_for == ("x1",)
    assert status(executor, "in") is TaskStatus.CREATED
    complete(storage, S1, "x1")
    assert due(executor, "in")


def test_a_failed_dependency_cancels_across_shards_and_the_cancel_cascades(executor, storage):
    executor.submit("demo.echo", {}, task_id="root", queue=S0)
    executor.submit("demo.echo", {}, task_id="mid", queue=S1, depends_on=["root"])
    executor.submit("demo.echo", {}, task_id="leaf", queue=S2, depends_on=["mid"])
    executor.submit("demo.echo", {}, task_id="back", queue=S0B, depends_on=["leaf"])
    fail(storage, S0, "root")
    assert status(executor, "root") is TaskStatus.FAILED
    mid = executor.get_task("mid")
    assert mid.status is TaskStatus.CANCELLED
    assert mid.last_error == "dependency root ended FAILED: cancelled"
    assert executor.get_task("leaf").last_error == "dependency mid ended CANCELLED: cancelled"
    assert status(executor, "back") is TaskStatus.CANCELLED  # back on shard 0: 3 hops
    assert outbox_lengths(storage) == [0, 0, 0]


def test_on_dependency_failure_run_releases_across_shards(executor, storage):
    executor.submit("demo.echo", {}, task_id="root", queue=S2)
    executor.submit(
        "demo.echo", {}, task_id="runs", queue=S0, depends_on=["root"], on_dependency_failure="run"
    )
    executor.submit("demo.echo", {}, task_id="cancelled", queue=S1, depends_on=["root"])
    fail(storage, S2, "root")
    assert due(executor, "runs")
    assert status(executor, "cancelled") is TaskStatus.CANCELLED
    complete(storage, S0, "runs")


def test_a_dependency_that_ended_before_the_submit_settles_it_at_once(executor, storage):
    executor.submit("demo.echo", {}, task_id="ok", queue=S1)
    executor.submit("demo.echo", {}, task_id="ko", queue=S2)
    complete(storage, S1, "ok")
    fail(storage, S2, "ko")
    assert status(executor, "ok") is TaskStatus.COMPLETED
    released = executor.submit("demo.echo", {}, task_id="r", queue=S0, depends_on=["ok"])
    assert released.waiting_for == () and due(executor, "r")
    cancelled = executor.submit("demo.echo", {}, task_id="c", queue=S0, depends_on=["ok", "ko"])
    assert cancelled.status is TaskStatus.CANCELLED
    assert cancelled.last_error == "dependency ko ended FAILED: cancelled"
    assert executor.dependents_of("ok") == []  # an ended dependency registers nothing


@pytest.mark.parametrize("outcome", ["complete", "fail"])
def test_a_dependency_ending_between_the_edge_and_the_store_is_not_lost(
    executor, storage, monkeypatch, outcome
):
    """The submit registers the edge on the dependency's shard, then stores the dependent on
    its own: an ending (and its delivery) in between is kept for the dependent (xdone)."""
    executor.submit("demo.echo", {}, task_id="dep", queue=S2)
    link = storage._link_remote

    def link_then_end(chunk, shard):
        remote = link(chunk, shard)
        assert remote == {"late": {"dep": ""}}  # live when linked
        (complete if outcome == "complete" else fail)(storage, S2, "dep")
        assert storage.client.hget(storage.prefixes[1] + "xdone:late", "dep").endswith(
            "COMPLETED" if outcome == "complete" else "FAILED"
        )
        return remote

    monkeypatch.setattr(storage, "_link_remote", link_then_end)
    late = executor.submit("demo.echo", {}, task_id="late", queue=S1, depends_on=["dep"])
    if outcome == "complete":
        assert late.waiting_for == () and due(executor, "late")
    else:
        assert late.status is TaskStatus.CANCELLED
        assert late.last_error == "dependency dep ended FAILED: cancelled"
    assert not storage.client.exists(storage.prefixes[1] + "xdone:late")


def test_a_dependency_in_the_same_call_on_another_shard_is_stored_first(executor, storage):
    infos = executor.submit_many(
        [step("first", S2), step("second", S0, depends_on=["first"]), step("third", S2)]
    )
    assert [i.waiting_for for i in infos] == [(), ("first",), ()]
    complete_both = storage.claim("w1", [S2], 10, LEASE)
    assert sorted(c.task_id for c in complete_both) == ["first", "third"]
    storage.complete_many([(storage.start(c, LEASE), None) for c in complete_both])
    assert due(executor, "second")


def test_messages_left_by_a_writer_are_delivered_by_the_masters_chore(executor, storage):
    executor.submit("demo.echo", {}, task_id="a", queue=S0)
    executor.submit("demo.echo", {}, task_id="b", queue=S1, depends_on=["a"])
    started = claim(storage, S0, "a")
    # The ending script alone, as a writer killed before its own delivery left it.
    storage._scripts.run(
        "complete",
        storage._routes[0],
        (storage.p, str(int(storage.clock.now().timestamp() * 1e6)), "n1", "a", started.token, "1"),
    )
    assert outbox_lengths(storage) == [1, 0, 0]
    assert status(executor, "b") is TaskStatus.CREATED
    assert storage.deliver_messages(500) == 1
    assert due(executor, "b")
    assert storage.deliver_messages(500) == 0


def test_one_shard_writes_no_outbox(clock):
    require("redis")
    client = redis_client()
    prefix = f"xshards1-{zlib.crc32(str(id(client)).encode()):08x}"
    one = RedisStorage(client, prefix, clock=clock)
    try:
        executor = ReliableExecutor(one, clock=clock)
        executor.submit("demo.echo", {}, task_id="a", queue=S0)
        executor.submit("demo.echo", {}, task_id="b", queue=S1, depends_on=["a"])
        executor.submit_batch([step("m", S2)], batch_id="b1")
        for queue, task_id in ((S0, "a"), (S1, "b"), (S2, "m")):
            complete(one, queue, task_id)
        assert one.deliver_messages(500) == 0
        keys = set(client.scan_iter(match="{" + prefix + "}:*", count=1000))
        assert not {k for k in keys if "outbox" in k or ":bx:" in k or ":xdone:" in k}
        assert executor.get_batch("b1").finished_at is not None
    finally:
        one.close()
        delete_prefix(client, prefix)
        client.close()


# -- batches -----------------------------------------------------------------------------------
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


# -- a delivering process killed ----------------------------------------------------------------
CHILD = """
import os, signal, sys, datetime as dt
import redis
from django_reliable_executor.clock import FakeClock
from django_reliable_executor.dependencies import WAITING_RUN_AT
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis import access

url, prefix, shards, now, phase, queue = sys.argv[1:7]
clock = FakeClock(dt.datetime.fromisoformat(now))
storage = RedisStorage(redis.Redis.from_url(url, decode_responses=True), prefix, clock=clock,
                       shards=int(shards))

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if phase == "end":
    # Killed right after the ending script, before the delivery that follows it.
    access.RedisAccess._deliver_now = die
    claims = storage.claim("child", [queue], 100, 30.0)
    storage.complete_many([(storage.start(c, 30.0), None) for c in claims])
else:
    # Killed after the messages were applied on their shards, before their removal (the
    # pipeline of LREMs).
    storage.client.pipeline = die
    storage.deliver_messages(500)
print("not killed")
"""


def run_child(storage: RedisStorage, clock: FakeClock, phase: str, queue: str) -> None:
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, REDIS_URL, storage.key_prefix, str(SHARDS)]
        + [clock.now().isoformat(), phase, queue],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -9, (done.returncode, done.stdout, done.stderr)


def test_a_delivery_killed_at_each_step_loses_nothing_and_applies_nothing_twice(
    executor, storage, clock
):
    executor.submit("demo.echo", {}, task_id="gate", queue=S2)
    members = [step(f"m{i}", S2) for i in range(5)]
    executor.submit_batch(members, batch_id="k", on_complete=step("cb", S1))
    executor.submit("demo.echo", {}, task_id="after", queue=S1, depends_on=["gate"])
    # 1: the ending is written, its process dies before delivering.
    run_child(storage, clock, "end", S2)
    assert {status(executor, t) for t in ["gate", *(m.task_id for m in members)]} == {
        TaskStatus.COMPLETED
    }
    assert outbox_lengths(storage) == [0, 0, 6]  # 5 members and 1 dependent: nothing lost
    assert executor.get_batch("k").completed == 0
    assert status(executor, "after") is TaskStatus.CREATED
    sent = storage.client.lrange(storage.prefixes[2] + "outbox", 0, -1)
    # 2: a delivery applies them on their shards, and dies before removing them.
    run_child(storage, clock, "deliver", S2)
    assert storage.client.lrange(storage.prefixes[2] + "outbox", 0, -1) == sent
    assert due(executor, "after")
    batch = executor.get_batch("k")
    assert (batch.total, batch.completed, batch.finished_at is not None) == (5, 5, True)
    assert outbox_lengths(storage) == [1, 0, 6]  # the callback, to shard 1, not delivered
    assert executor.get_task("cb") is None
    # 3: the master's chore delivers them all again: applied once.
    applied: list[str] = []
    apply = storage._apply

    def recording(messages, target):
        applied.extend(messages)
        return apply(messages, target)

    storage._apply = recording  # type: ignore[method-assign]
    assert storage.deliver_messages(500) == 7
    assert outbox_lengths(storage) == [0, 0, 0]
    assert due(executor, "cb")
    # Every message once more, as a delivery stalled since before step 3 would: no change.
    for message in applied:
        storage.client.rpush(storage.prefixes[json.loads(message)["f"]] + "outbox", message)
    assert storage.deliver_messages(500) == 7
    batch = executor.get_batch("k")
    assert (batch.total, batch.completed, batch.failed, batch.cancelled) == (5, 5, 0, 0)
    claims = storage.claim("w1", [S1], 10, LEASE)
    assert sorted(c.task_id for c in claims) == ["after", "cb"]
    storage.release(claims)


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
    return {
        key
        for shard in range(SHARDS)
        for key in storage.client.scan_iter(match=_pattern(storage, shard), count=1000)
        if key.endswith(":" + batch_id) or f":{batch_id}:" in key
    }


def test_a_switch_of_shards_waits_for_undelivered_messages(executor, storage):
    from django_reliable_executor.storage.redis.resharding import check_reshard

    executor.submit_batch([step("u", S2)], batch_id="u")
    started = claim(storage, S2, "u")
    now = str(int(storage.clock.now().timestamp() * 1e6))
    storage._scripts.run(  # the ending alone: its writer died before delivering
        "complete", storage._routes[2], (storage.prefixes[2], now, "n1", "u", started.token, "1")
    )
    check = check_reshard(storage, 2)
    assert (check.unfinished, check.undelivered, check.ready) == (0, 1, False)
    assert "1 messages between shards not delivered yet" in check.problems()[0]
    assert storage.deliver_messages(500) == 1
    assert check_reshard(storage, 2).undelivered == 0
    assert executor.get_batch("u").completed == 1


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


def test_a_missing_dependency_in_a_call_over_shards_stores_nothing(executor, storage):
    with pytest.raises(InvalidDependencyError, match="do not exist: 'nowhere'"):
        executor.submit_many(
            [
                step("one", S2),
                step("two", S0, depends_on=["one"]),
                step("x", S1, depends_on=["nowhere"]),
            ]
        )
    assert storage.get_many(["one", "two", "x"]) == {}


def test_a_message_that_cannot_be_applied_holds_up_only_its_target(executor, storage):
    executor.submit("demo.echo", {}, task_id="a", queue=S2)
    executor.submit("demo.echo", {}, task_id="b", queue=S1, depends_on=["a"])
    started = claim(storage, S2, "a")
    poison = json.dumps({"to": 7, "f": 2, "m": "0", "k": "dep", "id": "x", "d": "y", "s": "OK"})
    storage.client.rpush(storage.prefixes[2] + "outbox", poison)
    now = str(int(storage.clock.now().timestamp() * 1e6))
    storage._scripts.run(  # the ending alone, its message behind the one for no shard
        "complete", storage._routes[2], (storage.prefixes[2], now, "n1", "a", started.token, "1")
    )
    with pytest.raises(IndexError):
        storage.deliver_messages(500)
    assert due(executor, "b")  # its own target's messages went on
    assert storage.client.lrange(storage.prefixes[2] + "outbox", 0, -1) == [poison]
    storage.client.delete(storage.prefixes[2] + "outbox")
