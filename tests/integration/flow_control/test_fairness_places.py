"""Round-robin fairness keeps every task's place: a key's rounds per queue and priority, the
numbering never going back once the chores forgot keys, the rounds of a name that lost its
fairness cleared, and the keys' rows kept only while their key has tasks waiting. Helpers come
from tests/integration/flow_control/test_fairness.py."""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from django_reliable_executor.core.flow_limits import FlowLimits
from django_reliable_executor.core.rate_limits import parse_rate_limit
from django_reliable_executor.models import ReliableFairKey, ReliableTask
from django_reliable_executor.registry import FLOW_LIMITS
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.conftest import DB_ALIASES, db_params
from tests.integration.flow_control.test_fairness import (
    FAIR,
    FAIR_KEYED,
    FAIR_RATED,
    claim_one_by_one,
    submit,
    tenants,
)
from tests.integration.flow_control.test_fairness_redteam import KEYED_LIMITS, finish_all
from tests.support.contract_support import LEASE

RATED = {"rate_limits": {FAIR_RATED: parse_rate_limit("1000/s")}}


def chores(storage, limit: int = 500) -> int:
    """The master's chore that keeps the fair keys' rows (mark_limited)."""
    return storage.mark_limited(storage.flow_limits.names(), limit)


def key_rows(alias: str, name: str = FAIR) -> list[str]:
    return sorted(
        ReliableFairKey.objects.using(alias).filter(name=name).values_list("key", flat=True)
    )


def deployed_without_fairness(
    name: str, *, known: bool = True, limited: bool = False
) -> FlowLimits:
    """The registry's flow limits as a deploy where ``name`` lost its fairness would see them
    (``limited``: it keeps its other limits; ``known``: the deploy has its handler)."""
    return FlowLimits(
        names=lambda: FLOW_LIMITS.names() - (set() if limited else {name}),
        keyed=lambda: FLOW_LIMITS.keyed() - {name},
        homes=lambda: {k: v for k, v in FLOW_LIMITS.homes().items() if limited or k != name},
        fair=lambda: set(FLOW_LIMITS.fair()) - {name},
        known=lambda: set(FLOW_LIMITS.known()) - (set() if known else {name}),
    )


# -- 1. a key's rounds are counted per queue and priority (all four storages) -----------------


def test_a_key_busy_at_another_priority_joins_the_round_being_served(executor, storage, clock):
    """A's backlog at priority 0, then B's five tasks at priority 5 (numbered after everything,
    and claimed): they say nothing of B's turn at priority 0, where its first task shares A's
    first round instead of waiting behind A's whole backlog."""
    submit(executor, clock, "A", 6)
    submit(executor, clock, "B", 5, priority=5)
    assert tenants(storage.claim("w0", ["default"], 5, LEASE)) == ["B"] * 5
    submit(executor, clock, "B", 1)
    assert tenants(claim_one_by_one(storage, 3)) == ["A", "B", "A"]


def test_a_key_busy_in_another_queue_joins_the_round_being_served(executor, storage, clock):
    submit(executor, clock, "A", 6)
    submit(executor, clock, "B", 5, queue="other")
    assert tenants(storage.claim("w0", ["other"], 5, LEASE)) == ["B"] * 5
    submit(executor, clock, "B", 1)
    assert tenants(claim_one_by_one(storage, 3)) == ["A", "B", "A"]


# -- 2. places are never lost: the numbering never goes back ----------------------------------


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_task_retried_by_hand_after_the_chores_forgot_the_keys_keeps_its_place(
    alias, executor, storage, clock
):
    """A's third task (round 2) failed for good and nothing of the name waits: the chores
    forget the keys, but not how far the numbering went, so the tasks submitted next come
    after round 2 and A's task retried by hand goes first."""
    ids = submit(executor, clock, "A", 3)
    claims = storage.claim("w1", ["default"], 3, LEASE)
    finish_all(storage, claims[:2])
    started = storage.start(claims[2], LEASE)
    assert started is not None and storage.fail(started, "boom", retryable=False) is not None
    chores(storage)
    submit(executor, clock, "B", 2)
    submit(executor, clock, "A", 1)
    assert executor.retry_task(ids[2]) is not None
    order = [c.task_id for c in claim_one_by_one(storage, 4)]
    assert order[0] == ids[2], order


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_recovered_claim_of_a_dead_worker_keeps_its_place(alias, executor, storage, clock):
    """A's second task is claimed by a worker that dies; the chores forget the idle keys
    meanwhile. Recovered, it goes before B's tasks submitted while it was held."""
    ids = submit(executor, clock, "A", 2)
    finish_all(storage, storage.claim("w1", ["default"], 1, LEASE))
    assert [c.task_id for c in storage.claim("dead", ["default"], 1, LEASE)] == ids[1:]
    chores(storage)
    submit(executor, clock, "B", 2)
    clock.advance(LEASE + 1)
    assert storage.recover_expired(100) == []  # never started: back to waiting, no attempt
    order = [c.task_id for c in claim_one_by_one(storage, 3)]
    assert order[0] == ids[1], order


