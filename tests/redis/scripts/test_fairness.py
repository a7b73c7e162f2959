"""fairness="round_robin" on Redis: each task of a fair name gets a round when stored, numbered
as core/fairness.py says, and waits due in a fair set of its name, queue and priority scored by
that round (lua/_common.lua's fair_push); claims take one task of each key before the second of
any, after the higher priorities, under every cap and limit; a task keeps its round for life,
and nothing of it stays in the fair indexes once it is claimed, cancelled, expired or purged.

demo.fair (testproject/demo/tasks.py) is fair with no limit; caps and rate limits are the
claim's own arguments here, as a worker passes its handlers' (tests/redis/scripts/conftest.py:
the storage is told the registry's fair names)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random

import pytest

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.fairness import number_rounds
from django_reliable_executor.core.rate_limits import RateLimit
from django_reliable_executor.core.records import Claim
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.master.schedule_firing import ScheduleFiring, fire_task
from django_reliable_executor.schedules.records import ScheduleFire
from tests.redis.fair_support import assert_fair_consistent
from tests.support.redis_support import LEASE

FAIR = "demo.fair"
QUEUE = "default"
FAIR_KEYS = ("fready:", "fnames:", "fprio:", "fparked:")


def submit(executor, key: str, count: int = 1, **options):
    """``count`` tasks of demo.fair with concurrency key ``key``, ids ``<key>-<n>``, a
    millisecond after the call before (a call's tasks are stamped a microsecond apart, the
    last at the call's time: at one frozen instant a later call's first would be older)."""
    executor.clock.advance(0.001)
    requests = [
        TaskSubmitRequest(
            FAIR, {"n": n}, task_id=f"{key or '_'}-{n:03}", concurrency_key=key or None, **options
        )
        for n in range(count)
    ]
    return executor.submit_many(requests)


def claimed(storage, limit: int = 100, **limits) -> list[str]:
    """The ids of the tasks one claim takes, in the order it takes them."""
    return [c.task_id for c in storage.claim("w1", [QUEUE], limit, LEASE, **limits)]


def one_by_one(storage, count: int, **limits) -> list[str]:
    return [task_id for _ in range(count) for task_id in claimed(storage, 1, **limits)]


def home(storage) -> str:
    """The key prefix of demo.fair's tasks: its home shard's (TEST_REDIS_SHARDS may be set)."""
    return storage.prefixes[storage._store_shard(FAIR, QUEUE)]


def round_of(storage, task_id: str) -> int:
    return int(storage.client.hget(home(storage) + "t:" + task_id, "fr"))


def next_rounds(storage, name: str = FAIR, queue: str = QUEUE, priority: int = 0) -> dict[str, int]:
    """Each key's next round in ``name``, ``queue`` and ``priority`` (``fround``)."""
    rounds = f"fround:{len(name)}:{name}:{queue}:{priority}"
    found = storage.client.zrange(home(storage) + rounds, 0, -1, withscores=True)
    return {key: int(score) for key, score in found}


def fair_keys(storage) -> list[str]:
    """The fair indexes' keys of every shard (fround aside: its one entry stays)."""
    return sorted(
        key
        for prefix in storage.prefixes
        for key in storage.client.scan_iter(match=prefix + "f*", count=10_000)
        if key[len(prefix) :].startswith(FAIR_KEYS)
    )


def finish(storage, task_ids) -> None:
    """Start and complete these claimed tasks (a worker's part), from what they hold now."""
    for task_id in task_ids:
        token = int(storage.client.hget(home(storage) + "t:" + task_id, "k"))
        task, shard = storage.get(task_id), storage._store_shard(FAIR, QUEUE)
        claim = Claim(task=task, token=token, budget_attempts=0, deadline_at=None, shard=shard)
        started = storage.start(claim, LEASE)
        assert started is not None and storage.complete(started, None) is not None


