"""What a sharded Redis storage sends to each shard: an idle worker's claims and its heartbeats
go only to the shards that may have work or hold its claims (counted with MONITOR on a
throw-away server), and the chore locks spread the shards' chores over the workers."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.master.lock import MasterLock, ShardLocks
from django_reliable_executor.registry import FLOW_LIMITS
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.lock_names import MASTER_LOCK_NAME, chore_lock_name
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.claiming import SWEEP_SECONDS
from django_reliable_executor.storage.redis.sharding import shard_of

if TYPE_CHECKING:
    from tests.support.redis_servers import RedisServer, SpareServers

pytest_plugins = ["tests.support.redis_servers"]  # spare_redis

SHARDS = 4
# One queue on each of the four shards (pinned: the hash is part of the layout).
QUEUES = ("bulk", "prio", "emails", "default")


def test_the_queues_are_one_per_shard():
    assert [shard_of(queue, SHARDS) for queue in QUEUES] == [0, 1, 2, 3]


@pytest.fixture
def server(spare_redis: SpareServers) -> RedisServer:
    return spare_redis()


@pytest.fixture
def storage(server: RedisServer, clock: FakeClock) -> Iterator[RedisStorage]:
    made = RedisStorage(
        server.client(), "traffic", clock=clock, shards=SHARDS, flow_limits=FLOW_LIMITS
    )
    yield made
    made.close()


@contextlib.contextmanager
def scripts_sent(server: RedisServer, storage: RedisStorage) -> Iterator[collections.Counter]:
    """Count the scripts (EVALSHA) sent to each shard meanwhile: ``counts[shard]``, and
    ``counts[(shard, sha)]`` per script. Read from the server's MONITOR."""
    counts: collections.Counter = collections.Counter()
    routes = {prefix + "counts": shard for shard, prefix in enumerate(storage.prefixes)}

    def count(line: dict[str, Any]) -> None:
        words = line["command"].split()
        if words[0].upper() == "EVALSHA":
            shard = routes[words[3]]  # EVALSHA sha numkeys key ...
            counts[shard] += 1
            counts[(shard, words[1])] += 1

    with server.monitored(count):
        yield counts


def claim(storage: RedisStorage, queues=QUEUES):
    return storage.claim("w1", queues, 10, 30.0)


def test_an_idle_poll_claims_only_on_the_shard_a_token_woke(server, storage, clock):
    executor = ReliableExecutor(storage, clock=clock)
    assert claim(storage) == []  # every shard: nothing known of them yet
    with scripts_sent(server, storage) as sent:
        # A poll that ends without a token, nothing due: no script at all.
        assert storage.wait_for_work(QUEUES, 0.05) is False
        assert claim(storage) == []
    assert sum(sent[s] for s in range(SHARDS)) == 0
    task_id = executor.submit("demo.echo", {}, queue="emails").task_id  # shard 2
    with scripts_sent(server, storage) as sent:
        assert storage.wait_for_work(QUEUES, 5.0) is True
        assert [c.task_id for c in claim(storage)] == [task_id]
    assert [sent[s] for s in range(SHARDS)] == [0, 0, 1, 0]
    # Busy again: the next claim asks every shard, until an idle wait finds them empty.
    with scripts_sent(server, storage) as sent:
        assert claim(storage) == []
    assert [sent[s] for s in range(SHARDS)] == [1, 1, 1, 1]


def test_a_delayed_task_on_another_shard_is_claimed_when_due(server, storage, clock):
    executor = ReliableExecutor(storage, clock=clock)
    task_id = executor.submit("demo.echo", {}, queue="default", delay_millis=5000).task_id
    assert claim(storage) == []  # shard 3's reply says when its next task is due
    assert storage.wait_for_work(QUEUES, 0.05) is True  # the submit's token
    assert claim(storage) == []
    assert storage.wait_for_work(QUEUES, 0.05) is False
    clock.advance(5)
    with scripts_sent(server, storage) as sent:
        assert storage.wait_for_work(QUEUES, 5.0) is False  # due now: no wait
        assert [c.task_id for c in claim(storage)] == [task_id]
    assert [sent[s] for s in range(SHARDS)] == [0, 0, 0, 1]


