"""The Redis storage's other Lua scripts (cancel, retry, recover, expire, purge, promote, locks,
submit), each called for every race it can lose, and a random walk that keeps every index
consistent with the task hashes."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.core.records import Claim
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.exceptions import AttemptStillRunningError
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.codec import micros
from tests.support.redis_support import (
    LEASE,
    WORKER_A,
    WORKER_B,
    advance_to,
    assert_consistent,
    call,
    changed_keys,
    claim_one,
    fields_of,
    index_problems,
    later,
    lease_score,
    running,
    snapshot,
    submit,
    unchanged,
)


# -- cancel ---------------------------------------------------------------------------------
@pytest.mark.parametrize("end", ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "ERROR"])
def test_cancel_leaves_a_terminal_task_unchanged(storage, executor, clock, end):
    submit(executor, "t1", retry_limit=0, max_duration_millis=100_000)
    if end == "CANCELLED":
        storage.cancel("t1")
    elif end == "TIMEOUT":
        clock.advance(101)
        storage.expire_overdue(100)
    else:
        claim = storage.start(claim_one(storage), LEASE)
        if end == "COMPLETED":
            storage.complete(claim, "ok")
        else:
            storage.fail(claim, "boom", retryable=False, is_error=end == "ERROR")
    assert fields_of(storage, "t1")["s"] == end
    with unchanged(storage):
        result = storage.cancel("t1")
    assert not result.changed and result.task is not None and result.task.status == end


def test_cancel_of_an_unknown_id_changes_nothing(storage, executor):
    submit(executor, "t1")
    with unchanged(storage):
        result = storage.cancel("nope")
    assert (result.changed, result.task) == (False, None)


def test_cancel_of_a_running_task_only_sets_the_flag(storage, executor):
    running(storage, executor, "t1")
    before = snapshot(storage)
    result = storage.cancel("t1")
    assert result.changed and result.requested_only
    after = snapshot(storage)
    assert changed_keys(before, after) == {"t:t1"}
    assert after["t:t1"][1] == {**before["t:t1"][1], "x": "1"}
    with unchanged(storage):  # asking again changes nothing more
        assert storage.cancel("t1").requested_only


def test_cancel_of_a_claimed_task_cancels_it_and_its_start_fails(storage, executor):
    submit(executor, "t1")
    claim = claim_one(storage)
    result = storage.cancel("t1")
    assert result.changed and not result.requested_only
    assert lease_score(storage, "t1") is None
    assert storage.count()[TaskStatus.CANCELLED] == 1
    assert_consistent(storage)
    with unchanged(storage):
        assert storage.start(claim, LEASE) is None
        assert storage.release([claim]) == 0
        assert storage.expire_claim(claim) is None


def test_cancel_takes_a_waiting_task_out_of_its_ready_list(storage, executor):
    for task_id in ("a", "b", "c"):
        submit(executor, task_id, priority=5)
    submit(executor, "low")
    ready = storage.p + "ready:default:5"
    storage.cancel("b")
    assert storage.client.lrange(ready, 0, -1) == ["a", "c"]
    storage.cancel("a")
    storage.cancel("c")
    assert not storage.client.exists(ready)
    assert storage.client.zrange(storage.p + "prio:default", 0, -1) == ["0"]  # 5 is gone
    assert [claim.task_id for claim in storage.claim(WORKER_A, ["default"], 5, LEASE)] == ["low"]
    assert_consistent(storage)


def test_cancel_takes_a_scheduled_task_off_the_schedule(storage, executor, clock):
    submit(executor, "later", delay_millis=60_000)
    submit(executor, "later2", delay_millis=90_000)
    assert storage.cancel("later").changed
    assert storage.client.zrange(storage.p + "sched:default", 0, -1) == ["later2"]
    clock.advance(120)
    assert storage.promote_due(100) == 1
    assert_consistent(storage)


# -- retry ----------------------------------------------------------------------------------
def test_retry_refuses_a_completed_task(storage, executor):
    claim = running(storage, executor, "t1")
    storage.complete(claim, "ok")
    with unchanged(storage):
        assert storage.retry("t1") is None
        assert call(storage, "retry", "t1", "COMPLETED", "") is None


@pytest.mark.parametrize("state", ["CREATED", "claimed", "RUNNING", "PENDING"])
def test_retry_refuses_a_live_task(storage, executor, state):
    submit(executor, "t1")
    if state != "CREATED":
        claim = claim_one(storage)
        if state in ("RUNNING", "PENDING"):
            claim = storage.start(claim, LEASE)
        if state == "PENDING":
            storage.fail(claim, "boom", retryable=True)
    status = fields_of(storage, "t1")["s"]
    with unchanged(storage):
        assert storage.retry("t1") is None
        # Even told the status it really has, the script will not re-queue a live task.
        assert call(storage, "retry", "t1", status, "") is None


def test_retry_refuses_when_the_status_changed_since_read(storage, executor):
    claim = running(storage, executor, "t1", retry_limit=0)
    storage.fail(claim, "boom", retryable=False)
    with unchanged(storage):
        for read_before in ("CANCELLED", "TIMEOUT", "ERROR", "RUNNING"):
            assert call(storage, "retry", "t1", read_before, "") is None
    assert call(storage, "retry", "t1", "FAILED", "") is not None
    assert fields_of(storage, "t1")["s"] == "PENDING"
    assert_consistent(storage)


def test_old_claim_of_a_cancelled_then_retried_task_is_refused(storage, executor):
    """Neither cancel nor retry bumps the token: the retried task waits with worker-a's token
    and w, and only the missing lease refuses worker-a's old claim."""
    submit(executor, "t1")
    claim = claim_one(storage)
    storage.cancel("t1")
    assert storage.retry("t1") is not None
    values = fields_of(storage, "t1")
    assert (values["s"], values["k"]) == ("PENDING", str(claim.token))
    with unchanged(storage):
        assert storage.start(claim, LEASE) is None
        assert storage.release([claim]) == 0
        assert storage.expire_claim(claim) is None
        assert storage.heartbeat(WORKER_A, {"t1": claim.token}, LEASE) == {}
    assert claim_one(storage, WORKER_B).token > claim.token  # a fresh token for the new claim
    assert_consistent(storage)