def test_a_backlog_of_one_key_takes_turns_with_the_keys_after_it(executor, storage):
    submit(executor, "A", 50)
    submit(executor, "B", 3)
    submit(executor, "C", 3)
    assert [round_of(storage, f"A-{n:03}") for n in range(50)] == list(range(50))
    # B and C join the round being served (0), not the end of A's backlog.
    assert [round_of(storage, f"{k}-{n:03}") for k in "BC" for n in range(3)] == [0, 1, 2] * 2
    assert one_by_one(storage, 12) == [
        *("A-000", "B-000", "C-000", "A-001", "B-001", "C-001", "A-002", "B-002", "C-002"),
        *("A-003", "A-004", "A-005"),
    ]
    assert_fair_consistent(storage)
    # One claim of many takes them in the same order.
    submit(executor, "D", 2)  # round 6, where A is
    assert claimed(storage, 4) == ["A-006", "D-000", "A-007", "D-001"]
    assert_fair_consistent(storage)


def test_within_a_round_the_oldest_goes_first(executor, storage, clock):
    submit(executor, "Z", 2)  # older than A's, though after them by id
    clock.advance(1)
    submit(executor, "A", 2)
    assert claimed(storage) == ["Z-000", "A-000", "Z-001", "A-001"]


def test_a_claim_takes_no_more_fair_tasks_than_its_fair_limit(executor, storage, clock):
    submit(executor, "A", 4)
    submit(executor, "B", 1)
    clock.advance(1)
    plain = executor.submit("demo.echo", "plain")
    assert claimed(storage, fair_limit=0) == [plain.task_id]  # other names fill the claim
    assert claimed(storage, fair_limit=2) == ["A-000", "B-000"]
    # Under a cap: the tasks parked at it count only once taken, from their parked set too.
    caps = {"name_limits": {FAIR: 2}}
    assert claimed(storage, fair_limit=1, **caps) == []  # parked
    finish(storage, ["A-000", "B-000"])
    assert claimed(storage, fair_limit=1, **caps) == ["A-001"]
    assert claimed(storage, fair_limit=5, **caps) == ["A-002"]
    assert_fair_consistent(storage)


def test_rounds_are_numbered_as_core_fairness_says(executor, storage):
    submit(executor, "A", 5)
    assert claimed(storage, 2) == ["A-000", "A-001"]  # the name's claims are at round 2
    keys = ["B", "A", "B", "", "C", ""]
    expected, _ = number_rounds(keys, {"A": 5}, 2)
    stored = executor.submit_many(
        [
            TaskSubmitRequest(FAIR, n, task_id=f"mix-{n}", concurrency_key=key or None)
            for n, key in enumerate(keys)
        ]
    )
    assert [round_of(storage, t.task_id) for t in stored] == expected == [2, 5, 3, 2, 2, 3]
    # The rate key stands for a task without a concurrency key.
    rated = executor.submit(FAIR, None, rate_key="C")
    assert round_of(storage, rated.task_id) == 3
    assert_fair_consistent(storage)


def test_priorities_come_first_then_the_earlier_due_head(executor, storage, clock):
    plain = executor.submit("demo.echo", "plain")  # older than every fair task
    clock.advance(1)
    submit(executor, "A", 3)
    submit(executor, "B", 2, priority=5)
    assert claimed(storage) == ["B-000", "B-001", plain.task_id, "A-000", "A-001", "A-002"]
    assert_fair_consistent(storage)


def test_a_key_idle_for_a_while_joins_the_round_being_served(executor, storage):
    submit(executor, "A", 10)
    assert len(claimed(storage, 5)) == 5
    submit(executor, "B", 2)
    assert [round_of(storage, "B-000"), round_of(storage, "B-001")] == [5, 6]
    assert one_by_one(storage, 4) == ["A-005", "B-000", "A-006", "B-001"]


