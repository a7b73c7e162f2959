"""``fairness="round_robin"``: among a name's due tasks, claims take the keys (concurrency_key,
else rate_key) in turn, one task of each key with due work, then the next round; priorities
first. On all four storages (real servers, real connections, no mocks)."""

from __future__ import annotations

import dataclasses

import pytest
from django.db import transaction

from django_reliable_executor import TaskStatus, reliable_task_handler
from django_reliable_executor.core.fairness import number_rounds
from django_reliable_executor.core.rate_limits import parse_rate_limit
from django_reliable_executor.core.records import Claim, TaskSubmitRequest
from django_reliable_executor.exceptions import HandlerRegistrationError, InvalidTaskOptionError
from django_reliable_executor.models import ReliableFairKey
from django_reliable_executor.registry import fair_names, limited_names
from django_reliable_executor.storage.base import TaskStorage
from tests.conftest import DB_ALIASES, db_params
from tests.support.contract_support import LEASE, new_task

FAIR = "demo.fair"  # fairness="round_robin"
UNFAIR = "demo.unfair"  # the same handler without it
FAIR_KEYED = "demo.fair_keyed"  # and max_concurrency_per_key=2, max_concurrency=4
FAIR_RATED = "demo.fair_rated"  # and rate_limit="1000/s"


def submit(executor, clock, key: str | None, n: int = 1, name: str = FAIR, **options) -> list[str]:
    ids = []
    for _ in range(n):
        options.setdefault("concurrency_key", key)
        ids.append(executor.submit(name, {"tenant": key}, **options).task_id)
        clock.advance(0.001)  # distinct run_at: the order within a round is exact
    return ids


def tenants(claims: list[Claim]) -> list[str | None]:
    return [(c.task.parameter or {}).get("tenant") for c in claims]


def claim_one_by_one(storage: TaskStorage, n: int, **limits) -> list[Claim]:
    """``n`` claims of one task each: the order of pickup, one worker slot at a time."""
    claims = []
    for i in range(n):
        claims += storage.claim(f"w{i}", ["default"], 1, LEASE, **limits)
    return claims


# -- the decorator ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["fifo", "", True, 1])
def test_a_bad_fairness_is_refused_naming_it(value):
    with pytest.raises(HandlerRegistrationError) as excinfo:

        @reliable_task_handler(name="tests.bad_fairness", fairness=value)
        def bad() -> None: ...

    assert "fairness" in str(excinfo.value)
    assert "tests.bad_fairness" not in fair_names()


def test_fair_names_are_listed_and_claimed_one_name_at_a_time():
    assert {FAIR, FAIR_KEYED, FAIR_RATED} <= fair_names()
    assert UNFAIR not in fair_names()
    assert FAIR in limited_names()


def test_fairness_is_not_a_submit_option(executor):
    with pytest.raises(InvalidTaskOptionError) as excinfo:
        executor.submit(FAIR, {}, fairness="round_robin")
    assert "fairness" in str(excinfo.value)
    assert executor.list_tasks() == []


# -- the numbering ---------------------------------------------------------------------------


def test_rounds_are_numbered_per_key_from_the_current_round():
    rounds, nexts = number_rounds(["a", "a", "b", "a", ""], {"a": 3}, 5)
    assert rounds == [5, 6, 5, 7, 5]
    assert nexts == {"a": 8, "b": 6, "": 6}
    rounds, _ = number_rounds(["a", "b"], {"a": 9, "b": 2}, 4)
    assert rounds == [9, 4]


# -- the storage contract --------------------------------------------------------------------


def test_claims_take_the_keys_in_turn(executor, storage, clock):
    """A's backlog of 30, then B's and C's 3: one of each key a round, oldest first within the
    round, until B and C have none; without fairness all of A's would go first."""
    submit(executor, clock, "A", 30)
    submit(executor, clock, "B", 3)
    submit(executor, clock, "C", 3)
    order = tenants(claim_one_by_one(storage, 12))
    assert order == ["A", "B", "C"] * 3 + ["A"] * 3


def test_a_batch_claim_takes_the_same_tasks(executor, storage, clock):
    """One claim of 6 takes the tasks of three rounds (a worker starts a batch at once)."""
    submit(executor, clock, "A", 20)
    submit(executor, clock, "B", 2)
    claims = storage.claim("w1", ["default"], 6, LEASE)
    assert sorted(tenants(claims)) == ["A", "A", "A", "A", "B", "B"]


def test_without_fairness_the_oldest_goes_first(executor, storage, clock):
    submit(executor, clock, "A", 10, name=UNFAIR)
    submit(executor, clock, "B", 2, name=UNFAIR)
    assert tenants(claim_one_by_one(storage, 12)) == ["A"] * 10 + ["B"] * 2