def test_retry_refuses_an_unknown_id(storage, executor):
    submit(executor, "t1")
    with unchanged(storage):
        assert call(storage, "retry", "nope", "FAILED", "") is None


# -- recover --------------------------------------------------------------------------------
def recover_args(values: dict[str, str], task_id: str, clock: FakeClock) -> list[str]:
    """What recover_expired passes for a task read as ``values``: PENDING at once if it ran."""
    ran = values["s"] == "RUNNING"
    return [
        task_id,
        values["k"],
        values["s"],
        values.get("x", "0"),
        "PENDING" if ran else "",
        micros(clock.now()) if ran else "",
        "worker lost" if ran else "",
    ]


@pytest.mark.parametrize("started", [False, True])
def test_recover_leaves_an_unexpired_lease(storage, executor, clock, started):
    submit(executor, "t1")
    claim = claim_one(storage)
    if started:
        storage.start(claim, LEASE)
    clock.advance(LEASE)  # exactly at expiry: still held
    with unchanged(storage):
        assert storage.recover_expired(100) == []
        assert call(storage, "recover", *recover_args(fields_of(storage, "t1"), "t1", clock)) == []


@pytest.mark.parametrize("started", [False, True])
def test_recover_refuses_a_token_changed_since_read(storage, executor, clock, started):
    submit(executor, "t1")
    claim = claim_one(storage)
    if started:
        storage.start(claim, LEASE)
    clock.advance(LEASE + 1)
    read = recover_args(fields_of(storage, "t1"), "t1", clock)
    # Meanwhile the claim went back and worker B took the task (and its lease ran out too).
    if started:
        rerun = storage.recover_expired(100)
        assert rerun and rerun[0].status is TaskStatus.PENDING
    else:
        storage.release([claim])
    again = claim_one(storage, WORKER_B)
    if started:
        storage.start(again, LEASE)
    clock.advance(LEASE + 1)
    read_again = recover_args(fields_of(storage, "t1"), "t1", clock)
    assert read_again[1] != read[1]
    with unchanged(storage):
        assert call(storage, "recover", *read) == []
    assert_consistent(storage)


