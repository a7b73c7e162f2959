"""The Redis storage over several shards (hash tags) of one key prefix, on the shared Redis: a
plain server serves any number of hash tags, so each shard's keys and scripts are checked here;
tests/redis/test_redis_cluster.py runs them on a Cluster's masters."""

from __future__ import annotations

import io
import time
import zlib
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from redis.crc import key_slot

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.uniqueness import unique_digest
from django_reliable_executor.exceptions import InvalidDependencyError, TaskSubmitError
from django_reliable_executor.registry import FLOW_LIMITS
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.service.reliable_executor import executor as module_executor
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.reservations import (
    ID_RESERVATION_GRACE_SECONDS,
    UNIQUE_RESERVATION_GRACE_SECONDS,
)
from django_reliable_executor.storage.redis.sharding import (
    CLUSTER_SLOTS,
    ShardLayout,
    directory_of,
    shard_of,
    shard_prefix,
    unique_home,
)
from tests.conftest import REDIS_URL, delete_prefix, redis_client, require, sharded_redis_storage

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

SHARDS = 3
# Six queues over the three shards, two each (pinned below: the hash is part of the layout).
QUEUES = ("orphan", "emails", "default", "alpha", "prio", "search")


@pytest.fixture
def storage(clock) -> Iterator[RedisStorage]:
    with sharded_redis_storage("shards", SHARDS, clock) as made:
        yield made


def keys_of(storage: RedisStorage, shard: int) -> set[str]:
    pattern = storage.prefixes[shard].replace("{", "\\{").replace("}", "\\}") + "*"
    return set(storage.client.scan_iter(match=pattern, count=1000))


# -- the layout --------------------------------------------------------------------------------
def test_one_shard_is_the_single_hash_tag_layout():
    layout = ShardLayout("reliable_executor")
    assert layout.prefixes == ("{reliable_executor}:",)
    assert layout.shard_of("anything") == 0
    storage = RedisStorage(redis_client(), "reliable_executor", flow_limits=FLOW_LIMITS)
    try:
        assert storage.p == "{reliable_executor}:"
        assert storage._tkey("x") == "{reliable_executor}:t:x"
    finally:
        storage.close()


def test_queue_shards_are_crc32_of_the_name_and_stable():
    assert [shard_of(queue, SHARDS) for queue in QUEUES] == [0, 0, 1, 1, 2, 2]
    for queue in QUEUES:
        assert shard_of(queue, 7) == zlib.crc32(queue.encode()) % 7
    assert shard_of("é", 5) == zlib.crc32("é".encode()) % 5


@pytest.mark.parametrize("shards", [2, 3, 6, 16])
def test_each_shard_tag_falls_in_its_part_of_the_slot_space(shards: int):
    for index in range(shards):
        prefix = shard_prefix("reliable_executor", index, shards)
        assert prefix.startswith(f"{{reliable_executor:shard-{index}-of-{shards}:")
        slot = key_slot((prefix + "t:some-task").encode())  # redis-py's own CRC16
        assert index * CLUSTER_SLOTS // shards <= slot < (index + 1) * CLUSTER_SLOTS // shards


def test_a_bad_number_of_shards_is_refused():
    for bad in (0, -1, True, 1.5, CLUSTER_SLOTS + 1):
        with pytest.raises(ValueError, match="shards must be"):
            ShardLayout("p", bad)


# -- tasks on their queue's shard ---------------------------------------------------------------
def test_each_task_lives_on_its_queues_shard(executor: ReliableExecutor, storage: RedisStorage):
    ids = {
        queue: executor.submit("demo.echo", {"q": queue}, queue=queue).task_id for queue in QUEUES
    }
    for queue, task_id in ids.items():
        home = shard_of(queue, SHARDS)
        for shard in range(SHARDS):
            found = storage.client.exists(storage.prefixes[shard] + "t:" + task_id)
            assert found == (shard == home), (queue, shard)
        assert storage.prefixes[home] + "ready:" + queue + ":0" in keys_of(storage, home)
        assert executor.get_task(task_id).queue == queue
    assert all(keys_of(storage, shard) for shard in range(SHARDS))
    assert sorted(storage._queues()) == sorted(QUEUES)