def test_a_key_back_from_idle_joins_the_round_being_served(executor, storage, clock):
    """After ten of A's claimed, B's first task shares A's next round: B does not jump ahead
    of A's whole backlog, nor wait behind it."""
    submit(executor, clock, "A", 30)
    assert tenants(claim_one_by_one(storage, 10)) == ["A"] * 10
    submit(executor, clock, "B", 2)
    assert tenants(claim_one_by_one(storage, 6)) == ["A", "B", "A", "B", "A", "A"]


def test_a_new_burst_after_the_backlog_drained_starts_with_the_others(executor, storage, clock):
    """A's 5 all claimed, nothing waits: B's and then A's new tasks start from one round."""
    submit(executor, clock, "A", 5)
    claim_one_by_one(storage, 5)
    submit(executor, clock, "B", 3)
    submit(executor, clock, "A", 3)
    assert tenants(claim_one_by_one(storage, 6)) == ["B", "A"] * 3


def test_priorities_come_first(executor, storage, clock):
    submit(executor, clock, "A", 6)
    urgent = submit(executor, clock, "B", 2, priority=5)
    claims = claim_one_by_one(storage, 4)
    assert [c.task_id for c in claims[:2]] == urgent
    assert tenants(claims[2:]) == ["A", "A"]


def test_tasks_without_a_key_share_one_turn(executor, storage, clock):
    submit(executor, clock, None, 4)
    submit(executor, clock, "B", 2)
    assert tenants(claim_one_by_one(storage, 6)) == [None, "B", None, "B", None, None]


def test_the_rate_key_is_the_key_without_a_concurrency_key(executor, storage, clock):
    for key in ("A",) * 6 + ("B",) * 2:
        executor.submit(FAIR_RATED, {"tenant": key}, rate_key=key)
        clock.advance(0.001)
    rated = {FAIR_RATED: parse_rate_limit("1000/s")}
    claims = claim_one_by_one(storage, 5, rate_limits=rated)
    assert tenants(claims) == ["A", "B", "A", "B", "A"]


def test_round_robin_with_a_cap_per_key_and_on_the_name(executor, storage, clock):
    """demo.fair_keyed: 2 a key, 4 the name. The first claims alternate A and B under both
    caps; as slots free, the keys keep taking turns."""
    submit(executor, clock, "A", 10, name=FAIR_KEYED)
    submit(executor, clock, "B", 10, name=FAIR_KEYED)
    limits = {"key_limits": {FAIR_KEYED: 2}, "name_limits": {FAIR_KEYED: 4}}
    first = storage.claim("w1", ["default"], 10, LEASE, **limits)
    assert sorted(tenants(first)) == ["A", "A", "B", "B"]
    assert storage.claim("w2", ["default"], 10, LEASE, **limits) == []
    one_each = {tenants([c])[0]: c for c in first}.values()
    for one in one_each:  # a slot of A and of B free
        started = storage.start(one, LEASE)
        assert started is not None and storage.complete(started, None) is not None
    assert sorted(tenants(storage.claim("w3", ["default"], 10, LEASE, **limits))) == ["A", "B"]


def test_submit_many_numbers_each_key_in_turn(executor, storage, clock):
    requests = [
        TaskSubmitRequest(task_name=FAIR, task_parameter={"tenant": key}, concurrency_key=key)
        for key in ["A"] * 4 + ["B"] * 2
    ]
    executor.submit_many(requests)
    order = tenants(claim_one_by_one(storage, 6))
    # one submit: the same run at, so any order within a round
    assert [sorted(order[:2]), sorted(order[2:4]), order[4:]] == [["A", "B"]] * 2 + [["A", "A"]]


def test_a_refused_submit_many_numbers_nothing(executor, storage, clock):
    """A bad member refuses the whole submit: nothing stored, and the keys' next rounds are
    as before (B's first task still shares the round being served)."""
    submit(executor, clock, "A", 4)
    bad = [
        TaskSubmitRequest(task_name=FAIR, task_parameter={"tenant": "B"}, concurrency_key="B"),
        TaskSubmitRequest(task_name=FAIR, task_parameter={}, concurrency_key=""),
    ]
    with pytest.raises(InvalidTaskOptionError):
        executor.submit_many(bad)
    assert len(executor.list_tasks()) == 4
    submit(executor, clock, "B", 1)
    assert tenants(claim_one_by_one(storage, 3)) == ["A", "B", "A"]


def test_a_cancelled_task_is_left_out_of_its_round(executor, storage, clock):
    """B's first task cancelled: round 0 has A's alone, B's second keeps round 1."""
    submit(executor, clock, "A", 3)
    b = submit(executor, clock, "B", 2)
    assert executor.cancel_task(b[0]) is not None
    assert tenants(claim_one_by_one(storage, 5)) == ["A", "A", "B", "A"]


def test_a_paused_queue_keeps_its_fair_tasks(executor, storage, clock):
    submit(executor, clock, "A", 2)
    executor.pause_queue("default")
    assert storage.claim("w1", ["default"], 10, LEASE) == []
    executor.resume_queue("default")
    assert tenants(storage.claim("w1", ["default"], 10, LEASE)) == ["A", "A"]