def test_recover_refuses_a_status_changed_since_read(storage, executor, clock):
    """Read as a claimed CREATED task, then started under the same token."""
    submit(executor, "t1")
    claim = claim_one(storage)
    clock.advance(LEASE + 1)
    read = recover_args(fields_of(storage, "t1"), "t1", clock)
    storage.start(claim, LEASE)  # by the clock, an already expired lease: start does not care
    clock.advance(LEASE + 1)
    with unchanged(storage):
        assert call(storage, "recover", *read) == []


def test_recover_refuses_a_cancel_flag_changed_since_read(storage, executor, clock):
    running(storage, executor, "t1")
    clock.advance(LEASE + 1)
    read = recover_args(fields_of(storage, "t1"), "t1", clock)
    assert read[3] == "0" and read[4] == "PENDING"
    storage.cancel("t1")  # the user asked to stop: re-queueing it now would ignore that
    with unchanged(storage):
        assert call(storage, "recover", *read) == []
    [transition] = storage.recover_expired(100)
    assert transition.status is TaskStatus.CANCELLED
    assert_consistent(storage)


# -- expire ---------------------------------------------------------------------------------
def expire_args(storage: RedisStorage, task_id: str) -> list[str]:
    values = fields_of(storage, task_id)
    return [task_id, values["k"], values["s"], "max duration exceeded"]


@pytest.mark.parametrize(
    ("state", "delay_seconds"), [("ready", 0), ("scheduled", 90), ("claimed", 0), ("running", 0)]
)
def test_expire_leaves_a_task_before_its_deadline(storage, executor, clock, state, delay_seconds):
    deadline = clock.now() + dt.timedelta(seconds=60)
    submit(executor, "t1", max_duration_millis=60_000, delay_millis=delay_seconds * 1000)
    if state in ("claimed", "running"):
        clock.advance(40)
        claim = claim_one(storage)
        if state == "running":
            storage.start(claim, LEASE)
    advance_to(clock, deadline - dt.timedelta(microseconds=1))
    with unchanged(storage):
        assert storage.expire_overdue(100) == []
        assert call(storage, "expire", *expire_args(storage, "t1")) == []
    advance_to(clock, deadline)  # exactly at the deadline: timed out
    [transition] = storage.expire_overdue(100)
    assert transition.status is TaskStatus.TIMEOUT
    assert_consistent(storage)


@pytest.mark.parametrize("change", ["started", "completed", "released", "reclaimed", "cancelled"])
def test_expire_refuses_a_task_changed_since_read(storage, executor, clock, change):
    submit(executor, "t1", max_duration_millis=10_000)
    claim = claim_one(storage)
    if change == "completed":
        claim = storage.start(claim, LEASE)
    clock.advance(11)
    read = expire_args(storage, "t1")
    if change == "started":  # same token, now RUNNING
        storage.start(claim, LEASE)
    elif change == "completed":
        storage.complete(claim, "just in time")
    elif change in ("released", "reclaimed"):  # same status, a newer token
        storage.release([claim])
        if change == "reclaimed":
            claim_one(storage, WORKER_B)
    else:
        storage.cancel("t1")
    with unchanged(storage):
        assert call(storage, "expire", *read) == []
    assert_consistent(storage)