def test_a_burst_after_the_backlog_drained_starts_after_the_rounds_handed_out(
    executor, storage, clock
):
    submit(executor, "A", 3)
    submit(executor, "B", 2, delay_millis=10_000)  # rounds 0 and 1, not due yet
    assert claimed(storage) == ["A-000", "A-001", "A-002"]
    assert fair_keys(storage) == []  # nothing due: no fair set left
    submit(executor, "C", 1)
    assert round_of(storage, "C-000") == 3  # after A's rounds, not from 0 again
    clock.advance(10)
    assert claimed(storage) == ["B-000", "B-001", "C-000"]  # the delayed ones kept theirs
    assert_fair_consistent(storage)


def test_the_next_rounds_of_keys_behind_the_name_are_dropped(executor, storage):
    submit(executor, "A", 3)
    submit(executor, "B", 1)
    submit(executor, "C", 1)
    assert next_rounds(storage) == {"A": 3, "B": 1, "C": 1}
    assert claimed(storage, 4) == ["A-000", "B-000", "C-000", "A-001"]
    submit(executor, "D", 1)  # the name is at round 2: B's and C's next rounds say no more
    assert next_rounds(storage) == {"A": 3, "D": 3}
    assert claimed(storage) == ["A-002", "D-000"]
    submit(executor, "E", 1)  # nothing due: only the highest next round stays
    assert next_rounds(storage) in ({"A": 3, "E": 4}, {"D": 3, "E": 4})
    claimed(storage)
    assert fair_keys(storage) == []
    assert_fair_consistent(storage)


def test_a_cancelled_or_expired_ready_task_and_its_purge_leave_nothing_behind(
    executor, storage, clock
):
    submit(executor, "A", 2)
    submit(executor, "B", 1, max_duration_millis=1000)
    assert executor.cancel_task("A-000") and executor.cancel_task("A-001")
    assert_fair_consistent(storage)
    clock.advance(2)
    assert [t.task.task_id for t in storage.expire_overdue(10)] == ["B-000"]
    assert executor.get_task("B-000").status is TaskStatus.TIMEOUT
    assert fair_keys(storage) == []
    assert_fair_consistent(storage)
    clock.advance(1)
    assert executor.purge_finished(clock.now()) == 3
    assert fair_keys(storage) == []
    assert storage._queues() == []  # the queue is forgotten
    assert_fair_consistent(storage)


def test_a_task_keeps_its_round_through_retries_and_hand_backs(executor, storage):
    submit(executor, "A", 3, retry_limit=3, retry_interval=0)
    submit(executor, "B", 3)
    [first, second] = storage.claim("w1", [QUEUE], 2, LEASE, start=1)
    assert [first.task_id, second.task_id] == ["A-000", "B-000"]
    storage.fail(first, "boom", retryable=True)  # due again at once, in round 0
    assert storage.release([second]) == 1  # handed back: round 0 too
    got = claimed(storage, 4)  # round 0 (A-000 due again at once, B-000 due since its submit)
    assert (sorted(got[:2]), got[2:]) == (["A-000", "B-000"], ["A-001", "B-001"])
    # A manual retry of a failed task: its round again.
    submit(executor, "C", 1, retry_limit=0)
    assert round_of(storage, "C-000") == 2  # where A and B are
    [claim] = [c for c in storage.claim("w1", [QUEUE], 10, LEASE, start=10) if c.task_id == "C-000"]
    storage.fail(claim, "boom", retryable=False)
    assert executor.retry_task("C-000")
    assert round_of(storage, "C-000") == 2
    assert claimed(storage, 1) == ["C-000"]
    assert_fair_consistent(storage)