def test_a_due_task_this_worker_never_saw_comes_with_the_masters_promote(server, storage, clock):
    executor = ReliableExecutor(storage, clock=clock)
    assert claim(storage) == []
    task_id = executor.submit("demo.echo", {}, queue="prio", delay_millis=5000).task_id
    storage.client.delete(storage.prefixes[1] + "wake:prio")  # another worker took the token
    assert storage.wait_for_work(QUEUES, 0.05) is False
    clock.advance(5)
    assert storage.wait_for_work(QUEUES, 0.05) is False
    assert claim(storage) == []  # shard 1 is quiet to this worker
    assert storage.promote_due(100) == 1  # the master's round: promoted, and a token
    with scripts_sent(server, storage) as sent:
        assert storage.wait_for_work(QUEUES, 5.0) is True
        assert [c.task_id for c in claim(storage)] == [task_id]
    assert [sent[s] for s in range(SHARDS)] == [0, 1, 0, 0]


def test_a_heartbeat_goes_only_to_the_shards_holding_the_claims(server, storage, clock):
    executor = ReliableExecutor(storage, clock=clock)
    executor.submit_many(
        [
            TaskSubmitRequest("demo.echo", queue="prio"),  # shard 1
            # a given id whose directory shard is not its queue's: stored off it
            TaskSubmitRequest("demo.echo", queue="default", task_id="given-1"),
        ]
    )
    assert shard_of("given-1", SHARDS) != 3
    claims = claim(storage)
    assert len(claims) == 2
    tokens = {c.task_id: c.token for c in claims}
    storage.heartbeat("w1", tokens, 30.0)  # loads the script (a first EVALSHA fails NOSCRIPT)
    with scripts_sent(server, storage) as sent:
        held = storage.heartbeat("w1", tokens, 30.0)
    assert {task_id: token for task_id, (token, _) in held.items()} == tokens
    assert [sent[s] for s in range(SHARDS)] == [0, 1, 0, 1]
    # A task this storage did not claim (its note gone): found on the other shards.
    storage._held_on.clear()
    with scripts_sent(server, storage) as sent:
        held = storage.heartbeat("w1", tokens, 30.0)
    assert {task_id: token for task_id, (token, _) in held.items()} == tokens
    assert sent[3] == 1 and sum(sent[s] for s in range(SHARDS)) == 1 + SHARDS


def test_the_chore_locks_spread_over_the_live_workers(storage: RedisStorage):
    storage.worker_seen("w1", {})
    storage.worker_seen("w2", {})
    first = MasterLock(storage, "w1", 30.0)
    assert first.hold()
    locks = {w: ShardLocks(storage, w, 30.0, live_seconds=60.0) for w in ("w1", "w2")}
    held = {"w1": locks["w1"].hold(is_master=True), "w2": locks["w2"].hold(is_master=False)}
    # Four chore shards over two workers: two each, shard 0's lock being the master lock.
    assert len(held["w1"]) == 1 and len(held["w2"]) == 2
    assert held["w1"].isdisjoint(held["w2"])
    owners = storage.lock_owners([chore_lock_name(s) for s in range(SHARDS)])
    assert owners[MASTER_LOCK_NAME] == "w1"
    assert sorted(owners.values()) == ["w1", "w1", "w2", "w2"]
    locks["w1"].release()
    locks["w2"].release()
    first.release()
    assert set(storage.lock_owners([chore_lock_name(s) for s in range(SHARDS)]).values()) == {None}