def test_one_claim_takes_from_every_shard_and_the_counts_merge(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    ids = []
    for i, queue in enumerate(QUEUES):
        ids.append(executor.submit("demo.echo", {"i": i}, queue=queue).task_id)
        clock.advance(1)  # listed newest first, by creation
    assert executor.count_by_status()[TaskStatus.CREATED] == 6
    claims = storage.claim("w1", QUEUES, 100, 30.0, start=4)
    assert sorted(c.task_id for c in claims) == sorted(ids)
    assert sum(c.task.status is TaskStatus.RUNNING for c in claims) == 4
    started = storage.start_many([c for c in claims if c.task.status is not TaskStatus.RUNNING], 30)
    assert all(started)
    running = [c for c in claims if c.task.status is TaskStatus.RUNNING] + started
    renewed = storage.heartbeat("w1", {c.task_id: c.token for c in running if c}, 30.0)
    assert set(renewed) == set(ids)
    done = storage.complete_many([(c, {"ok": c.task_id}) for c in running if c])
    assert all(done)
    counts = executor.count_by_status()
    assert counts[TaskStatus.COMPLETED] == 6
    assert sum(counts.values()) == 6
    assert {queue: c[TaskStatus.COMPLETED] for queue, c in storage.count_by_queue().items()} == {
        queue: 1 for queue in QUEUES
    }
    listed = executor.list_tasks(limit=4)
    assert [info.task_id for info in listed] == [i for i in reversed(ids)][:4]
    assert [i.task_id for i in executor.list_tasks(offset=4, limit=10)] == ids[1::-1]


def test_cancel_retry_and_pause_find_the_tasks_shard(
    executor: ReliableExecutor, storage: RedisStorage
):
    on_two = executor.submit("demo.echo", {}, queue="search")
    assert executor.cancel_task(on_two.task_id)
    assert executor.get_task(on_two.task_id).status is TaskStatus.CANCELLED
    assert executor.retry_task(on_two.task_id)
    assert executor.get_task(on_two.task_id).status is TaskStatus.PENDING
    assert executor.pause_queue("search")
    assert storage.client.sismember(storage.prefixes[2] + "queues:paused", "search")
    assert storage.paused_queues() == {"search"}
    assert storage.claim("w1", QUEUES, 10, 30.0) == []
    assert executor.resume_queue("search")
    assert [c.task_id for c in storage.claim("w1", QUEUES, 10, 30.0)] == [on_two.task_id]


def test_recovery_and_timeouts_visit_every_shard(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    for queue in QUEUES:
        executor.submit("demo.echo", {}, queue=queue, max_duration_millis=60_000)
    claims = storage.claim("w1", QUEUES, 100, 5.0, start=6)
    assert len(claims) == 6
    clock.advance(10)
    recovered = storage.recover_expired(100)
    assert len(recovered) == 6
    assert executor.count_by_status()[TaskStatus.PENDING] == 6
    clock.advance(120)
    assert len(storage.expire_overdue(100)) == 6
    assert executor.count_by_status()[TaskStatus.TIMEOUT] == 6
    clock.advance(30 * 86400)
    assert storage.purge_finished(clock.now(), 100) == 6
    assert sum(executor.count_by_status().values()) == 0
    assert storage._queues() == []


def test_an_idle_wait_wakes_on_any_shard_and_loses_no_token(storage: RedisStorage):
    assert storage.wait_for_work(QUEUES, 0.05) is False
    storage.wake(["search"])  # shard 2
    assert storage.wait_for_work(QUEUES, 5.0) is True
    # A wake arriving after a wait returned is kept by the shard's pop for the next wait.
    assert storage.wait_for_work(QUEUES, 0.05) is False
    storage.wake(["emails"])  # shard 0
    assert storage.wait_for_work(QUEUES, 5.0) is True
    # Queues of one shard, once the waiters exist: through them too (their pop may hold it),
    # and at once: the earlier wait's pop on that shard's other keys takes the token, and the
    # wait returned only at its own pop's 5 s timeout when it watched that pop alone.
    storage.wake(["alpha"])
    started = time.monotonic()
    assert storage.wait_for_work(["default", "alpha"], 5.0) is True
    assert time.monotonic() - started < 2.5
    # Another key beside a pop under way on its shard (the fetcher's own, while its pool is
    # full): a pop of its own.
    assert storage.wait_for_work(QUEUES, 0.05) is False
    storage.wake(["_worker:w1"])
    assert storage.wait_for_work([*QUEUES, "_worker:w1"], 5.0) is True


# -- task ids across shards ----------------------------------------------------------------------
def test_generated_ids_need_no_directory_entry(executor: ReliableExecutor, storage: RedisStorage):
    for queue in QUEUES:
        task = executor.submit("demo.echo", {}, queue=queue)
        assert directory_of(task.task_id, SHARDS) == shard_of(queue, SHARDS)
    assert not any(
        key.split("}:", 1)[1].startswith("i:")
        for shard in range(SHARDS)
        for key in keys_of(storage, shard)
    )


def test_a_given_id_is_stored_once_whatever_queue_it_is_submitted_to(
    executor: ReliableExecutor, storage: RedisStorage
):
    # Ids of each directory shard, each submitted to a queue of every shard: stored once, on
    # the first queue's shard; later submits return that task unchanged.
    for n in range(12):
        task_id = f"given-{n}"
        first = QUEUES[n % len(QUEUES)]
        stored = executor.submit("demo.echo", {"n": n}, task_id=task_id, queue=first)
        for queue in QUEUES:
            again = executor.submit("demo.echo", {"other": 1}, task_id=task_id, queue=queue)
            assert (again.queue, again.parameter) == (first, {"n": n})
        assert executor.get_task(task_id) == stored
        homes = [s for s in range(SHARDS) if storage.client.exists(storage._tkey(task_id, s))]
        assert homes == [shard_of(first, SHARDS)]
    assert executor.count_by_status()[TaskStatus.CREATED] == 12


def test_an_interrupted_reservation_blocks_other_shards_until_its_grace_ends(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    task_id = next(f"id-{n}" for n in range(100) if directory_of(f"id-{n}", SHARDS) == 0)
    # A submitter reserved the id for shard 2 ("search") and died before storing it there.
    assert storage._run("id_reserve", 2, task_id, "", shard=0) == [""]
    with pytest.raises(TaskSubmitError, match="being submitted to a queue of shard 2") as error:
        executor.submit("demo.echo", {}, task_id=task_id, queue="default")  # shard 1
    assert error.value.field == "task_id"
    assert executor.get_task(task_id) is None
    # Its own shard may still store it (a resumed submit)...
    resumed = executor.submit("demo.echo", {"resumed": 1}, task_id=task_id, queue="search")
    assert executor.get_task(task_id) == resumed
    # ...and once purged, the entry goes with it.
    assert executor.cancel_task(task_id)
    clock.advance(30 * 86400)
    assert storage.purge_finished(clock.now(), 100) == 1
    assert not storage.client.exists(storage.prefixes[0] + "i:" + task_id)
    # An entry left by a crash is taken over after the grace.
    assert storage._run("id_reserve", 2, task_id, "", shard=0) == [""]
    clock.advance(ID_RESERVATION_GRACE_SECONDS + 1)
    taken = executor.submit("demo.echo", {}, task_id=task_id, queue="default")
    assert executor.get_task(task_id) == taken
    assert storage.client.get(storage.prefixes[0] + "i:" + task_id).startswith("1 ")


def test_what_is_not_built_across_shards_is_refused_by_name(executor: ReliableExecutor):
    first = executor.submit("demo.echo", {}, queue="orphan")  # shard 0
    same = executor.submit("demo.echo", {}, queue="emails", depends_on=[first.task_id])
    assert same.status is TaskStatus.CREATED
    # Across shards (tests/redis/shards/): stored, waiting.
    other = executor.submit("demo.echo", {}, queue="search", depends_on=[first.task_id])
    assert other.waiting_for == (first.task_id,)
    with pytest.raises(InvalidDependencyError, match="do not exist"):
        executor.submit("demo.echo", {}, queue="search", depends_on=["nowhere"])
    assert executor.count_by_status()[TaskStatus.CREATED] == 3


# -- changing the number of shards -------------------------------------------------------------
def shards_command(target: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("executor", "shards", target, stdout=out)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue()


def test_the_shards_command_allows_a_switch_only_when_drained_and_the_new_layout_is_empty(clock):
    require("redis")
    prefix = f"reshard-{zlib.crc32(str(id(clock)).encode()):08x}"
    setting = {"STORAGE": "redis", "REDIS_URL": REDIS_URL, "KEY_PREFIX": prefix}
    client = redis_client()
    try:
        with override_settings(RELIABLE_EXECUTOR=setting):
            task = module_executor.submit("demo.echo", {}, queue="default")
            code, out = shards_command("3")
            assert code == 1
            assert "REDIS_SHARDS 1 -> 3" in out and "queue default: shard 1" in out
            assert "not ready: 1 unfinished tasks in the current layout" in out
            assert module_executor.cancel_task(task.task_id)
            code, out = shards_command("3")
            assert (code, out.splitlines()[-1]) == (
                0,
                "ready: run again with --apply, then set REDIS_SHARDS = 3 and start the "
                "workers again",
            )
            # Keys of the 3-shard layout already there (an earlier switch, undone): refused.
            client.set(shard_prefix(prefix, 2, 3) + "t:left-behind", "x")
            code, out = shards_command("3")
            assert code == 1 and "not ready: shard 2 of the 3-shard layout holds" in out
            code, out = shards_command("1")
            assert code == 1 and "not ready: REDIS_SHARDS is 1 already" in out
            for bad in ("0", "16385", "x"):
                with pytest.raises(CommandError, match=f"invalid N '{bad}': expected a number"):
                    shards_command(bad)
            module_executor.storage.close()
    finally:
        delete_prefix(client, prefix)
        client.close()


def test_an_interrupted_reservation_yields_to_its_directory_shards_queue_after_its_grace(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    """The id's directory shard is the queue's own ("emails", shard 0): a reservation for
    another shard whose submitter died refuses the submit within the grace, then gives way."""
    task_id = next(f"own-{n}" for n in range(100) if directory_of(f"own-{n}", SHARDS) == 0)
    assert storage._run("id_reserve", 2, task_id, "", shard=0) == [""]  # for "search"
    with pytest.raises(TaskSubmitError, match="being submitted to a queue of shard 2"):
        executor.submit("demo.echo", {}, task_id=task_id, queue="emails")
    assert executor.get_task(task_id) is None
    clock.advance(ID_RESERVATION_GRACE_SECONDS + 1)
    taken = executor.submit("demo.echo", {"taken": 1}, task_id=task_id, queue="emails")
    assert (taken.queue, taken.parameter) == ("emails", {"taken": 1})
    assert executor.get_task(task_id) == taken
    # Stored on its directory shard: no entry left there, and a submit of it elsewhere
    # returns this task.
    assert not storage.client.exists(storage.prefixes[0] + "i:" + task_id)
    assert executor.submit("demo.echo", {}, task_id=task_id, queue="search") == taken


# -- unique keys across shards -----------------------------------------------------------------
def u_keys(storage: RedisStorage) -> dict[int, set[str]]:
    """Each shard's unique keys (digests)."""
    return {
        shard: {key.split("}:u:", 1)[1] for key in keys_of(storage, shard) if "}:u:" in key}
        for shard in range(SHARDS)
    }


def test_a_unique_key_stores_one_task_whatever_queue_it_is_submitted_to(
    executor: ReliableExecutor, storage: RedisStorage
):
    # Keys of each home shard, each submitted to a queue of every shard, the first queue
    # varying: one task per key, on the first queue's shard; the key only on its home shard.
    digests: dict[str, int] = {}
    for n in range(12):
        first = QUEUES[n % len(QUEUES)]
        stored = executor.submit("demo.echo", {"n": n}, queue=first, unique_for=300)
        for queue in QUEUES:
            again = executor.submit("demo.echo", {"n": n}, queue=queue, unique_for=300)
            assert again == stored
        digest = unique_digest("demo.echo", None, {"n": n})
        digests[digest] = unique_home(digest, SHARDS)
        assert storage.unique_holder(digest) == stored
    assert set(digests.values()) == {0, 1, 2}  # every kind of home met
    assert executor.count_by_status()[TaskStatus.CREATED] == 12
    assert u_keys(storage) == {
        shard: {d for d, home in digests.items() if home == shard} for shard in range(SHARDS)
    }


def key_of_home(home: int, tag: str) -> tuple[str, str]:
    """A unique_key of demo.echo whose home shard is ``home``, and its digest."""
    for n in range(1000):
        digest = unique_digest("demo.echo", f"{tag}-{n}", None)
        if unique_home(digest, SHARDS) == home:
            return f"{tag}-{n}", digest
    raise AssertionError("no key found")


def test_a_unique_key_held_by_a_terminal_task_or_past_its_window_is_taken_again(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    # A key whose home is shard 0, held by a task of shard 1, then 2, then 0.
    key, digest = key_of_home(0, "k")
    first = executor.submit("demo.echo", 1, queue="default", unique_for=60, unique_key=key)
    assert executor.submit("demo.echo", 2, queue="prio", unique_for=60, unique_key=key) == first
    assert executor.cancel_task(first.task_id)  # terminal: the key is free
    second = executor.submit("demo.echo", 3, queue="prio", unique_for=60, unique_key=key)
    assert second.task_id != first.task_id and second.queue == "prio"
    assert executor.submit("demo.echo", 4, queue="orphan", unique_for=60, unique_key=key) == second
    clock.advance(61)  # the window ended: the key is free
    third = executor.submit("demo.echo", 5, queue="orphan", unique_for=60, unique_key=key)
    assert third.task_id not in (first.task_id, second.task_id) and third.queue == "orphan"
    assert executor.submit("demo.echo", 6, queue="default", unique_for=60, unique_key=key) == third
    assert executor.count_by_status()[TaskStatus.CREATED] == 2
    # Kept no longer than its window (PX), on its home shard only.
    assert 0 < storage.client.pttl(storage.prefixes[0] + "u:" + digest) <= 60_000
    assert u_keys(storage) == {0: {digest}, 1: set(), 2: set()}


def test_a_reservation_whose_task_never_came_gives_way_after_its_grace(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    # A submitter reserved a key (home shard 0) for a task of shard 2 and died before storing
    # it: the key holds no task, and after the grace a submit to any shard takes it over (to
    # shard 1, and to shard 0, the key's home).
    for queue in ("default", "emails"):
        key, digest = key_of_home(0, queue)
        until = str(int((clock.now().timestamp() + 300) * 1_000_000))
        assert storage._run("unique_reserve", 2, digest, "ghost", until, "", shard=0) == ""
        assert storage.unique_holder(digest) is None  # reserved, not held
        clock.advance(UNIQUE_RESERVATION_GRACE_SECONDS + 1)
        taken = executor.submit("demo.echo", None, queue=queue, unique_for=60, unique_key=key)
        assert taken.queue == queue and storage.unique_holder(digest) == taken
        again = executor.submit("demo.echo", None, queue="search", unique_for=60, unique_key=key)
        assert again == taken
    assert executor.get_task("ghost") is None
    assert executor.count_by_status()[TaskStatus.CREATED] == 2


def test_one_shard_keeps_the_unique_key_and_round_trip_of_before(clock, monkeypatch):
    """REDIS_SHARDS = 1: a unique submit (new, then matching) is one submit.lua call and no
    other command, and leaves one key P u:<digest> = "<window end> <task id>"."""
    require("redis")
    prefix = f"shards1-{zlib.crc32(str(id(clock)).encode()):08x}"
    storage = RedisStorage(redis_client(), prefix, clock=clock, flow_limits=FLOW_LIMITS)
    scripts: list[str] = []
    commands: list[object] = []
    run = storage._scripts.run
    monkeypatch.setattr(
        storage._scripts, "run", lambda name, *a: (scripts.append(name), run(name, *a))[1]
    )
    execute = storage.client.execute_command
    monkeypatch.setattr(
        storage.client, "execute_command", lambda *a, **k: (commands.append(a), execute(*a, **k))[1]
    )
    try:
        executor = ReliableExecutor(storage, clock=clock)
        first = executor.submit("demo.echo", {"a": 1}, unique_for=300)
        again = executor.submit("demo.echo", {"a": 1}, queue="search", unique_for=300)
        assert again == first
        assert (scripts, commands) == (["submit", "submit"], [])
        digest = unique_digest("demo.echo", None, {"a": 1})
        monkeypatch.undo()
        keys = set(storage.client.scan_iter(match="{" + prefix + "}:u:*"))
        assert keys == {"{" + prefix + "}:u:" + digest}
        until, task_id = storage.client.get("{" + prefix + "}:u:" + digest).split(" ")
        assert task_id == first.task_id
        assert int(until) == int((clock.now().timestamp() + 300) * 1_000_000)
    finally:
        monkeypatch.undo()
        storage.close()
        cleaner = redis_client()
        delete_prefix(cleaner, prefix)
        cleaner.close()


def test_one_call_submitting_a_key_twice_off_its_home_stores_one_task(
    executor: ReliableExecutor, storage: RedisStorage
):
    key, digest = key_of_home(0, "batch")  # home shard 0; the queues of shards 1 and 2
    requests = [
        TaskSubmitRequest("demo.echo", n, queue=queue, unique_for=60, unique_key=key)
        for n, queue in enumerate(("default", "default", "prio", "alpha"))
    ]
    infos = executor.submit_many(requests)
    assert {info.task_id for info in infos} == {infos[0].task_id}
    assert executor.count_by_status()[TaskStatus.CREATED] == 1
    assert storage.unique_holder(digest) == infos[0]