def test_under_max_concurrency_parked_tasks_keep_round_order(executor, storage, clock):
    caps = {"name_limits": {FAIR: 2}}
    submit(executor, "A", 4)
    submit(executor, "B", 2)
    submit(executor, "C", 2)
    assert claimed(storage, **caps) == ["A-000", "B-000"]  # the rest parked, by round
    parked = storage.client.zrange(home(storage) + f"parked:{FAIR}:0", 0, -1, withscores=True)
    assert parked == [
        ("C-000", 0),
        ("A-001", 1),
        ("B-001", 1),
        ("C-001", 1),
        ("A-002", 2),
        ("A-003", 3),
    ]
    assert_fair_consistent(storage)
    clock.advance(1)
    submit(executor, "D", 1)  # joins round 0: where the name's parked tasks are
    assert round_of(storage, "D-000") == 0  # (due after C-000: taken after it)
    finish(storage, ["A-000"])
    assert claimed(storage, **caps) == ["C-000"]
    finish(storage, ["B-000", "C-000"])
    assert claimed(storage, **caps) == ["D-000", "A-001"]
    assert_fair_consistent(storage)


def test_under_max_concurrency_per_key_a_key_s_slot_goes_to_its_next_round(executor, storage):
    keys = {"key_limits": {FAIR: 1}}
    submit(executor, "A", 3)
    submit(executor, "B", 2)
    assert claimed(storage, **keys) == ["A-000", "B-000"]
    bucket = f"{len(FAIR)}:{FAIR}:A"
    kparked = home(storage) + f"kparked:{bucket}:0"
    assert storage.client.zrange(kparked, 0, -1, withscores=True) == [
        ("A-001", 1),
        ("A-002", 2),
    ]
    assert_fair_consistent(storage)
    submit(executor, "C", 2)  # its first task takes the free key's turn at once
    assert claimed(storage, **keys) == ["C-000"]
    finish(storage, ["A-000", "B-000"])  # their keys' next tasks come back, in round order
    assert claimed(storage, **keys) == ["A-001", "B-001"]
    assert_fair_consistent(storage)


def test_under_a_rate_limit_held_back_tasks_come_back_in_round_order(executor, storage, clock):
    rates = {"rate_limits": {FAIR: RateLimit(1, 1.0)}}
    for key, count in (("A", 3), ("B", 2)):
        executor.submit_many(
            [
                TaskSubmitRequest(FAIR, n, task_id=f"{key}-{n:03}", rate_key=key)
                for n in range(count)
            ]
        )
    assert claimed(storage, **rates) == ["A-000", "B-000"]
    assert round_of(storage, "A-001") == round_of(storage, "B-001") == 1  # kept while held back
    assert_fair_consistent(storage)
    clock.advance(1.1)  # the limit's log window (its window and margin)
    assert claimed(storage, **rates) == ["A-001", "B-001"]
    clock.advance(1.1)
    assert claimed(storage, **rates) == ["A-002"]
    assert_fair_consistent(storage)


def test_a_paused_queue_keeps_its_fair_sets_until_resumed(executor, storage):
    submit(executor, "A", 2)
    submit(executor, "B", 1)
    assert executor.pause_queue(QUEUE)
    assert claimed(storage) == []
    assert fair_keys(storage) != []
    assert executor.resume_queue(QUEUE)
    assert claimed(storage) == ["A-000", "B-000", "A-001"]
    assert_fair_consistent(storage)


def test_a_debounced_task_joined_keeps_its_round(executor, storage, clock):
    submit(executor, "A", 2)
    options = {"debounce": 10, "unique_key": "k", "concurrency_key": "B"}
    first = executor.submit(FAIR, 1, task_id="B-000", **options)
    assert round_of(storage, first.task_id) == 0
    clock.advance(10)
    storage.promote_due(100)  # due: in its fair set
    clock.advance(2)
    joined = executor.submit(FAIR, 2, **options)
    assert (joined.task_id, joined.debounced) == ("B-000", True)
    assert round_of(storage, "B-000") == 0
    assert_fair_consistent(storage)
    assert claimed(storage) == ["A-000", "A-001"]  # popped early: scheduled, not taken
    clock.advance(10)
    assert claimed(storage) == ["B-000"]
    assert_fair_consistent(storage)


