"""Red-team review of ``fairness="round_robin"`` (commits 52ac1db, 290f224, f10334e): fairness
combined with the other features, on all four storages unless a test says otherwise.

Each test records a combination that was checked and holds (those marked FIXED failed before
their fix). The defects still open are listed in the closing note of issue 35. Helpers come from
tests/integration/flow_control/test_fairness.py."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connections, transaction

from django_reliable_executor import TaskStatus
from django_reliable_executor.core.flow_limits import FlowLimits
from django_reliable_executor.core.records import TaskSubmitRequest
from django_reliable_executor.models import ReliableFairKey
from django_reliable_executor.registry import (
    FLOW_LIMITS,
    fair_names,
    key_limits,
    limited_homes,
    limited_names,
)
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.conftest import BACKENDS, db_params, require
from tests.integration.flow_control.test_fairness import (
    FAIR,
    FAIR_KEYED,
    claim_one_by_one,
    submit,
    tenants,
)
from tests.support.contract_support import LEASE

KEYED_LIMITS = {"key_limits": {FAIR_KEYED: 2}, "name_limits": {FAIR_KEYED: 4}}


def finish_all(storage, claims) -> None:
    for one in claims:
        started = storage.start(one, LEASE)
        assert started is not None and storage.complete(started, None) is not None


def fail_for_good(storage, one) -> None:
    started = storage.start(one, LEASE)
    assert started is not None
    assert storage.fail(started, "boom", retryable=False) is not None


def flow_limits_without(name: str) -> FlowLimits:
    """The registry's flow limits as a deploy where ``name`` has no fairness (nor any limit)
    would see them."""
    return FlowLimits(
        names=lambda: limited_names() - {name},
        keyed=lambda: key_limits().keys() - {name},
        homes=lambda: {k: v for k, v in limited_homes().items() if k != name},
        fair=lambda: fair_names() - {name},
        known=FLOW_LIMITS.known,
    )


def fair_rows(alias: str, name: str = FAIR) -> int:
    if alias == "redis":
        raise AssertionError("database only")
    return ReliableFairKey.objects.using(alias).filter(name=name).count()


# -- the round a key's task gets, across queues and priorities -------------------------------
# FIXED: rounds per (name, queue, priority, key): test_fairness_places.py.


# -- a task keeps its place for life ---------------------------------------------------------


def test_a_timed_out_task_retried_comes_back_in_its_round(executor, storage, clock):
    """Held: a TIMEOUT whose handler ran on, then a retry by hand: the task keeps its round
    (its key's first) and goes before A's and B's later rounds; the key rows are not
    forgotten while the timed-out handler is still running."""
    ids = submit(executor, clock, "A", 3, max_duration_millis=1000)
    first = storage.claim("w1", ["default"], 1, LEASE)
    assert [c.task_id for c in first] == ids[:1]
    running = storage.start(first[0], LEASE)
    assert running is not None
    clock.advance(2)
    storage.expire_overdue(100)
    assert executor.get_task(ids[0]).status is TaskStatus.TIMEOUT
    submit(executor, clock, "B", 3)
    assert storage.handler_returned([running]) == 1
    assert executor.retry_task(ids[0]) is not None
    order = [c.task_id for c in claim_one_by_one(storage, 2)]
    assert order[0] == ids[0], order


# -- a name that gains or loses fairness between deploys -------------------------------------


def test_a_name_that_gained_fairness_takes_turns_once_the_chores_ran(
    make_storage, executor, storage, clock
):
    """Checked (a limitation the docs do not state): tasks stored before the deploy that made
    the name fair have no round (all 0 on the databases, a ready list on Redis), so B's first
    task after the deploy still waits behind A's whole old backlog; only tasks stored after
    the deploy take turns. Recorded as it is on every storage (all four agree)."""
    before = make_storage(clock, flow_limits=flow_limits_without(FAIR))
    old = [
        ReliableExecutor(before, clock=clock).submit(FAIR, {"tenant": "A"}, concurrency_key="A")
        for _ in range(5)
    ]
    clock.advance(1)
    storage.mark_limited(limited_names(), 500)  # the new deploy's chores
    submit(executor, clock, "B", 1)
    submit(executor, clock, "A", 1)
    order = tenants(claim_one_by_one(storage, 7))
    assert order.count("A") == 6 and len(old) == 5
    assert order.index("B") == 5, order  # behind the whole old backlog


# -- state that grows ------------------------------------------------------------------------
# FIXED: the rows of keys with nothing waiting are forgotten: test_fairness_places.py.


# -- MariaDB: keys that differ only by trailing spaces -----------------------------------------


# -- priorities, pauses, delays, caps --------------------------------------------------------


def test_a_delayed_task_goes_before_later_tasks_once_due(executor, storage, clock):
    """Held: A's task due in 10 s keeps its round 0 and, once due, goes before A's later
    tasks and B's rounds 1.. (the documented "due later ... goes before the tasks submitted
    after it once it is due")."""
    late = submit(executor, clock, "A", 1, delay_millis=10_000)
    submit(executor, clock, "B", 3)
    submit(executor, clock, "A", 2)
    assert tenants(claim_one_by_one(storage, 1)) == ["B"]
    clock.advance(11)
    storage.promote_due(100)
    order = [c.task_id for c in claim_one_by_one(storage, 4)]
    assert order[0] == late[0], order


def test_a_paused_queue_does_not_hold_back_the_rounds_of_another(executor, storage, clock):
    """Held: A's backlog in a paused queue; B and A in "default" take turns there from the
    round of "default" (the paused queue's low rounds are read only for its own submits)."""
    submit(executor, clock, "A", 5, queue="other")
    executor.pause_queue("other")
    submit(executor, clock, "A", 3)
    submit(executor, clock, "B", 3)
    assert tenants(claim_one_by_one(storage, 6)) == ["A", "B"] * 3


def test_a_cap_per_key_keeps_the_turns_as_slots_free(executor, storage, clock):
    """Held: demo.fair_keyed (2 a key, 4 the name): A's backlog of 10 and B's of 2, C's 2
    later; as slots free one at a time, the turns go on in round order (A's parked tasks come
    back by round, not all before C)."""
    submit(executor, clock, "A", 10, name=FAIR_KEYED)
    submit(executor, clock, "B", 2, name=FAIR_KEYED)
    first = storage.claim("w1", ["default"], 10, LEASE, **KEYED_LIMITS)
    assert sorted(tenants(first)) == ["A", "A", "B", "B"]
    submit(executor, clock, "C", 2, name=FAIR_KEYED)
    finish_all(storage, first)
    nxt = storage.claim("w2", ["default"], 10, LEASE, **KEYED_LIMITS)
    assert sorted(tenants(nxt)) == ["A", "A", "C", "C"], tenants(nxt)


def test_a_newcomers_burst_waits_its_turns_behind_a_slow_keys_parked_tasks(
    executor, storage, clock
):
    """FIXED (Redis): demo.fair_keyed, A's two tasks run long (its key full) and its next two
    wait parked by key at rounds 2 and 3, while B and C take turns on to round ~10. D's six
    then take turns with B and C: a task parked behind its own full key is not being served,
    so its round is not the one a new key joins (Redis counted it: D's whole burst went
    first)."""
    submit(executor, clock, "A", 4, name=FAIR_KEYED)
    first = storage.claim("w1", ["default"], 10, LEASE, **KEYED_LIMITS)
    assert tenants(first) == ["A", "A"]  # A's other two parked by key; these never finish
    submit(executor, clock, "B", 12, name=FAIR_KEYED)
    submit(executor, clock, "C", 12, name=FAIR_KEYED)
    for _ in range(16):
        finish_all(storage, storage.claim("wx", ["default"], 1, LEASE, **KEYED_LIMITS))
    submit(executor, clock, "D", 6, name=FAIR_KEYED)
    order = []
    for _ in range(6):
        got = storage.claim("wx", ["default"], 1, LEASE, **KEYED_LIMITS)
        order += tenants(got)
        finish_all(storage, got)
    assert order == ["B", "C", "D"] * 2, order


# -- batches, dependencies, unique, debounce --------------------------------------------------


def test_a_dependent_released_later_keeps_the_round_it_got_at_submit(executor, storage, clock):
    """Held: B's dependent is numbered at submit (round 0, where the claims were) and, released
    once its dependency completes, goes before A's later rounds."""
    dep = executor.submit("demo.noop", None)
    submit(executor, clock, "A", 5)
    waiting = executor.submit(
        FAIR, {"tenant": "B"}, concurrency_key="B", depends_on=[dep.task_id]
    ).task_id
    plain = storage.claim("w1", ["default"], 10, LEASE, fair_limit=0)
    assert [c.task_id for c in plain] == [dep.task_id]
    assert tenants(claim_one_by_one(storage, 2)) == ["A", "A"]
    finish_all(storage, plain)
    order = [c.task_id for c in claim_one_by_one(storage, 3)]
    assert order[0] == waiting, order


def test_a_unique_submit_refused_by_its_key_takes_no_round(executor, storage, clock):
    """Held: B's second unique submit returns the first task and numbers nothing: B's next
    task is still in round 1, not 2."""
    submit(executor, clock, "A", 4)
    unique = {"concurrency_key": "B", "unique_key": "u1", "unique_for": 60}
    first = executor.submit(FAIR, {"tenant": "B"}, **unique)
    again = executor.submit(FAIR, {"tenant": "B"}, **unique)
    assert again.task_id == first.task_id
    submit(executor, clock, "B", 1)
    assert tenants(claim_one_by_one(storage, 4)) == ["A", "B", "A", "B"]


def test_a_debounced_fair_task_keeps_its_round_when_joined(executor, storage, clock):
    """Held: a debounced submit of B joins B's waiting task (its round stays 0); the joined
    task runs debounce seconds after the last submit, then before A's later rounds."""
    submit(executor, clock, "A", 4)
    first = executor.submit(FAIR, {"tenant": "B"}, concurrency_key="B", unique_key="d", debounce=5)
    clock.advance(2)
    joined = executor.submit(FAIR, {"tenant": "B"}, concurrency_key="B", unique_key="d", debounce=5)
    assert joined.task_id == first.task_id and joined.debounced
    assert tenants(claim_one_by_one(storage, 2)) == ["A", "A"]
    clock.advance(6)
    storage.promote_due(100)
    assert [c.task_id for c in claim_one_by_one(storage, 1)] == [first.task_id]


def test_a_batchs_fair_members_and_callback_take_turns_with_the_others(executor, storage, clock):
    """Held: the members of a batch are numbered like any submit (each key in turn), and its
    fair callback, stored when the last member ends, joins the round being served."""
    submit(executor, clock, "A", 6)
    members = [TaskSubmitRequest(FAIR, {"tenant": "B"}, concurrency_key="B") for _ in range(2)]
    callback = TaskSubmitRequest(FAIR, {"tenant": "C"}, concurrency_key="C")
    batch = executor.submit_batch(members, on_complete=callback)
    claims = claim_one_by_one(storage, 4)
    assert tenants(claims) == ["A", "B", "A", "B"]
    finish_all(storage, claims)
    assert executor.get_batch(batch.batch_id).finished_at is not None
    storage.promote_due(100)
    order = tenants(claim_one_by_one(storage, 3))
    assert order.index("C") <= 1, order


def test_purge_of_a_fair_name_leaves_it_claimable(executor, storage, clock):
    """Held: finished tasks of a fair name purged; new work is numbered and claimed as before."""
    submit(executor, clock, "A", 3)
    finish_all(storage, storage.claim("w1", ["default"], 10, LEASE))
    clock.advance(3600)
    storage.purge_finished(clock.now(), 100)
    submit(executor, clock, "B", 2)
    submit(executor, clock, "A", 2)
    assert tenants(claim_one_by_one(storage, 4)) == ["B", "A", "B", "A"]


# -- the user's transaction ------------------------------------------------------------------


@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres"]))
def test_fair_submits_in_users_transactions_do_not_deadlock(alias, make_storage, clock):
    """FIXED (MariaDB and PostgreSQL; fair_rounds numbers without locks now): two users'
    transactions each submit one task of key A then one of key B, in opposite orders, at the
    same moment. Each submit locks its key's row in reliable_executor_fair_key until the
    user's transaction ends, so the two wait for each other and the database kills one as a
    deadlock victim; the storage cannot run it again (it is the user's transaction), so the
    user's whole transaction fails with OperationalError. Without fairness these submits
    never wait for each other; the docs ("What it costs") do not say that a fair submit
    holds its keys' rows until the caller commits, nor that submits of several keys in one
    transaction must come in one order."""
    require(alias)
    executors = [ReliableExecutor(make_storage(clock), clock=clock) for _ in range(2)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(executor: ReliableExecutor, keys: tuple[str, str]) -> None:
        try:
            with transaction.atomic(using=alias):
                executor.submit(FAIR, {"tenant": keys[0]}, concurrency_key=keys[0])
                barrier.wait(10)
                executor.submit(FAIR, {"tenant": keys[1]}, concurrency_key=keys[1])
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    # the rows exist beforehand (a name's keys in use)
    executors[0].submit(FAIR, {"tenant": "A"}, concurrency_key="A")
    executors[0].submit(FAIR, {"tenant": "B"}, concurrency_key="B")
    threads = [
        threading.Thread(target=run, args=(executors[0], ("A", "B"))),
        threading.Thread(target=run, args=(executors[1], ("B", "A"))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [], [repr(e)[:200] for e in errors]


@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres"]))
def test_concurrent_single_submits_of_one_key_in_users_transactions(alias, make_storage, clock):
    """FIXED (MariaDB; fair_rounds numbers without locks now): several users' transactions each
    submit ONE task of the same key at once (the key's row existing). The INSERT IGNORE of the
    existing row (bulk_create ignore_conflicts) takes a shared lock on it, the SELECT ... FOR
    UPDATE then wants it exclusive: two such transactions each hold the shared lock the other's
    upgrade waits for, and InnoDB kills one as a deadlock victim (1213). Inside the user's
    transaction that is not run again: the submit fails. Outside one, Submitting.enqueue's
    _retrying hides it (at the cost of retries; test below). PostgreSQL's ON CONFLICT DO NOTHING
    takes no such lock: it holds there."""
    require(alias)
    threads_n = 6
    executors = [ReliableExecutor(make_storage(clock), clock=clock) for _ in range(threads_n)]
    executors[0].submit(FAIR, {"tenant": "A"}, concurrency_key="A")
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_n)

    def run(executor: ReliableExecutor) -> None:
        try:
            barrier.wait(10)
            for _ in range(5):
                with transaction.atomic(using=alias):
                    executor.submit(FAIR, {"tenant": "A"}, concurrency_key="A")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(e,)) for e in executors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [], [repr(e)[:200] for e in errors]


def test_a_refused_member_with_a_dependency_consumes_no_round(executor, storage, clock):
    """Held: a submit_many refused by a missing dependency stores nothing and numbers nothing
    (B's next task still shares round 0 with A's first)."""
    submit(executor, clock, "A", 3)
    bad = [
        TaskSubmitRequest(FAIR, {"tenant": "B"}, concurrency_key="B"),
        TaskSubmitRequest(FAIR, {"tenant": "B"}, concurrency_key="B", depends_on=["missing"]),
    ]
    with pytest.raises(Exception):  # noqa: B017 - InvalidDependencyError on every storage
        executor.submit_many(bad)
    assert len(executor.list_tasks()) == 3
    submit(executor, clock, "B", 1)
    assert tenants(claim_one_by_one(storage, 2)) == ["A", "B"]


def test_run_at_before_1970_is_read_back(executor, storage, clock):
    """Held: a fair task submitted with a run_at before the epoch is stored due now (no
    negative run at reaches Redis's fair-set member) and is listed, read and claimed."""
    when = dt.datetime(1960, 1, 1, tzinfo=dt.timezone.utc)
    info = executor.submit(FAIR, {"tenant": "A"}, concurrency_key="A", run_at=when)
    assert [t.task_id for t in executor.list_tasks()] == [info.task_id]
    executor.count_by_status()
    storage.oldest_due()
    assert [c.task_id for c in claim_one_by_one(storage, 1)] == [info.task_id]


# -- the chores against a submit in flight ---------------------------------------------------


# -- a real worker ---------------------------------------------------------------------------


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_thread_freed_by_another_names_task_takes_the_next_turn_at_once(alias, make_storage):
    """FIXED (worker/fetcher.py, pool.py: wake_any while the fetcher waits, and on Redis the
    worker's own wake key, which a freed thread pushes to, in its wait): a worker claims fair
    tasks only for idle threads; with its one thread busy on another name's task, the claim
    woken by the fair submit takes nothing (fair_limit 0) and the fetcher waits for work. When
    that thread is freed, only a fair or limited-queue claim leaving the pool wakes the fetcher:
    the fair task waits for the next poll (POLL_INTERVAL, 4 s here: it started 3.5 s after the
    thread was freed on SQLite, PostgreSQL and Redis; MariaDB's wait for work happened to end
    sooner). Fair work is claimed only for idle threads, so every thread freed, whatever it ran,
    is a chance to claim the next turn; the docs promise the fetcher claims "at once" when a
    fair task's thread finishes, and a thread freed by any other name idles for up to a whole
    poll interval with fair work due."""
    import time

    from django_reliable_executor.worker.worker import Worker, WorkerOptions
    from tests.support.contract_support import GATE

    live = ReliableExecutor(make_storage())  # the real clock
    gate = live.submit("contract.gate", None).task_id
    options = WorkerOptions(
        core_pool_size=1, max_pool_size=1, queue_capacity=10, poll_interval=4.0, worker_id="fw"
    )
    worker = Worker(options, live)
    GATE.clear()
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while live.get_task(gate).status is not TaskStatus.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        fair = live.submit(FAIR, {"tenant": "A"}, concurrency_key="A").task_id
        time.sleep(0.5)  # the woken claim found no idle thread for it
        opened = time.monotonic()
        GATE.set()
        while live.get_task(fair).status is not TaskStatus.COMPLETED:
            assert time.monotonic() < opened + 10
            time.sleep(0.02)
        waited = time.monotonic() - opened
    finally:
        GATE.set()
        worker.request_stop()
        thread.join(30)
        GATE.clear()
        connections.close_all()
    assert not thread.is_alive()
    assert waited < 1.5, f"the fair task started {waited:.2f} s after the thread was freed"


# -- a capped name that gains fairness (its parked tasks) -------------------------------------


# -- a rate limit that holds tasks back --------------------------------------------------------


def test_rate_limited_keys_take_turns_within_their_limits(executor, storage, clock):
    """Held: a fair name with rate_limit 2/m per rate key: A's six and B's two take turns, A's
    third waits for the next minute, and then goes before A's fourth."""
    from django_reliable_executor import reliable_task_handler
    from django_reliable_executor.core.rate_limits import parse_rate_limit
    from django_reliable_executor.registry import unregister

    name = "tests.redteam_fair_rate"

    @reliable_task_handler(name=name, fairness="round_robin", rate_limit="2/m")
    def fair_rate(param=None) -> None: ...

    try:
        ids = []
        for key in ["A"] * 6 + ["B"] * 2:
            ids.append(executor.submit(name, {"tenant": key}, rate_key=key).task_id)
            clock.advance(0.001)
        rates = {"rate_limits": {name: parse_rate_limit("2/m")}}
        first = claim_one_by_one(storage, 6, **rates)
        assert tenants(first) == ["A", "B", "A", "B"]  # without fairness: A, A, B, B
        clock.advance(61)
        storage.promote_due(100)
        # (how many of A's the databases' rate log lets out in the next minute's first claims
        # is the rate limit's business, the same without fairness: one, then two)
        later = claim_one_by_one(storage, 3, **rates)
        assert [c.task_id for c in later][:1] == ids[2:3]
    finally:
        unregister(name)


# -- the HTTP API ------------------------------------------------------------------------------

from tests.integration.api.conftest import operator, service  # noqa: E402,F401 - fixtures


@pytest.mark.parametrize(
    "fields",
    [
        {"concurrency_key": 7},
        {"concurrency_key": ""},
        {"rate_key": ["A"]},
        {"concurrency_key": "x" * 192},
        {"concurrency_key": "A\u0000"},
        {"priority": "high"},
    ],
)
def test_a_bad_fair_submit_through_the_api_numbers_nothing(service, operator, fields):  # noqa: F811
    """Held: a refused submit of a fair name (400) stores nothing and numbers no round: B's
    task afterwards shares round 0 with A's first."""
    import json

    from tests.support.api_support import API

    def post(**more):
        body = json.dumps({"task_name": FAIR, "task_parameter": {"tenant": "B"}, **more})
        return operator.post(API, body.encode(), content_type="application/json")

    for _ in range(3):
        response = post(concurrency_key="A", task_parameter={"tenant": "A"})
        assert response.status_code == 201
    bad = post(**fields)
    assert bad.status_code == 400, bad.content
    assert post(concurrency_key="B").status_code == 201
    claims = [c for i in range(3) for c in service.storage.claim(f"w{i}", ["default"], 1, 60)]
    assert [c.task.parameter["tenant"] for c in claims] == ["A", "B", "A"]


# -- the process pool --------------------------------------------------------------------------


def test_a_rolled_back_users_transaction_numbers_no_round(db_alias, executor, storage, clock):
    """Held on every storage (Redis defers the submit to the commit): A's tasks submitted in a
    transaction that rolls back are not stored and consume no round: B's first task then
    shares round 0 with A's first."""
    with pytest.raises(RuntimeError), transaction.atomic(using=db_alias):
        submit(executor, clock, "B", 3)
        raise RuntimeError("roll back")
    assert executor.list_tasks() == []
    submit(executor, clock, "A", 2)
    submit(executor, clock, "B", 1)
    assert tenants(claim_one_by_one(storage, 3)) == ["A", "B", "A"]