def test_a_retried_task_keeps_its_turn(executor, storage, clock):
    """A failed task retried by hand goes back with its round: before the later rounds of its
    key and the others."""
    first = submit(executor, clock, "A", 1)
    (claimed,) = storage.claim("w1", ["default"], 1, LEASE)
    started = storage.start(claimed, LEASE)
    assert started is not None
    assert storage.fail(started, "boom", retryable=False) is not None
    submit(executor, clock, "A", 3)
    submit(executor, clock, "B", 3)
    assert executor.retry_task(first[0]) is not None
    claims = claim_one_by_one(storage, 3)
    assert claims[0].task_id == first[0]


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_fair_submits_inside_a_rolled_back_transaction_leave_nothing(
    executor, storage, clock, alias
):
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        submit(executor, clock, "A", 3)
        raise RuntimeError("roll back")
    assert executor.list_tasks() == []
    assert not ReliableFairKey.objects.using(alias).exists()


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_the_chores_forget_the_keys_of_a_name_with_nothing_waiting_but_its_highest_round(
    executor, storage, clock, alias
):
    """The rows go, but one per queue and priority keeps the highest next round: the
    numbering never goes back (test_fairness_places.py)."""
    submit(executor, clock, "A", 2)
    submit(executor, clock, "B", 1)
    storage.mark_limited(limited_names(), 500)
    assert ReliableFairKey.objects.using(alias).filter(name=FAIR).count() == 2
    for one in storage.claim("w1", ["default"], 10, LEASE):
        started = storage.start(one, LEASE)
        assert started is not None and storage.complete(started, None) is not None
    storage.mark_limited(limited_names(), 500)
    rows = ReliableFairKey.objects.using(alias).filter(name=FAIR)
    assert list(rows.values_list("key", "next_round")) == [("A", 2)]
    assert executor.list_tasks(status=TaskStatus.COMPLETED)


def test_many_keys_each_get_a_turn_before_any_second(executor, storage, clock):
    now = clock.now()
    backlog = [
        dataclasses.replace(
            new_task(f"big-{i:04d}", FAIR, {"tenant": "big"}, now), concurrency_key="big"
        )
        for i in range(500)
    ]
    storage.enqueue(backlog)
    clock.advance(1)
    for key in range(20):
        submit(executor, clock, f"t{key}", 2)
    order = tenants(claim_one_by_one(storage, 42))
    # round 0 of big went first (before the others existed); every small tenant is served
    # twice within the first 42 claims, big at most once a round
    assert all(order.count(f"t{key}") == 2 for key in range(20))


def test_fair_limit_bounds_the_fair_names_only(executor, storage, clock):
    """A worker claims a fair name's tasks only for its idle threads (fair_limit): the rest
    stay in the storage, in their turns; other names fill the claim as before."""
    submit(executor, clock, "A", 6)
    plain = [executor.submit("demo.noop", None).task_id for _ in range(3)]
    claims = storage.claim("w1", ["default"], 10, LEASE, fair_limit=2)
    assert [c.task.task_name for c in claims].count(FAIR) == 2
    assert {c.task_id for c in claims} >= set(plain)
    assert storage.claim("w2", ["default"], 10, LEASE, fair_limit=0) == []
    assert len(storage.claim("w3", ["default"], 10, LEASE)) == 4


def test_fair_limit_holds_with_caps_and_rates(executor, storage, clock):
    submit(executor, clock, "A", 4, name=FAIR_KEYED)
    for _ in range(4):
        executor.submit(FAIR_RATED, {"tenant": "R"}, rate_key="R")
    limits = {
        "key_limits": {FAIR_KEYED: 2},
        "name_limits": {FAIR_KEYED: 4},
        "rate_limits": {FAIR_RATED: parse_rate_limit("1000/s")},
    }
    assert len(storage.claim("w1", ["default"], 10, LEASE, fair_limit=1, **limits)) == 1
    assert len(storage.claim("w2", ["default"], 10, LEASE, fair_limit=3, **limits)) == 3


def test_a_submit_many_keeps_request_order_within_each_key(executor, storage, clock):
    """One call's tasks of a key are numbered in request order and taken so, the keys in turn."""
    requests = [
        TaskSubmitRequest(FAIR, {"tenant": key, "i": i}, concurrency_key=key)
        for i in range(4)
        for key in ("A", "B")
    ]
    executor.submit_many(requests)
    taken = [
        (c.task.parameter["tenant"], c.task.parameter["i"]) for c in claim_one_by_one(storage, 8)
    ]
    assert [t for t in taken if t[0] == "A"] == [("A", i) for i in range(4)]
    assert [t for t in taken if t[0] == "B"] == [("B", i) for i in range(4)]
    assert [k for k, _ in taken] in (["A", "B"] * 4, ["B", "A"] * 4)