# -- purge ----------------------------------------------------------------------------------
def test_purge_never_deletes_a_live_task_even_in_the_finished_index(storage, executor, clock):
    for task_id in ("claimed", "running", "ready", "scheduled"):
        submit(executor, task_id, delay_millis=3_600_000 if task_id == "scheduled" else 0)
    assert claim_one(storage).task_id == "claimed"
    assert storage.start(claim_one(storage), LEASE).task_id == "running"
    clock.advance(10)
    before = snapshot(storage)
    strays = {task_id: 1 for task_id in ("ready", "scheduled", "claimed", "running")}
    storage.client.zadd(storage.p + "finished", strays)
    assert storage.purge_finished(clock.now(), 100) == 0
    # The stray index entries are dropped; nothing else changes.
    assert snapshot(storage) == before
    assert_consistent(storage)


def test_purge_cutoff_is_exclusive(storage, executor, clock):
    claim = running(storage, executor, "t1")
    storage.complete(claim, "ok")
    finished_at = clock.now()
    clock.advance(3600)
    with unchanged(storage):
        assert storage.purge_finished(finished_at, 100) == 0
    assert storage.purge_finished(finished_at + dt.timedelta(microseconds=1), 100) == 1
    assert not storage.client.exists(storage.p + "t:t1")
    assert storage.count()[TaskStatus.COMPLETED] == 0
    assert_consistent(storage)


# -- promote --------------------------------------------------------------------------------
def test_promote_keeps_undue_tasks_scheduled_and_due_ones_in_run_at_order(storage, executor, clock):
    for task_id, delay_seconds in (("third", 30), ("first", 10), ("not_yet", 60), ("second", 20)):
        submit(executor, task_id, delay_millis=delay_seconds * 1000)
    clock.advance(9)
    with unchanged(storage):
        assert storage.promote_due(100) == 0
    clock.advance(21)  # "third" is due exactly now
    assert storage.promote_due(100) == 3
    ready = storage.client.lrange(storage.p + "ready:default:0", 0, -1)
    assert ready == ["first", "second", "third"]
    sched = storage.client.zrange(storage.p + "sched:default", 0, -1, withscores=True)
    assert sched == [("not_yet", int(micros(clock.now())) + 30_000_000)]
    assert_consistent(storage)


def test_promote_limit_takes_the_earliest(storage, executor, clock):
    for task_id, delay_seconds in (("b", 20), ("a", 10), ("c", 30)):
        submit(executor, task_id, delay_millis=delay_seconds * 1000)
    clock.advance(60)
    assert storage.promote_due(1) == 1
    assert storage.client.lrange(storage.p + "ready:default:0", 0, -1) == ["a"]
    assert storage.promote_due(100) == 2
    assert storage.client.lrange(storage.p + "ready:default:0", 0, -1) == ["a", "b", "c"]
    assert_consistent(storage)


# -- lock_acquire / lock_release ------------------------------------------------------------
def test_lock_held_by_another_owner_is_refused_until_it_expires(storage, clock):
    assert storage.acquire_lock("master", WORKER_A, 30)
    clock.advance(30)  # exactly at expiry: still held
    with unchanged(storage):
        assert not storage.acquire_lock("master", WORKER_B, 30)
    assert storage.acquire_lock("master", WORKER_A, 30)  # the owner renews
    clock.advance(30.000001)  # by the injected clock; Redis's own PX has not run out
    assert storage.acquire_lock("master", WORKER_B, 30)
    assert storage.lock_owner("master") == WORKER_B
    assert storage.client.get(storage.p + "lock:master") == f"{later(clock, 30)}:{WORKER_B}"


def test_lock_release_by_another_owner_does_nothing(storage):
    assert storage.acquire_lock("master", "host:1", 30)
    with unchanged(storage):
        storage.release_lock("master", "host")  # a prefix of the owner is not the owner
        storage.release_lock("master", WORKER_B)
        storage.release_lock("other", "host:1")
        assert call(storage, "lock_release", "master", "1") == 0
        assert not storage.acquire_lock("master", "host", 30)
    assert call(storage, "lock_release", "master", "host:1") == 1
    assert not storage.client.exists(storage.p + "lock:master")
    with unchanged(storage):
        assert call(storage, "lock_release", "master", "host:1") == 0


