"""``max_concurrency_per_key``: a cap on the tasks of one name and one ``concurrency_key`` held
(claimed, started or not) at once across every worker, each key on its own, enforced by the
storage at claim time on all four backends (real servers, real connections, no mocks)."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter

import pytest

from django_reliable_executor import TaskStatus, reliable_task_handler
from django_reliable_executor.core.queries import KeyUse
from django_reliable_executor.core.rate_limits import parse_rate_limit
from django_reliable_executor.core.records import Claim
from django_reliable_executor.exceptions import HandlerRegistrationError, InvalidTaskOptionError
from django_reliable_executor.models import ReliableParkedKey, ReliableTask
from django_reliable_executor.registry import (
    get_handler,
    key_limits,
    limited_names,
    register,
    unregister,
)
from django_reliable_executor.storage.base import TaskStorage
from django_reliable_executor.storage.database.key_parking import parked_lane
from tests.conftest import DB_ALIASES, db_params
from tests.integration.flow_control.test_max_concurrency import consistent
from tests.support.contract_support import LEASE, at_once, new_task

KEYED = "demo.keyed"  # registered with max_concurrency_per_key=2
keyed_handler = get_handler(KEYED)
OTHER = "demo.noop"


def claim(
    storage: TaskStorage,
    worker: str = "w1",
    limit: int = 20,
    *,
    cap: int = 2,
    name_cap: int | None = None,
    queues: tuple[str, ...] = ("default",),
) -> list[Claim]:
    claims = storage.claim(
        worker,
        list(queues),
        limit,
        LEASE,
        key_limits={KEYED: cap},
        name_limits={KEYED: name_cap} if name_cap else None,
    )
    consistent(storage)
    return claims


def keys(claims: list[Claim]) -> list[str | None]:
    return [c.task.concurrency_key for c in claims]


def submit(executor, clock, key: str | None, n: int = 1, **options) -> list[str]:
    ids = []
    for _ in range(n):
        ids.append(executor.submit(KEYED, {}, concurrency_key=key, **options).task_id)
        clock.advance(0.001)  # distinct run_at: the claim order is exact
    return ids


def finish(storage: TaskStorage, one: Claim) -> None:
    started = storage.start(one, LEASE)
    assert started is not None and storage.complete(started, None) is not None


# -- the decorator and the submit ----------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2"])
def test_a_bad_max_concurrency_per_key_is_refused(value):
    with pytest.raises(HandlerRegistrationError) as excinfo:

        @reliable_task_handler(name="tests.bad_key_cap", max_concurrency_per_key=value)
        def bad() -> None: ...

    assert "max_concurrency_per_key must be an integer >= 1" in str(excinfo.value)
    assert get_handler("tests.bad_key_cap") is None


def test_max_concurrency_per_key_is_listed_and_limits_the_name():
    @reliable_task_handler(name="tests.keyed_three", max_concurrency_per_key=3)
    def keyed_three() -> None: ...

    try:
        assert keyed_three.max_concurrency_per_key == 3
        assert key_limits()["tests.keyed_three"] == 3
        assert "tests.keyed_three" in limited_names()
    finally:
        unregister("tests.keyed_three")


@pytest.mark.parametrize("key", ["", 7, "x" * 192, "a\x00b"])
def test_a_bad_concurrency_key_is_refused_and_stores_nothing(executor, key):
    with pytest.raises(InvalidTaskOptionError) as excinfo:
        executor.submit(KEYED, {}, concurrency_key=key)
    assert excinfo.value.field == "concurrency_key"
    assert "concurrency_key" in str(excinfo.value)
    assert executor.list_tasks() == []


def test_the_key_is_stored_and_read_back(executor):
    task = executor.submit(KEYED, {}, concurrency_key="customer:42")
    assert task.concurrency_key == "customer:42"
    assert executor.get_task(task.task_id).concurrency_key == "customer:42"
    assert executor.submit(KEYED, {}).concurrency_key is None


# -- the storage contract ------------------------------------------------------------------


def test_each_key_has_its_own_cap_and_tasks_without_a_key_have_none(executor, storage, clock):
    a = submit(executor, clock, "a", 4)
    b = submit(executor, clock, "b", 3)
    plain = submit(executor, clock, None, 3)
    first = claim(storage)
    assert [c.task_id for c in first] == a[:2] + b[:2] + plain
    assert claim(storage, "w2") == []
    # a slot of "a" frees: the next task of "a", in order, and nothing of "b"
    finish(storage, first[0])
    assert [c.task_id for c in claim(storage, "w2")] == [a[2]]
    assert claim(storage) == []
    # "b" frees both: its last task only (it has no more)
    finish(storage, first[2])
    finish(storage, first[3])
    assert [c.task_id for c in claim(storage, "w3")] == [b[2]]
    # released unstarted: its slot frees, and it is first in line again
    again = claim(storage)
    assert again == []
    held_a = [c for c in first if c.task_id == a[1]]
    assert storage.release(held_a) == 1
    assert [c.task_id for c in claim(storage, "w4")] == [a[1]]
    assert claim(storage) == []


def test_a_key_over_its_cap_does_not_hold_up_other_keys_or_names(executor, storage, clock):
    """A hundred due tasks of one key, older and of higher priority, do not hold up the other
    keys and names behind them; claims after the first still take the others at once."""
    busy = submit(executor, clock, "busy", 100, priority=5)
    late = submit(executor, clock, "late")
    other = executor.submit(OTHER, None).task_id
    first = storage.claim("w1", ["default"], 10, LEASE, key_limits={KEYED: 2})
    assert {c.task_id for c in first} == {*busy[:2], *late, other}
    assert [c.task_id for c in first[:2]] == busy[:2]
    for round_ in range(3):
        more = submit(executor, clock, f"k{round_}")
        assert [c.task_id for c in claim(storage, "w2")] == more
    # The busy key's slot frees: its next task, in order, is taken.
    finish(storage, first[0])
    assert [c.task_id for c in claim(storage, "w3")] == [busy[2]]
    listed = executor.list_tasks(status=TaskStatus.CREATED, task_name=KEYED, limit=200)
    assert len([t for t in listed if t.worker_id is None]) == 97  # waiting, nobody's


def test_tasks_behind_a_long_new_backlog_of_a_full_key_are_found_claims_apart(
    executor, storage, clock
):
    """2 500 tasks of one key (cap 1), then 3 of another: a claim parks a bounded number of
    the backlog (1 000 a walk), so a few claims in a row reach the others, none idle."""
    now = clock.now()
    backlog = [
        dataclasses.replace(new_task(f"big-{i:04d}", KEYED, {}, now), concurrency_key="big")
        for i in range(2500)
    ]
    storage.enqueue(backlog)
    clock.advance(1)
    small = submit(executor, clock, "small", 3)
    found: list[str] = []
    for _ in range(4):
        found += [c.task_id for c in claim(storage, cap=1) if c.task.concurrency_key == "small"]
        if found:
            break
    assert found == small[:1]


def test_priorities_come_first_within_a_key(executor, storage, clock):
    low = submit(executor, clock, "a", 3)
    held = claim(storage)
    assert [c.task_id for c in held] == low[:2]
    assert claim(storage) == []  # low[2] waits behind the cap
    high = submit(executor, clock, "a", 1, priority=9)
    finish(storage, held[0])
    assert [c.task_id for c in claim(storage)] == high
    finish(storage, held[1])
    assert [c.task_id for c in claim(storage)] == [low[2]]


def test_the_name_cap_and_the_key_cap_both_hold(executor, storage, clock):
    a = submit(executor, clock, "a", 3)
    b = submit(executor, clock, "b", 3)
    plain = submit(executor, clock, None, 2)
    first = claim(storage, name_cap=3)
    assert [c.task_id for c in first] == [*a[:2], b[0]]  # a[2] over its key's cap
    assert claim(storage, "w2", name_cap=3) == []  # the name's cap
    finish(storage, first[0])  # a slot of the name and of "a": a[2] is the oldest due
    assert [c.task_id for c in claim(storage, "w2", name_cap=3)] == [a[2]]
    finish(storage, first[1])
    finish(storage, first[2])
    # held: a[2]; two slots of the name, "b" is free again
    assert [c.task_id for c in claim(storage, "w3", name_cap=3)] == b[1:]
    assert [c.task_id for c in claim(storage, "w3", name_cap=5)] == plain


def test_the_rate_limit_and_the_key_cap_both_hold(executor, storage, clock):
    a = submit(executor, clock, "a", 3)
    b = submit(executor, clock, "b", 3)
    three_a_minute = parse_rate_limit("3/m")

    def claim_rated(worker: str) -> list[Claim]:
        claims = storage.claim(
            worker,
            ["default"],
            20,
            LEASE,
            key_limits={KEYED: 2},
            rate_limits={KEYED: three_a_minute},
            start=20,
        )
        consistent(storage)
        return claims

    first = claim_rated("w1")
    assert [c.task_id for c in first] == [*a[:2], b[0]]  # a[2] over its key's cap
    for one in first:
        started = one if one.is_started else storage.start(one, LEASE)
        assert started is not None and storage.complete(started, None) is not None
    assert claim_rated("w2") == []  # three claims this minute: the rate limit
    clock.advance(three_a_minute.log_window_seconds + three_a_minute.lead_seconds + 1)
    # (Held back by the rate limit to one time, they come back in no exact order on Redis:
    # docs/flow-control.md, rate limits.)
    assert {c.task_id for c in claim_rated("w2")} == {a[2], *b[1:]}


def test_a_generous_rate_limit_still_keeps_the_key_cap(executor, storage, clock):
    """A rate limit far above its use takes its tasks without reading its window's keys (on
    SQLite without a transaction): the key cap still holds."""
    a = submit(executor, clock, "a", 4)
    claims = storage.claim(
        "w1",
        ["default"],
        20,
        LEASE,
        key_limits={KEYED: 1},
        rate_limits={KEYED: parse_rate_limit("1000/s")},
        start=20,
    )
    consistent(storage)
    assert [c.task_id for c in claims] == a[:1]


def test_a_parked_task_cancelled_then_retried_is_claimed_again(executor, storage, clock):
    """A task that ended while it waited at its key's cap, retried by hand once its key had
    nothing else waiting, waits where the claim reads it."""
    first, second = submit(executor, clock, "a", 2)
    [held] = claim(storage, cap=1)
    assert held.task_id == first
    assert claim(storage, cap=1) == []  # ``second`` waits at the cap
    assert executor.cancel_task(second) is True
    finish(storage, held)
    # A claim of the name while nothing of "a" waits: the storage may forget a's parked tasks.
    other = submit(executor, clock, "b")
    assert [c.task_id for c in claim(storage, cap=1)] == other
    assert executor.retry_task(second) is True
    assert [c.task_id for c in claim(storage, cap=1)] == [second]


def test_a_paused_queue_keeps_its_keyed_tasks(executor, storage, clock):
    submit(executor, clock, "a", 3, queue="paused")
    executor.pause_queue("paused")
    assert claim(storage, queues=("paused", "default")) == []
    executor.resume_queue("paused")
    assert keys(claim(storage, queues=("paused", "default"))) == ["a", "a"]


def test_a_task_waiting_over_its_keys_cap_can_be_cancelled(executor, storage, clock):
    ids = submit(executor, clock, "a", 4)
    held = claim(storage)
    assert [c.task_id for c in held] == ids[:2]
    assert claim(storage) == []  # ids[2:] wait, out of the claim's way
    assert executor.cancel_task(ids[2]) is True
    assert executor.get_task(ids[2]).status is TaskStatus.CANCELLED
    consistent(storage)
    finish(storage, held[0])
    assert [c.task_id for c in claim(storage)] == [ids[3]]
    finish(storage, held[1])
    assert claim(storage) == []


def test_a_task_let_out_by_a_freed_slot_and_cancelled_passes_the_slot_on(executor, storage, clock):
    ids = submit(executor, clock, "a", 3)
    [first] = claim(storage, cap=1)
    assert first.task_id == ids[0]
    assert claim(storage, cap=1) == []  # ids[1:] wait behind the cap
    finish(storage, first)
    assert executor.cancel_task(ids[1]) is True
    assert [c.task_id for c in claim(storage, cap=1)] == [ids[2]]


def test_a_timed_out_handler_still_running_holds_its_keys_slot(executor, storage, clock):
    """docs/guarantees.md, "ended": a TIMEOUT whose handler runs on still holds the slot."""
    ids = submit(executor, clock, "a", 3, max_duration_millis=1000)
    held = claim(storage)
    running = storage.start(held[0], LEASE)
    assert running is not None
    finish(storage, held[1])
    assert [c.task_id for c in claim(storage)] == [ids[2]]
    clock.advance(2)
    assert len(storage.expire_overdue(100)) == 2
    assert executor.get_task(ids[0]).status is TaskStatus.TIMEOUT
    assert executor.get_task(ids[0]).handler_running
    assert executor.get_task(ids[2]).status is TaskStatus.TIMEOUT  # claimed, overdue too
    more = submit(executor, clock, "a", 2)
    # ids[0] still runs: one slot of "a" is held by it; ids[2]'s claim was let go.
    assert [c.task_id for c in claim(storage)] == more[:1]
    assert storage.handler_returned([running]) == 1
    assert [c.task_id for c in claim(storage)] == more[1:]


def test_key_use_counts_the_held_tasks_by_key(executor, storage, clock):
    submit(executor, clock, "a", 3)
    submit(executor, clock, "b", 1)
    submit(executor, clock, "c", 2)
    submit(executor, clock, None, 1)
    held = claim(storage)
    assert len(held) == 6
    assert storage.key_use({KEYED: 2}) == [KeyUse(KEYED, 2, 5, 3, (("a", 2), ("c", 2), ("b", 1)))]
    for one in held:
        finish(storage, one)
    assert storage.key_use({KEYED: 2}) == [KeyUse(KEYED, 2, 0, 0, ())]
    assert storage.key_use({}) == []


def test_concurrent_claims_never_exceed_a_keys_cap(executor, make_storage, clock):
    """Workers with their own connections claim and finish at once: never more than the cap of
    a key are held, and every task is run."""
    cap, per_key, key_names, threads_n = 2, 8, ("a", "b", "c"), 6
    for i in range(per_key):
        for key in key_names:
            executor.submit(KEYED, {"i": i}, concurrency_key=key)
    total = per_key * len(key_names)
    lock = threading.Lock()
    held = {key: 0 for key in key_names}
    peak = {key: 0 for key in key_names}
    done = [0]
    storages = [make_storage(clock) for _ in range(threads_n)]

    def work(storage: TaskStorage, worker: str) -> None:
        idle = 0
        while idle < 200:
            with lock:
                if done[0] >= total:
                    return
            claims = storage.claim(worker, ["default"], 4, LEASE, key_limits={KEYED: cap})
            if not claims:
                idle += 1
                continue
            with lock:
                for one in claims:
                    key = one.task.concurrency_key
                    held[key] += 1
                    peak[key] = max(peak[key], held[key])
            for one in claims:
                with lock:
                    held[one.task.concurrency_key] -= 1  # before the write
                finish(storage, one)
                with lock:
                    done[0] += 1

    at_once(storages, work)
    assert done[0] == total
    assert all(1 <= p <= cap for p in peak.values()), peak
    assert executor.count_by_status()[TaskStatus.COMPLETED] == total
    consistent(storages[0])


# -- the database storage's parking (key_parking.py) ---------------------------------------


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_full_keys_backlog_is_parked_once_and_brought_back_slot_by_slot(
    alias, executor, storage, clock
):
    """The first claim that finds a key full moves its waiting tasks out of the name's range
    of the claim index; later claims do not read them; each freed slot brings one back."""
    busy = submit(executor, clock, "busy", 300)
    lane = parked_lane(KEYED, "busy", "default")

    def lanes() -> Counter[str]:
        waiting = ReliableTask.objects.using(alias).filter(task_name=KEYED, available=True)
        return Counter(waiting.values_list("limited_name", flat=True))

    first = claim(storage)
    assert [c.task_id for c in first] == busy[:2]
    assert lanes() == {lane: 298}
    parked = ReliableParkedKey.objects.using(alias).values_list("name", "key")
    assert list(parked) == [(KEYED, "busy")]
    fresh = submit(executor, clock, "fresh")
    assert [c.task_id for c in claim(storage)] == fresh
    finish(storage, first[0])
    assert [c.task_id for c in claim(storage)] == busy[2:3]
    assert lanes() == {lane: 297}
    # The name loses its per-key cap: the chores put its parked tasks back in its range.
    unregister(KEYED)
    try:
        storage.mark_limited(limited_names(), 1000)
        assert lanes() == {"": 297}
        assert not ReliableParkedKey.objects.using(alias).exists()
    finally:
        register(keyed_handler)