def test_a_task_retried_after_its_backoff_keeps_its_place(executor, storage, clock):
    """A's first task fails and waits for its backoff with its round; once due it goes before
    the rounds numbered while it waited (every storage)."""
    ids = submit(executor, clock, "A", 2, retry_interval=1000)
    (first,) = storage.claim("w1", ["default"], 1, LEASE)
    started = storage.start(first, LEASE)
    assert started is not None and storage.fail(started, "boom", retryable=True) is not None
    chores(storage)
    submit(executor, clock, "B", 2)
    submit(executor, clock, "A", 1)
    clock.advance(5)
    storage.promote_due(100)
    order = [c.task_id for c in claim_one_by_one(storage, 3)]
    assert order[0] == ids[0], order


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_the_chores_keep_the_highest_round_of_a_drained_name(alias, executor, storage, clock):
    """Nothing of the name waits: one row stays per queue and priority, with the highest next
    round; a new key starts there and an old one keeps its turn after it."""
    submit(executor, clock, "A", 3)
    submit(executor, clock, "B", 1)
    finish_all(storage, storage.claim("w1", ["default"], 10, LEASE))
    chores(storage)
    rows = ReliableFairKey.objects.using(alias).filter(name=FAIR)
    assert list(rows.values_list("key", "queue", "priority", "next_round")) == [
        ("A", "default", 0, 3)
    ]
    submit(executor, clock, "C", 1)
    assert rows.get(key="C").next_round == 4


# -- 3. a name that loses fairness is taken oldest first again -------------------------------


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_name_that_lost_fairness_is_taken_oldest_first_once_the_chores_ran(
    alias, make_storage, executor, clock
):
    submit(executor, clock, "A", 3)
    submit(executor, clock, "B", 3)
    after = make_storage(clock, flow_limits=deployed_without_fairness(FAIR))
    assert chores(after) >= 6  # moved to the claim of all other names, and cleared
    assert set(ReliableTask.objects.using(alias).values_list("flow_round", flat=True)) == {0}
    assert tenants(claim_one_by_one(after, 6)) == ["A"] * 3 + ["B"] * 3


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_limited_name_that_lost_fairness_is_taken_oldest_first(alias, make_storage, clock):
    """demo.fair_rated keeps its rate limit (and its own range) without fairness."""
    fair = ReliableExecutor(make_storage(clock), clock=clock)
    submit(fair, clock, "A", 2, name=FAIR_RATED)
    submit(fair, clock, "B", 2, name=FAIR_RATED)
    after = make_storage(clock, flow_limits=deployed_without_fairness(FAIR_RATED, limited=True))
    chores(after, limit=3)  # bounded: 3 a round
    chores(after, limit=3)
    assert tenants(claim_one_by_one(after, 4, **RATED)) == ["A", "A", "B", "B"]


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_recovered_claim_of_a_name_that_lost_fairness_is_cleared_too(
    alias, make_storage, executor, clock
):
    ids = submit(executor, clock, "A", 3)
    assert [c.task_id for c in executor.storage.claim("dead", ["default"], 1, LEASE)] == ids[:1]
    after = make_storage(clock, flow_limits=deployed_without_fairness(FAIR))
    chores(after)
    clock.advance(LEASE + 1)
    after.recover_expired(100)
    chores(after)
    rounds = ReliableTask.objects.using(alias).values_list("flow_round", flat=True)
    assert set(rounds) == {0}


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_the_rounds_of_a_name_this_process_does_not_know_are_left_alone(
    alias, make_storage, executor, clock
):
    """A deploy without the name's handler (another service's): its tasks keep their rounds
    (their fairness may be another deploy's)."""
    submit(executor, clock, "A", 2)
    submit(executor, clock, "B", 2)
    other = make_storage(clock, flow_limits=deployed_without_fairness(FAIR, known=False))
    chores(other)
    rounds = ReliableTask.objects.using(alias).values_list("flow_round", flat=True)
    assert sorted(rounds) == [0, 0, 1, 1]


