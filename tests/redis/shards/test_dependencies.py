"""Dependencies across shards: a dependent waits on its own shard for dependencies of others,
registered there first (dep_link.lua), and is released or cancelled by their endings' messages,
delivered by the ending call itself or by the master's chore."""

from __future__ import annotations

import zlib

import pytest

from django_reliable_executor import InvalidDependencyError, TaskStatus
from django_reliable_executor.core.uniqueness import unique_digest
from django_reliable_executor.registry import FLOW_LIMITS
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.sharding import directory_of, unique_home
from tests.conftest import delete_prefix, redis_client, require

from .conftest import (
    LEASE,
    S0,
    S0B,
    S1,
    S2,
    SHARDS,
    claim,
    complete,
    due,
    fail,
    outbox_lengths,
    status,
    step,
)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


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
    one = RedisStorage(client, prefix, clock=clock, flow_limits=FLOW_LIMITS)
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


@pytest.mark.parametrize("on_failure", ["cancel", "run"])
def test_an_idempotent_resubmit_of_a_dependency_stored_on_another_shard(
    executor, storage, on_failure
):
    """X is stored on shard 0; submit_many([X to a queue of shard 1, its directory, Y of shard
    1 depending on X]) returns X as stored and links Y to it there, so X's ending reaches Y."""
    assert directory_of("xb", SHARDS) == 1  # shard 1 holds "xb"'s directory entry
    original = executor.submit("demo.echo", {}, task_id="xb", queue=S0)
    again, waiting = executor.submit_many(
        [step("xb", S1), step("y", S1, depends_on=["xb"], on_dependency_failure=on_failure)]
    )
    assert again == original and again.queue == S0
    assert waiting.status is TaskStatus.CREATED and waiting.waiting_for == ("xb",)
    assert executor.dependents_of("xb") == ["y"]
    assert [task.task_id for task in executor.list_tasks()] == ["y", "xb"]
    assert executor.cancel_task("xb")
    if on_failure == "cancel":
        assert status(executor, "y") is TaskStatus.CANCELLED
        assert executor.get_task("y").last_error == "dependency xb ended CANCELLED: cancelled"
    else:
        assert due(executor, "y")
        complete(storage, S1, "y")


def test_a_refused_chain_over_three_shards_stores_nothing(executor, storage):
    """Its second step's unique key is held by another task, so the third step depends on a
    task the call does not store: refused before the first write, on every shard."""
    executor.submit("demo.echo", {}, task_id="held", queue=S1, unique_for=60, unique_key="k")
    steps = [step("s1", S0), step("s2", S1, unique_for=60, unique_key="k"), step("s3", S2)]
    with pytest.raises(InvalidDependencyError, match="'s3' names tasks that do not exist: 's2'"):
        executor.chain(steps)
    assert storage.get_many(["s1", "s2", "s3"]) == {}
    assert [task.task_id for task in executor.list_tasks()] == ["held"]
    claims = storage.claim("w1", [S0, S1, S2], 10, LEASE)
    assert [c.task_id for c in claims] == ["held"]
    storage.release(claims)
    left = [
        prefix + family + task_id
        for prefix in storage.prefixes
        for family in ("i:", "deps:", "xdone:")
        for task_id in ("s1", "s2", "s3")
    ]
    assert storage.client.exists(*left) == 0  # no id reserved, no dependent registered
    key = unique_digest("demo.echo", "k", {})
    assert storage.unique_holder(key) == executor.get_task("held")


def test_a_refused_call_on_one_shard_gives_back_the_unique_keys_it_took_on_others(
    executor, storage
):
    """The run of shard 1 takes its unique key on the key's home (shard 2) before its
    submit.lua, which then refuses a missing dependency: the key is given back, so the next
    submit of it is stored at once (it would wait 10 s for a task never stored)."""
    key = unique_digest("demo.echo", "k", {})
    assert unique_home(key, SHARDS) == 2
    with pytest.raises(InvalidDependencyError, match="'b' names tasks that do not exist"):
        executor.submit_many(
            [
                step("a", S1, unique_for=60, unique_key="k"),
                step("b", S1, depends_on=["nowhere"]),
            ]
        )
    assert storage.get_many(["a", "b"]) == {}
    assert storage.client.get(storage.prefixes[2] + "u:" + key) is None
    assert executor.submit("demo.echo", {}, task_id="c", queue=S0, unique_for=60, unique_key="k")
    assert storage.unique_holder(key) == executor.get_task("c")