def test_a_worker_alone_takes_every_chore_lock_and_gives_some_up_to_a_newcomer(
    storage: RedisStorage,
):
    storage.worker_seen("w1", {})
    alone = ShardLocks(storage, "w1", 30.0, live_seconds=60.0)
    assert alone.hold(is_master=True) == {1, 2, 3}
    storage.worker_seen("w2", {})
    alone._round_due = 0.0  # its next round
    assert len(alone.hold(is_master=True)) == 1
    newcomer = ShardLocks(storage, "w2", 30.0, live_seconds=60.0)
    assert len(newcomer.hold(is_master=False)) == 2
    alone._round_due = 0.0  # what it gave up it does not take back
    assert len(alone.hold(is_master=True)) == 1


def test_a_shard_not_claimed_on_for_the_sweep_time_is_claimed_on_again(server, storage, clock):
    assert claim(storage) == []
    storage._idle.claimed_at[2] -= SWEEP_SECONDS  # its last claim, as if that long ago
    with scripts_sent(server, storage) as sent:
        assert storage.wait_for_work(QUEUES, 0.05) is False
        assert claim(storage) == []
    assert [sent[s] for s in range(SHARDS)] == [0, 0, 1, 0]


def test_one_shard_claims_and_beats_as_before(server, clock):
    storage = RedisStorage(server.client(), "traffic-one", clock=clock, flow_limits=FLOW_LIMITS)
    try:
        executor = ReliableExecutor(storage, clock=clock)
        assert claim(storage) == []
        with scripts_sent(server, storage) as sent:
            assert storage.wait_for_work(QUEUES, 0.05) is False
            assert claim(storage) == []  # an idle poll: one claim.lua, as ever
        assert sent[0] == 1
        executor.submit("demo.echo", {}, queue="emails")
        (taken,) = claim(storage)
        storage.heartbeat("w1", {taken.task_id: taken.token}, 30.0)
        with scripts_sent(server, storage) as sent:
            held = storage.heartbeat("w1", {taken.task_id: taken.token}, 30.0)
        assert held == {taken.task_id: (taken.token, False)} and sent[0] == 1
    finally:
        storage.close()


def test_a_lock_left_free_for_a_ttl_is_taken_whatever_the_share(storage: RedisStorage):
    storage.worker_seen("w1", {})
    storage.worker_seen("w2", {})  # dead, but still counted live by its last heartbeat
    survivor = ShardLocks(storage, "w1", 30.0, live_seconds=60.0)
    assert len(survivor.hold(is_master=True)) == 1  # its share: two of four, with shard 0
    survivor._round_due = 0.0
    assert len(survivor.hold(is_master=True)) == 1  # the others are free, not for long yet
    survivor._free_since = {s: t - survivor.ttl for s, t in survivor._free_since.items()}
    survivor._round_due = 0.0
    assert survivor.hold(is_master=True) == {1, 2, 3}


def test_a_limited_name_costs_a_worker_of_another_queue_one_claim_on_its_home(
    server, storage, clock
):
    """demo.capped (max_concurrency) is of "default", shard 3: its tasks live there whatever
    their queue. A worker serving "bulk" (shard 0) claims on shard 0 and on shard 3; a submit
    of demo.capped to "bulk" is one script on shard 3, whose token wakes that worker."""
    executor = ReliableExecutor(storage, clock=clock)  # wired: the registry's limited names
    assert shard_of("default", SHARDS) == 3
    executor.submit("demo.echo", {}, queue="prio")
    assert len(claim(storage)) == 1  # the scripts loaded (a NOSCRIPT reply is sent again)
    with scripts_sent(server, storage) as sent:
        assert claim(storage, ("bulk",)) == []
    assert [sent[s] for s in range(SHARDS)] == [1, 0, 0, 1]
    with scripts_sent(server, storage) as sent:
        task_id = executor.submit("demo.capped", {}, queue="bulk").task_id
    assert [sent[s] for s in range(SHARDS)] == [0, 0, 0, 1]
    with scripts_sent(server, storage) as sent:
        assert storage.wait_for_work(("bulk",), 5.0) is True
        assert [c.task_id for c in claim(storage, ("bulk",))] == [task_id]
    assert [sent[s] for s in range(SHARDS)] == [0, 0, 0, 1]