# -- submit ---------------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["CREATED", "scheduled", "claimed", "RUNNING", "COMPLETED"])
def test_submit_leaves_an_existing_id_byte_for_byte(storage, executor, clock, state):
    submit(executor, "t1", delay_millis=60_000 if state == "scheduled" else 0)
    if state in ("claimed", "RUNNING", "COMPLETED"):
        claim = claim_one(storage)
        if state != "claimed":
            claim = storage.start(claim, LEASE)
        if state == "COMPLETED":
            storage.complete(claim, {"done": True})
    clock.advance(5)
    dumped = storage.client.dump(storage.p + "t:t1")
    with unchanged(storage):
        again = executor.submit(
            "demo.always_fails",
            {"other": 1},
            task_id="t1",
            queue="elsewhere",
            priority=9,
            max_duration_millis=5,
        )
    assert storage.client.dump(storage.p + "t:t1") == dumped
    assert (again.task_name, again.queue) == ("demo.echo", "default")
    assert_consistent(storage)


# -- the indexes stay consistent through any mix of transitions -----------------------------
QUEUES = ("default", "other")
# Walks that submit batches too (their members indexed and counted, finished ones purged).
BATCH_WALKS = [(seed, True) for seed in (11, 12, 13)]


@pytest.mark.parametrize(
    ("seed", "batches"), [(1, False), (2, False), (3, False), (4, False), (5, False)] + BATCH_WALKS
)
def test_random_walk_keeps_the_indexes_consistent(storage, executor, clock, seed, batches):
    """Submit, claim, start, complete, fail, cancel, retry, release, recover... at random, with
    clock jumps; every claim ever handed out stays in play, so most late calls are stale.
    After every step the indexes must be consistent, and a refused call must change nothing."""
    rng = random.Random(seed)
    ids: list[str] = []
    claims: list[Claim] = []  # every claim handed out
    started: list[Claim] = []  # every claim start accepted
    seen: set[str] = set()
    refusals = Counter[str]()
    batches_finished: set[str] = set()
    batches_purged: list[int] = []

    def pick(items: list[Any]) -> Any:
        return rng.choice(items) if items else None

    # Each step returns True when its call was refused (then nothing may have changed).
    def do_submit() -> bool:
        if ids and rng.random() < 0.1:  # an id used before: refused unless purged meanwhile
            task_id = pick(ids)
            existed = storage.get(task_id) is not None
            submit(executor, task_id)
            return existed
        task_id = f"w{len(ids)}"
        ids.append(task_id)
        submit(
            executor,
            task_id,
            queue=rng.choice(QUEUES),
            priority=rng.choice((0, 0, 5)),
            delay_millis=rng.choice((0, 0, 0, 20_000)),
            retry_limit=rng.randint(0, 2),
            retry_interval=rng.choice((0, 10_000)),
            max_duration_millis=rng.choice((None, None, 120_000)),
        )
        return False

    def do_submit_batch() -> bool:
        # A few new members (the batch's index and counters follow them through every step).
        first = len(ids)
        ids.extend(f"w{first + n}" for n in range(rng.randint(1, 2)))
        requests = [
            TaskSubmitRequest("demo.echo", None, task_id=task_id, queue=rng.choice(QUEUES))
            for task_id in ids[first:]
        ]
        executor.submit_batch(requests, batch_id=f"b{first}")
        return False

    def do_claim() -> bool:
        worker = rng.choice((WORKER_A, WORKER_B))
        queues = rng.sample(QUEUES, k=rng.randint(1, 2))
        claims.extend(storage.claim(worker, queues, rng.randint(1, 3), LEASE))
        return False

    def do_start() -> bool:
        claim = pick(claims)
        if claim is None:
            return False
        result = storage.start(claim, LEASE)
        if result is not None:
            started.append(result)
        return result is None

    def do_complete() -> bool:
        claim = pick(started)
        return claim is not None and storage.complete(claim, {"ok": 1}) is None

    def do_fail() -> bool:
        claim = pick(started)
        return claim is not None and (
            storage.fail(claim, "boom", retryable=rng.random() < 0.7, is_error=rng.random() < 0.1)
            is None
        )

    def do_release() -> bool:
        chosen = rng.sample(claims, k=min(len(claims), rng.randint(1, 3)))
        return bool(chosen) and storage.release(chosen) == 0

    def do_expire_claim() -> bool:
        claim = pick(claims)
        return claim is not None and storage.expire_claim(claim) is None

    def do_heartbeat() -> bool:
        chosen = rng.sample(ids, k=min(len(ids), 3))
        latest = {claim.task_id: claim.token for claim in claims}  # or a stale/made-up one
        tokens = {t: latest.get(t, 1) if rng.random() < 0.8 else 1 for t in chosen}
        return (
            bool(chosen)
            and storage.heartbeat(rng.choice((WORKER_A, WORKER_B)), tokens, LEASE) == {}
        )

    def do_cancel() -> bool:
        return bool(ids) and not storage.cancel(pick(ids)).changed

    def do_retry() -> bool:
        if not ids:
            return False
        try:
            return storage.retry(pick(ids)) is None
        except AttemptStillRunningError:  # a timed-out handler still holds its lease
            return True

    def do_chores() -> bool:
        storage.recover_expired(50)
        storage.expire_overdue(50)
        storage.promote_due(50)
        storage.purge_finished(clock.now() - dt.timedelta(seconds=120), 50)
        batches_purged.append(storage.purge_batches(clock.now() - dt.timedelta(seconds=100), 50))
        return False

    def do_advance() -> bool:
        clock.advance(rng.choice((0.5, 5, 15, LEASE + 1, 61)))
        return False

    steps: dict[Callable[[], bool], int] = {
        do_submit: 11 if batches else 14,
        do_claim: 12,
        do_start: 12,
        do_complete: 7,
        do_fail: 7,
        do_release: 4,
        do_expire_claim: 3,
        do_heartbeat: 6,
        do_cancel: 5,
        do_retry: 5,
        do_chores: 6,
        do_advance: 10,
        do_submit_batch: 3 if batches else 0,  # last: without it, the walks of old stay the same
    }
    before = snapshot(storage)
    for step in range(300):
        [action] = rng.choices(list(steps), weights=list(steps.values()))
        refused = action()
        after = snapshot(storage)
        where = f"seed {seed}, step {step}, {action.__name__}"
        if refused:
            refusals[action.__name__] += 1
            assert after == before, f"{where}: refused, yet Redis changed"
        assert index_problems(storage, after) == [], where
        seen.update(v["s"] for key, (_, v) in after.items() if key.startswith("t:"))
        batches_finished |= {b for b, _ in after.get("batches:finished", ("zset", []))[1]}
        before = after
    # The walk went through the states and the lost races it is meant to cover.
    assert (bool(batches_finished), sum(batches_purged) > 0) == (batches, batches)
    assert {"CREATED", "PENDING", "RUNNING", "COMPLETED"} <= seen
    assert len(seen & {"FAILED", "TIMEOUT", "CANCELLED", "ERROR"}) >= 2
    assert refusals["do_start"] and refusals["do_complete"] + refusals["do_fail"]


def test_listing_a_large_backlog_reads_only_the_newest_arrivals(
    storage, executor, clock, monkeypatch
):
    from django_reliable_executor.storage.redis import listing

    monkeypatch.setattr(listing, "EXACT_UNFINISHED", 5)
    for i in range(30):
        submit(executor, f"q-{i:02d}", queue="big" if i % 2 else "default")
        clock.advance(0.001)
    newest = [f"q-{i:02d}" for i in range(29, -1, -1)]
    assert [t.task_id for t in storage.list(limit=4)] == newest[:4]
    assert [t.task_id for t in storage.list(limit=4, offset=4)] == newest[4:8]
    assert [t.task_id for t in storage.list(queue="big", limit=3)] == newest[0:6:2]
    assert [t.task_id for t in storage.list(status=TaskStatus.CREATED, limit=2)] == newest[:2]