def test_a_released_dependent_keeps_its_round(executor, storage):
    submit(executor, "A", 1)
    dependent = executor.submit(
        FAIR, None, task_id="B-000", concurrency_key="B", depends_on=["A-000"]
    )
    assert round_of(storage, dependent.task_id) == 0
    submit(executor, "C", 2)
    [claim] = storage.claim("w1", [QUEUE], 1, LEASE, start=1)
    assert storage.complete(claim, None) is not None  # B-000 released, due in round 0
    got = claimed(storage)  # round 0: B-000 (released now) and C-000 (submitted before)
    assert (sorted(got[:2]), got[2:]) == (["B-000", "C-000"], ["C-001"])
    assert_fair_consistent(storage)


def test_batch_members_and_callbacks_get_rounds(executor, storage):
    requests = [
        TaskSubmitRequest(FAIR, n, task_id=f"A-{n:03}", concurrency_key="A") for n in range(3)
    ]
    on_complete = TaskSubmitRequest(FAIR, "done", task_id="cb", concurrency_key="B")
    executor.submit_batch(requests, on_complete=on_complete)
    assert [round_of(storage, f"A-{n:03}") for n in range(3)] == [0, 1, 2]
    for claim in storage.claim("w1", [QUEUE], 10, LEASE, start=10):
        assert storage.complete(claim, None) is not None
    assert round_of(storage, "cb") == 3  # nothing due: after every round handed out
    assert_fair_consistent(storage)


def test_fair_tasks_are_listed_counted_and_read_as_due(executor, storage, clock):
    oldest = submit(executor, "A", 3)[0]
    clock.advance(5)
    submit(executor, "B", 1)
    assert {t.task_id for t in executor.list_tasks(statuses=[TaskStatus.CREATED])} == {
        "A-000",
        "A-001",
        "A-002",
        "B-000",
    }
    assert executor.count_by_status(QUEUE)[TaskStatus.CREATED] == 4
    assert executor.oldest_due_at(QUEUE) == oldest.run_at < clock.now() - dt.timedelta(seconds=5)
    assert storage.has_work([QUEUE], 0)


def test_schedule_fires_get_rounds_under_the_keyless_key(executor, storage, clock):
    submit(executor, "", 2)  # the keyless tasks' key "": rounds 0 and 1
    executor.schedule("s", FAIR, every=60)
    clock.advance(61)
    assert ScheduleFiring(executor).run_once() is False
    [fired] = [t for t in executor.list_tasks() if t.task_id.startswith("s@")]
    assert round_of(storage, fired.task_id) == 2
    # A fire the master planned itself (fire_schedules): the same.
    info = executor.get_schedule("s")
    task = fire_task(info, info.next_run_at, clock.now())
    after = info.next_run_at + dt.timedelta(minutes=1)
    fire = ScheduleFire("s", info.next_run_at, after, (task,), task.run_at, task.task_id)
    clock.advance(60)
    assert [t.task_id for t in storage.fire_schedules([fire], clock.now())] == [task.task_id]
    assert round_of(storage, task.task_id) == 3
    assert claimed(storage) == ["_-000", "_-001", fired.task_id, task.task_id]
    assert_fair_consistent(storage)