# -- 4. the keys' rows are kept only while their key has tasks waiting -------------------------


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_one_delayed_task_does_not_keep_every_keys_row(alias, executor, storage, clock):
    """A task due in an hour waits; ten tenants' tasks ran: their rows go (but the highest)."""
    submit(executor, clock, "late", 1, delay_millis=3_600_000)
    for i in range(10):
        submit(executor, clock, f"k{i}", 1)
    finish_all(storage, storage.claim("w1", ["default"], 10, LEASE))
    assert len(key_rows(alias)) == 11
    chores(storage)
    rows = key_rows(alias)
    assert "late" in rows and len(rows) == 2, rows


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_key_with_tasks_waiting_keeps_its_row(alias, executor, storage, clock):
    submit(executor, clock, "A", 3)
    submit(executor, clock, "B", 1)
    submit(executor, clock, "C", 2, priority=1)
    finish_all(storage, storage.claim("w1", ["default"], 4, LEASE))  # C, C, A, B
    chores(storage)
    assert key_rows(alias) == ["A", "C"]  # A waits; C is its priority's highest
    submit(executor, clock, "B", 1)
    assert tenants(claim_one_by_one(storage, 3)) == ["A", "B", "A"]


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_the_chores_forget_keys_in_bounded_rounds(alias, executor, storage, clock):
    submit(executor, clock, "late", 1, delay_millis=3_600_000)
    for i in range(7):
        submit(executor, clock, f"k{i}", 1)
    finish_all(storage, storage.claim("w1", ["default"], 10, LEASE))
    counts = []
    for _ in range(4):
        chores(storage, limit=2)
        counts.append(len(key_rows(alias)))
    assert counts == [6, 4, 2, 2]


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_key_whose_tasks_wait_parked_keeps_its_row(alias, executor, storage, clock):
    """demo.fair_keyed (2 a key): A's third task waits parked at its key's cap."""
    submit(executor, clock, "A", 3, name=FAIR_KEYED)
    submit(executor, clock, "C", 6, name=FAIR_KEYED)
    claimed = storage.claim("w1", ["default"], 10, LEASE, **KEYED_LIMITS)
    assert sorted(tenants(claimed)) == ["A", "A", "C", "C"]
    storage.claim("w2", ["default"], 10, LEASE, **KEYED_LIMITS)  # parks the full keys
    chores(storage)
    assert key_rows(alias, FAIR_KEYED) == ["A", "C"]


# -- the chores against a submit committing meanwhile ------------------------------------------


@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres"]))
def test_a_key_row_forgotten_under_a_submit_comes_back_at_its_commit(
    alias, make_storage, executor, storage, clock
):
    """B's row is idle; a user's transaction submits B's next task and, before it commits, the
    chores (another connection, which cannot see it) forget B's row. The submit writes the row
    again after its commit, so B's next task after that is numbered after it."""
    submit(executor, clock, "B", 1)
    finish_all(storage, storage.claim("w0", ["default"], 1, LEASE))
    submit(executor, clock, "A", 3)  # rounds 1..3: B's row (next 1) is no longer the highest
    errors: list[BaseException] = []
    seen: list[list[str]] = []

    def master() -> None:
        try:
            chores(make_storage(clock))
            seen.append(key_rows(alias))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    with transaction.atomic(using=alias):
        submit(executor, clock, "B", 1)  # round 1, B's next 2 once committed
        thread = threading.Thread(target=master)
        thread.start()
        thread.join(30)
    assert errors == [] and seen == [["A"]]  # B's row forgotten under the submit
    assert ReliableFairKey.objects.using(alias).get(name=FAIR, key="B").next_round == 2
    submit(executor, clock, "B", 1)
    assert tenants(claim_one_by_one(storage, 4)) == ["A", "B", "A", "B"]