@pytest.mark.parametrize("seed", range(4))
def test_a_random_walk_keeps_the_fair_indexes_consistent(executor, storage, clock, seed):
    """Fair and plain tasks submitted, claimed under caps and limits, started, completed,
    failed, released, cancelled, retried, recovered, expired and purged at random, with clock
    jumps, demo.fair gaining and losing fairness: after every step each task is in the one
    place its status allows, fair sets and their indexes included; at the end nothing of the
    fair sets is left and the next rounds hold at most two entries after a submit."""
    rng = random.Random(seed)
    claims: list[Claim] = []
    ids: list[str] = []
    limits = [
        {},
        {"name_limits": {FAIR: 2}},
        {"key_limits": {FAIR: 1}},
        {"rate_limits": {FAIR: RateLimit(3, 1.0)}},
        {"name_limits": {FAIR: 3}, "key_limits": {FAIR: 1}},
    ]

    def step() -> None:
        action = rng.choice(
            ["submit"] * 4
            + ["claim"] * 3
            + ["debounce", "finish", "release", "cancel", "retry", "time", "fairness"]
        )
        if action == "submit":
            first = len(ids)
            ids.extend(f"r{first + n}" for n in range(rng.randint(1, 4)))
            key = rng.choice(["A", "B", "C", None])
            name = rng.choice([FAIR, FAIR, "demo.echo"])
            executor.submit_many(
                [
                    TaskSubmitRequest(
                        name,
                        None,
                        task_id=task_id,
                        concurrency_key=key,
                        rate_key=rng.choice([None, "R"]),
                        queue=rng.choice([QUEUE, "other"]),
                        priority=rng.choice([0, 0, 5]),
                        delay_millis=rng.choice([0, 0, 0, 3000]),
                        max_duration_millis=rng.choice([None, None, 60_000]),
                        retry_limit=rng.randint(0, 2),
                        retry_interval=rng.choice([0, 2000]),
                    )
                    for task_id in ids[first:]
                ]
            )
        elif action == "debounce":  # joins the key's task while it waits, wherever it waits
            joined = executor.submit(
                FAIR, None, concurrency_key="D", debounce=rng.choice([0.5, 5]), unique_key="d"
            )
            if joined.task_id not in ids:
                ids.append(joined.task_id)
        elif action == "claim":
            claims.extend(
                storage.claim(
                    "w1",
                    [QUEUE, "other"],
                    rng.randint(1, 5),
                    LEASE,
                    start=rng.randint(0, 3),
                    fair_limit=rng.choice([None, None, 0, 1, 3]),
                    **rng.choice(limits),
                )
            )
        elif action == "finish" and claims:
            claim = claims.pop(rng.randrange(len(claims)))
            started = claim
            if claim.task.status is not TaskStatus.RUNNING:  # (a claim may start its tasks)
                started = storage.start(claim, LEASE)
            if started is None:
                pass  # no longer this claim's (cancelled, recovered meanwhile)
            elif rng.random() < 0.5:
                storage.complete(started, None)
            else:
                storage.fail(started, "boom", retryable=True)
        elif action == "release" and claims:
            storage.release([claims.pop(rng.randrange(len(claims)))])
        elif action == "cancel" and ids:
            executor.cancel_task(rng.choice(ids))
        elif action == "retry" and ids:
            executor.retry_task(rng.choice(ids))
        elif action == "fairness":  # demo.fair gains or loses it, as between two deploys
            fair = rng.choice([frozenset({FAIR}), frozenset({FAIR}), frozenset()])
            storage.flow_limits = dataclasses.replace(storage.flow_limits, fair=lambda: fair)
        elif action == "time":
            clock.advance(rng.choice([1, 5, 40, 70]))
            storage.promote_due(1000)
            storage.recover_expired(1000)
            storage.expire_overdue(1000)

    for n in range(250):
        step()
        if n % 5 == 0:
            assert_fair_consistent(storage)
    storage.flow_limits = dataclasses.replace(storage.flow_limits, fair=lambda: {FAIR})
    # Everything ends, is purged: nothing of the fair sets stays, one next round per name.
    for task_id in ids:
        executor.cancel_task(task_id)
    clock.advance(LEASE + 120)
    storage.recover_expired(1000)
    for task_id in ids:
        executor.cancel_task(task_id)
    assert_fair_consistent(storage)
    clock.advance(1)
    executor.purge_finished(clock.now())
    assert executor.count_by_status() == dict.fromkeys(TaskStatus, 0)
    assert fair_keys(storage) == []
    # The first submit after, in each queue and priority: drops all but the highest next round
    for queue in (QUEUE, "other"):
        for priority in (0, 5):
            executor.submit(FAIR, None, concurrency_key="Z", queue=queue, priority=priority)
            assert len(next_rounds(storage, queue=queue, priority=priority)) <= 2
    assert_fair_consistent(storage)
