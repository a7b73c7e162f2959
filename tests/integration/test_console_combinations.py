"""Red-team read of the bulk actions (service/bulk_actions.py, bulk_walk.py) and the tag and
parameter search (``tags``, SEARCHABLE_PARAMETERS, ``list_tasks(tag=, parameter=)``, the HTTP
API's filters) where they meet the other features, on every storage unless a test says otherwise.

Each test records a combination that was checked. The walks run chunk by chunk in the test's
thread (``walk_chunk``, as the bulk action's handler calls it) over the fake clock, so that the
test can act between two chunks as an operator or a worker would."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.conf import get_settings
from django_reliable_executor.core.states import DEAD_LETTER_STATUSES
from django_reliable_executor.core.task_count import TaskCount
from django_reliable_executor.exceptions import TaskSubmitError
from django_reliable_executor.models import ReliableTaskParameter, ReliableTaskTag
from django_reliable_executor.registry import key_limits, name_limits, rate_limits
from django_reliable_executor.service import bulk_actions
from django_reliable_executor.service.bulk_walk import (
    BULK_ACTION,
    BulkAction,
    WalkState,
    walk_chunk,
)
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.conftest import TASK_APPS, db_params, sharded_redis_storage
from tests.support.admin_support import LIST_URL, admin_params
from tests.support.api_support import API, api_executor, login
from tests.support.contract_support import LEASE

DEAD = {"statuses": sorted(s.value for s in DEAD_LETTER_STATUSES)}
STILL_RUNNING = "its previous attempt is still running"
KEYS = ("customer_id", "region")
HOUR_MS = 3_600_000


# -- helpers ---------------------------------------------------------------------------------
def ids(tasks) -> list[str]:
    return [task.task_id for task in tasks]


def indexed(executor: ReliableExecutor) -> ReliableExecutor:
    """The same storage and clock, with KEYS searchable (SEARCHABLE_PARAMETERS)."""
    settings = dataclasses.replace(get_settings(), SEARCHABLE_PARAMETERS=KEYS)
    return ReliableExecutor(executor.storage, clock=executor.clock, settings=settings)


def dead_letters(
    executor: ReliableExecutor,
    task_ids: list[str],
    queue: str,
    *,
    name: str = "demo.always_fails",
    spaced: bool = False,
    parameter: Any = "i",
    **options: Any,
) -> None:
    """``task_ids`` submitted to ``queue`` and ended FAILED (one attempt each); ``spaced``: one
    by one, a second apart, so that each has its own creation time (newest last); the
    parameter is ``{"i": n}``, or ``parameter`` when it is not "i"."""
    requests = [
        TaskSubmitRequest(
            name,
            {"i": n} if parameter == "i" else parameter,
            task_id=t,
            queue=queue,
            retry_limit=0,
            **options,
        )
        for n, t in enumerate(task_ids)
    ]
    if spaced:
        for request in requests:
            executor.submit_many([request])
            executor.clock.advance(1)
    else:
        executor.submit_many(requests)
    storage = executor.storage
    left = len(task_ids)
    while left:
        claims = storage.claim(
            "setup", [queue], left, LEASE, key_limits=key_limits(), name_limits=name_limits()
        )
        assert claims, f"{left} of {task_ids} could not be claimed"
        for claim in claims:
            started = storage.start(claim, LEASE)
            assert started is not None
            assert storage.fail(started, "ValueError: boom", retryable=False) is not None
        left -= len(claims)


def walk(
    executor: ReliableExecutor,
    action: str,
    filters: dict[str, Any],
    *,
    until: dt.datetime | None = None,
    chunk: int = 5,
    between: Callable[[int, WalkState], None] | None = None,
    state: WalkState | None = None,
) -> WalkState:
    """A bulk action's whole walk, a chunk at a time, each chunk's state stored and read back
    as its checkpoint is; ``between(n, state)`` after chunk n."""
    until = executor.clock.now() if until is None else until
    checked = bulk_actions.checked_filters(executor, filters)
    total = bulk_actions.count_matching(executor, checked, None, until)
    bulk = BulkAction(action, checked, None, until, total, chunk)
    state = WalkState() if state is None else state
    n = 0
    while not state.done:
        state = WalkState.from_json(walk_chunk(executor, bulk, state, lambda s: None).to_json())
        n += 1
        if between is not None and not state.done:
            between(n, state)
    return state


def statuses(executor: ReliableExecutor, task_ids: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for task in executor.storage.get_many(task_ids).values():
        counts[task.status.value] = counts.get(task.status.value, 0) + 1
    return counts


def parameter_entries(alias: str, storage) -> int:
    """The parameter index entries stored: rows (SQLite, MariaDB; PostgreSQL keeps none), or
    members of every ``pidx:`` set of every shard on Redis."""
    if alias == "redis":
        client = storage.client
        return sum(
            client.zcard(key)
            for prefix in storage.prefixes
            for key in client.scan_iter(match=prefix + "pidx:*", count=10_000)
        )
    return ReliableTaskParameter.objects.using(alias).count()


def tag_entries(alias: str, storage) -> int:
    if alias == "redis":
        client = storage.client
        return sum(
            client.zcard(key)
            for prefix in storage.prefixes
            for key in client.scan_iter(match=prefix + "tag:*", count=10_000)
        )
    return ReliableTaskTag.objects.using(alias).count()


def redis_problems(alias: str, storage) -> list[str]:
    if alias != "redis":
        return []
    from tests.support.redis_support import index_problems

    return index_problems(storage)


# -- A. bulk actions ---------------------------------------------------------------------------
def test_a_bulk_retry_leaves_a_timeout_whose_handler_runs_and_retries_it_once_it_ended(
    executor, storage, clock
):
    """Held (DESIGN 6.1): a TIMEOUT whose handler still runs is skipped by a bulk retry,
    saying why (no second run beside it: nothing of its queue is claimable), while plain dead
    letters beside it are retried (on the databases in one statement, retry_plain). Once its
    handler returned, the next bulk retry retries it."""
    executor.submit(
        "demo.noop", None, task_id="slow", queue="in", max_duration_millis=1000, retry_limit=0
    )
    [claim] = storage.claim("w1", ["in"], 1, LEASE)
    running = storage.start(claim, LEASE)
    assert running is not None
    clock.advance(2)
    storage.expire_overdue(100)
    slow = executor.get_task("slow")
    assert slow.status is TaskStatus.TIMEOUT and slow.handler_running
    dead_letters(executor, ["d-1", "d-2", "d-3"], "in")

    state = walk(executor, "retry", {**DEAD, "queue": "in"})
    assert (state.examined, state.changed) == (4, 3), state
    assert state.skipped == {STILL_RUNNING: 1}
    assert executor.get_task("slow").status is TaskStatus.TIMEOUT
    claimed = storage.claim("w2", ["in"], 10, LEASE)
    assert sorted(ids(claimed)) == ["d-1", "d-2", "d-3"]  # never "slow" a second time
    storage.release(claimed)

    assert storage.handler_returned([running]) == 1
    clock.advance(1)
    state = walk(executor, "retry", {**DEAD, "queue": "in"})
    assert (state.examined, state.changed, state.skipped) == (1, 1, {}), state
    again = storage.claim("w2", ["in"], 10, LEASE)
    assert "slow" in ids(again)


def test_a_bulk_retry_retries_a_timeout_whose_worker_is_gone(executor, storage, clock):
    """Held: a TIMEOUT whose worker died (its lease lapsed, no recovery run yet) has ended: the
    walk retries it, once, beside a plain dead letter."""
    executor.submit(
        "demo.noop", None, task_id="lost", queue="in", max_duration_millis=1000, retry_limit=0
    )
    [claim] = storage.claim("w1", ["in"], 1, LEASE)
    assert storage.start(claim, LEASE) is not None
    clock.advance(2)
    storage.expire_overdue(100)
    dead_letters(executor, ["d-1"], "in")
    clock.advance(LEASE + 1)  # the worker is gone: its lease lapses
    state = walk(executor, "retry", {**DEAD, "queue": "in"})
    assert (state.examined, state.changed, state.skipped) == (2, 2, {}), state
    assert statuses(executor, ["lost", "d-1"]) == {"PENDING": 2}
    assert executor.get_task("lost").handler_running is False


def test_a_retry_walk_skips_nothing_and_repeats_nothing_while_operators_act_mid_walk(
    executor, storage, clock
):
    """Held: 30 dead letters walked 5 at a time. After the first chunk an operator retries
    one the walk has not reached (it leaves the filter, so every later page starts earlier)
    and one it retried already (refused: PENDING); one it retried runs and fails again (back
    in the filter, before the walk's offset): the walk does not retry it again. Every task
    but the one retried by hand is retried by the walk exactly once."""
    task_ids = [f"d-{n:02d}" for n in range(30)]
    dead_letters(executor, task_ids, "in", spaced=True)

    def operators(n: int, state: WalkState) -> None:
        if n != 1:
            return
        assert executor.retry_task("d-10")  # not reached yet
        assert not executor.retry_task("d-29")  # the walk's first: PENDING already
        claims = storage.claim("w1", ["in"], 10, LEASE)
        (again,) = [c for c in claims if c.task_id == "d-28"]
        storage.release([c for c in claims if c is not again])
        started = storage.start(again, LEASE)
        assert storage.fail(started, "ValueError: again", retryable=False) is not None

    state = walk(executor, "retry", {**DEAD, "queue": "in"}, between=operators)
    assert (state.examined, state.changed) == (29, 29), state  # d-10 left the filter
    assert state.skipped == {}, state
    tasks = executor.storage.get_many(task_ids)
    assert tasks["d-28"].status is TaskStatus.FAILED and tasks["d-28"].attempts == 2
    others = [t for t in tasks.values() if t.task_id != "d-28"]
    assert {t.status for t in others} == {TaskStatus.PENDING}
    assert {t.attempts for t in others} == {1}


def test_a_cancel_walk_goes_past_tasks_cancelled_or_retried_by_hand_mid_walk(
    executor, storage, clock
):
    """Held: 30 waiting tasks of a queue, cancelled 5 at a time over "waiting" statuses. An
    operator cancels one the walk has not reached (it leaves the filter) and retries one the
    walk cancelled (back in the filter, ahead of the walk): it is not cancelled twice."""
    task_ids = [f"w-{n:02d}" for n in range(30)]
    for task_id in task_ids:
        executor.submit("demo.noop", None, task_id=task_id, queue="w", delay_millis=HOUR_MS)
        clock.advance(1)

    def operators(n: int, state: WalkState) -> None:
        if n == 1:
            assert executor.cancel_task("w-10")
            assert executor.retry_task("w-29")  # cancelled by the walk's first chunk

    state = walk(
        executor, "cancel", {"queue": "w", "statuses": ["CREATED", "PENDING"]}, between=operators
    )
    assert (state.examined, state.changed) == (29, 29), state
    assert executor.get_task("w-29").status is TaskStatus.PENDING  # not cancelled twice
    assert statuses(executor, task_ids) == {"CANCELLED": 29, "PENDING": 1}


def test_a_cancel_walk_over_a_batch_fires_its_callback_once_and_leaves_it_alone(
    alias, executor, storage, clock
):
    """Held: a bulk cancel over a batch's members ends the batch: its on_complete callback is
    stored once, after the count, so the walk (which lists a batch's callbacks too) leaves it
    alone; the chunk walked again (a lost worker) cancels nothing twice nor fires it again."""
    waiting = (TaskStatus.CREATED, TaskStatus.PENDING)
    executor.submit_batch(
        [
            TaskSubmitRequest("demo.noop", task_id=f"m-{n}", queue="b", delay_millis=HOUR_MS)
            for n in range(7)
        ],
        batch_id="bb",
        on_complete=TaskSubmitRequest("demo.noop", task_id="cb", queue="b"),
    )
    until = clock.now()
    clock.advance(1)
    state = walk(executor, "cancel", {"batch_id": "bb"}, until=until, chunk=3)
    assert (state.examined, state.changed) == (7, 7), state
    batch = executor.get_batch("bb")
    assert batch.finished and batch.cancelled == 7
    assert executor.get_task("cb").status in waiting
    # walked again from the start, as after a worker lost before its first checkpoint
    again = walk(executor, "cancel", {"batch_id": "bb"}, until=until, chunk=3)
    assert (again.examined, again.changed) == (7, 0), again
    assert again.skipped == {"CANCELLED cannot be cancelled": 7}
    assert ids(executor.list_tasks(batch_id="bb", statuses=waiting)) == ["cb"]
    assert redis_problems(alias, storage) == []


def test_a_bulk_retry_of_dead_batch_members_reopens_the_batch_and_fires_its_callback_again(
    executor, storage, clock
):
    """Held: two members that ended FAILED (the batch finished, on_complete stored), retried
    by a bulk action: the batch reopens (pending 2), and when they end again the callback is
    not stored a second time beside the first."""
    executor.submit_batch(
        [
            TaskSubmitRequest(
                "demo.always_fails", None, task_id=f"f-{n}", queue="bf", retry_limit=0
            )
            for n in range(2)
        ],
        batch_id="bf",
        on_complete=TaskSubmitRequest("demo.noop", task_id="bf-cb", queue="cb"),
    )
    for claim in storage.claim("w1", ["bf"], 10, LEASE):
        started = storage.start(claim, LEASE)
        assert storage.fail(started, "boom", retryable=False) is not None
    assert executor.get_batch("bf").finished
    assert executor.get_task("bf-cb") is not None
    clock.advance(1)
    state = walk(executor, "retry", {**DEAD, "batch_id": "bf"})
    assert state.changed == 2, state
    batch = executor.get_batch("bf")
    assert (batch.failed, batch.pending) == (0, 2)
    for claim in storage.claim("w1", ["bf"], 10, LEASE):
        started = storage.start(claim, LEASE)
        assert storage.fail(started, "boom", retryable=False) is not None
    assert executor.get_batch("bf").finished
    assert len(executor.list_tasks(queue="cb")) == 1


def test_a_bulk_cancel_of_a_dependency_cascades_to_its_dependent_outside_the_filter(
    executor, storage, clock
):
    """Held: cancelling a dependency (queue "dep-a") cancels its waiting dependent in another
    queue, as a cancel by hand does; the walk counts only the task it acted on."""
    executor.submit("demo.noop", None, task_id="parent", queue="dep-a", delay_millis=HOUR_MS)
    executor.submit("demo.noop", None, task_id="child", queue="dep-b", depends_on=["parent"])
    executor.submit("demo.noop", None, task_id="runner", queue="dep-b", depends_on=["parent"])
    state = walk(executor, "cancel", {"queue": "dep-a"})
    assert (state.examined, state.changed) == (1, 1), state
    assert statuses(executor, ["parent", "child", "runner"]) == {"CANCELLED": 3}


def test_a_bulk_retry_of_a_dead_unique_task_does_not_take_its_key_from_the_newer_holder(
    executor, storage, clock
):
    """Held as documented (flow-control.md, unique tasks): the dead letter's key was taken by
    a newer task; the bulk retry makes the old one live again without its key: a submit of
    the key still answers the newer one, and once the newer one ended, a new task."""
    unique = {"unique_key": "inv-1", "unique_for": 3600}
    dead_letters(executor, ["old"], "u", **unique)
    clock.advance(1)
    newer = executor.submit(
        "demo.always_fails", {"i": 1}, task_id="new", queue="u2", delay_millis=HOUR_MS, **unique
    )
    assert newer.task_id == "new"
    state = walk(executor, "retry", {**DEAD, "queue": "u"})
    assert (state.examined, state.changed) == (1, 1), state
    assert executor.get_task("old").status is TaskStatus.PENDING
    again = executor.submit("demo.always_fails", {"i": 2}, queue="u2", **unique)
    assert again.task_id == "new"
    assert executor.cancel_task("new")
    third = executor.submit("demo.always_fails", {"i": 3}, queue="u2", **unique)
    assert third.task_id not in ("old", "new")


def test_a_bulk_retry_of_keyed_dead_letters_keeps_the_per_key_cap(executor, storage, clock):
    """Held: demo.keyed (2 at a time per concurrency key): 5 dead letters of key A retried
    together (one statement on the databases) are claimed 2 at a time, the others wait."""
    task_ids = [f"k-{n}" for n in range(5)]
    dead_letters(executor, task_ids, "keyed", name="demo.keyed", concurrency_key="A")
    state = walk(executor, "retry", {**DEAD, "queue": "keyed"}, chunk=10)
    assert state.changed == 5, state
    claims = storage.claim(
        "w1", ["keyed"], 10, LEASE, key_limits=key_limits(), name_limits=name_limits()
    )
    assert len(claims) == 2, ids(claims)


def test_a_bulk_retry_of_rate_limited_dead_letters_keeps_the_rate(executor, storage, clock):
    """Held: demo.noop_hourly (1 an hour): 3 dead letters (one an hour) retried by one walk;
    a claim under the rate limit takes one of them."""
    executor.submit_many(
        [
            TaskSubmitRequest("demo.noop_hourly", task_id=f"r-{n}", queue="rated", retry_limit=0)
            for n in range(3)
        ]
    )
    for _ in range(3):
        [claim] = storage.claim("setup", ["rated"], 10, LEASE, rate_limits=rate_limits(), start=1)
        # (Redis starts it in the claim's own call)
        running = claim.task.status is TaskStatus.RUNNING
        started = claim if running else storage.start(claim, LEASE)
        assert storage.fail(started, "ValueError: boom", retryable=False) is not None
        clock.advance(3601)
    state = walk(executor, "retry", {**DEAD, "queue": "rated"})
    assert state.changed == 3, state
    claims = storage.claim("w1", ["rated"], 10, LEASE, rate_limits=rate_limits(), start=10)
    assert len(claims) == 1, ids(claims)


def test_a_debounced_tasks_index_entries_follow_its_latest_parameter(
    alias, executor, storage, clock
):
    """Held: a debounced submit that joins the waiting task replaces its parameter index
    entries: the first parameter's value finds nothing (list, count, bulk walk), the latest's
    finds the task, one entry per searchable key is stored."""
    service = indexed(executor)
    first = service.submit(
        "demo.echo", {"customer_id": 1, "region": "eu"}, debounce=10, unique_key="k", tags=["d"]
    )
    clock.advance(1)
    joined = service.submit(
        "demo.echo", {"customer_id": 2, "region": "eu"}, debounce=10, unique_key="k", tags=["d"]
    )
    assert joined.task_id == first.task_id and joined.debounced
    assert service.list_tasks(parameter={"customer_id": 1}) == []
    assert ids(service.list_tasks(parameter={"customer_id": 2})) == [first.task_id]
    assert ids(service.list_tasks(parameter={"customer_id": 2}, tag="d")) == [first.task_id]
    count = bulk_actions.count_up_to
    assert count(service, {"parameter": {"customer_id": 1}}) == TaskCount(0)
    assert count(service, {"parameter": {"customer_id": 2}, "tag": "d"}) == TaskCount(1)
    expected = 0 if alias == "postgres" else 2  # PostgreSQL reads its GIN index instead
    assert parameter_entries(alias, storage) == expected
    assert walk(service, "cancel", {"parameter": {"customer_id": 1}}).examined == 0
    state = walk(service, "cancel", {"parameter": {"customer_id": 2}})
    assert state.changed == 1, state
    assert redis_problems(alias, storage) == []


def test_a_refused_member_of_submit_many_leaves_no_tag_nor_index_entry(
    alias, executor, storage, clock
):
    """Held: submit_many whose second request names a dependency that does not exist is
    refused whole: the first request's tags and parameter index entries are not stored."""
    service = indexed(executor)
    service.submit("demo.echo", {"customer_id": 1}, task_id="kept", tags=["t"])
    before = (parameter_entries(alias, storage), tag_entries(alias, storage))
    with pytest.raises(TaskSubmitError):
        service.submit_many(
            [
                TaskSubmitRequest("demo.echo", {"customer_id": 2}, task_id="a", tags=("t",)),
                TaskSubmitRequest(
                    "demo.echo",
                    {"customer_id": 3},
                    task_id="b",
                    tags=("t",),
                    depends_on=["missing"],
                ),
            ]
        )
    assert service.get_task("a") is None and service.get_task("b") is None
    assert (parameter_entries(alias, storage), tag_entries(alias, storage)) == before
    assert ids(service.list_tasks(tag="t")) == ["kept"]
    assert service.list_tasks(parameter={"customer_id": 2}) == []
    assert redis_problems(alias, storage) == []


def test_a_batch_callback_stored_when_the_batch_ends_is_found_by_its_indexed_parameter(
    alias, executor, storage, clock
):
    """Held: the members and the on_complete callback (stored by the storage when the last
    member ends, not by a submit) carry their tags and parameter index entries: an indexed
    search and a tag search find the callback, and a bulk cancel over the search cancels it."""
    service = indexed(executor)
    service.submit_batch(
        [
            TaskSubmitRequest("demo.noop", task_id=f"bm-{n}", queue="bm", tags=("members",))
            for n in range(3)
        ],
        batch_id="bx",
        on_complete=TaskSubmitRequest(
            "demo.echo",
            {"customer_id": 77, "region": "eu"},
            task_id="bx-cb",
            queue="later",
            tags=("report",),
            delay_millis=HOUR_MS,
        ),
    )
    assert service.list_tasks(parameter={"customer_id": 77}) == []  # not stored yet
    for claim in storage.claim("w1", ["bm"], 10, LEASE):
        started = storage.start(claim, LEASE)
        assert storage.complete(started, None) is not None
    assert service.get_batch("bx").finished
    found = service.list_tasks(parameter={"customer_id": 77, "region": "eu"})
    assert ids(found) == ["bx-cb"]
    assert ids(service.list_tasks(tag="report", parameter={"customer_id": 77})) == ["bx-cb"]
    assert ids(service.list_tasks(tag="members")) == ["bm-2", "bm-1", "bm-0"]
    expected = 0 if alias == "postgres" else 2
    assert parameter_entries(alias, storage) == expected
    clock.advance(1)
    state = walk(service, "cancel", {"parameter": {"customer_id": 77}})
    assert (state.examined, state.changed) == (1, 1), state
    assert redis_problems(alias, storage) == []


def test_the_purge_removes_a_tasks_parameter_index_entries(alias, executor, storage, clock):
    """Held: a purged task's parameter index entries go with it; the same id submitted again
    is found by its new value only."""
    service = indexed(executor)
    service.submit("demo.noop", None, task_id="plain", queue="p")
    service.submit("demo.echo", {"customer_id": 1, "region": "eu"}, task_id="gone", queue="p")
    service.submit("demo.echo", {"customer_id": 2}, task_id="kept", queue="k")
    for claim in storage.claim("w1", ["p"], 10, LEASE):
        started = storage.start(claim, LEASE)
        assert storage.complete(started, None) is not None
    expected = 0 if alias == "postgres" else 3
    assert parameter_entries(alias, storage) == expected
    clock.advance(10)
    assert storage.purge_finished(clock.now(), 10) == 2
    assert parameter_entries(alias, storage) == (0 if alias == "postgres" else 1)
    assert service.list_tasks(parameter={"customer_id": 1}) == []
    service.submit("demo.echo", {"customer_id": 3}, task_id="gone", queue="p")
    assert service.list_tasks(parameter={"customer_id": 1}) == []
    assert service.list_tasks(parameter={"region": "eu"}) == []
    assert ids(service.list_tasks(parameter={"customer_id": 3})) == ["gone"]
    assert redis_problems(alias, storage) == []


def test_the_walk_and_the_search_pass_over_text_no_store_holds(executor, storage, clock):
    """Held: a tag or parameter value holding NUL or a lone surrogate matches nothing: the
    list, the count and the walk answer nothing, and no storage raises."""
    executor.submit("demo.echo", {"note": "a"}, task_id="t", tags=["a"], delay_millis=HOUR_MS)
    for filters in (
        {"tag": "a\x00"},
        {"tag": "\ud800"},
        {"parameter": {"note": "a\x00"}},
        {"parameter": {"note": "\udc80"}},
        {"parameter": {"no\x00te": "a"}},
    ):
        assert executor.list_tasks(**filters) == [], filters
        assert bulk_actions.count_up_to(executor, filters) == TaskCount(0), filters
        assert walk(executor, "cancel", filters).examined == 0, filters
    assert executor.get_task("t").status is TaskStatus.CREATED


@pytest.mark.parametrize("alias", db_params(["default"]), indirect=True)
def test_a_bulk_action_over_text_no_store_holds_is_refused_naming_the_filter(
    executor, storage, clock
):
    """start_bulk_action's contract: a ValueError naming what was wrong, nothing stored. A
    filter holding text no storage can hold matches nothing (the count is 0); starting a bulk
    action over it should be refused naming that filter, before the bulk action's own
    submit refuses its parameter. Today the message is the bulk action's own submit's,
    "task_parameter is not JSON-serialisable: $.filters.tag contains NUL, ...", which the
    admin shows as "Nothing was started: task_parameter is not JSON-serialisable ...".
    (The check is the service's, before any storage: SQLite stands for all four.)"""
    messages = []
    for filters in ({"tag": "a\x00b"}, {"tag": "\ud800"}, {"parameter": {"note": "a\x00"}}):
        with pytest.raises(ValueError) as raised:
            bulk_actions.start_bulk_action(
                executor, "cancel", filters, total=0, until=clock.now(), queue="ops"
            )
        messages.append((next(iter(filters)), str(raised.value)))
    assert executor.list_tasks(task_name=BULK_ACTION) == []
    for name, message in messages:
        assert "task_parameter" not in message, message  # the bulk action's own field
        assert f"filter {name}" in message, message


def test_a_walks_checkpoint_stays_the_size_of_a_chunk_over_tasks_submitted_together(
    executor, storage, clock
):
    """Held: the walk's cursor keeps the id of every task it handled at the cursor's creation
    time (WalkState.cursor_ids), which would grow with the total if many tasks shared one
    time; submit_many gives each of its tasks its own microsecond, so over 300 tasks of one
    submit_many walked 20 at a time each checkpoint stays small."""
    task_ids = [f"same-{n:04d}" for n in range(300)]
    dead_letters(executor, task_ids, "same")
    sizes: list[int] = []
    state = walk(
        executor,
        "retry",
        {**DEAD, "queue": "same"},
        chunk=20,
        between=lambda n, s: sizes.append(len(json.dumps(s.to_json()))),
    )
    assert (state.examined, state.changed) == (300, 300), state
    print("checkpoint sizes in characters, chunk by chunk:", sizes)
    assert len(state.cursor_ids) <= 20 + 1, len(state.cursor_ids)
    assert max(sizes) < 1000, sizes


def test_numbers_past_double_precision_are_not_found_by_a_nearby_float(executor, storage, clock):
    """DEFECT (MariaDB, without the index): 2**53 + 1 and 2**53 are different JSON numbers
    (same_json compares them exactly, and so does the index's canonical text), but MariaDB's
    JSON_CONTAINS compares numbers as doubles: a search for 2**53 (int or float) finds the
    task holding 2**53 + 1. Any 64-bit id past 2**53 (snowflake ids) finds its neighbours.
    SQLite, PostgreSQL, Redis and every indexed search answer exactly."""
    service = indexed(executor)  # its submit writes the index entries
    service.submit("demo.echo", {"customer_id": 2**53 + 1, "order_id": 2**60 + 1}, task_id="big")
    for searching in (service, executor):  # with the index, then without it
        assert ids(searching.list_tasks(parameter={"customer_id": 2**53 + 1})) == ["big"]
        assert ids(searching.list_tasks(parameter={"order_id": 2**60 + 1})) == ["big"]
        for near in (2**53, float(2**53)):
            assert searching.list_tasks(parameter={"customer_id": near}) == [], near
        assert searching.list_tasks(parameter={"order_id": 2**60}) == []


# -- Redis sharded ----------------------------------------------------------------------------
QUEUES = [f"in-{n}" for n in range(5)]  # odd n covers all five


@pytest.fixture
def sharded(clock) -> Iterator[ReliableExecutor]:
    """A service over a Redis storage of 3 shards, KEYS searchable."""
    with sharded_redis_storage("console", 3, clock) as made:
        yield indexed(ReliableExecutor(made, clock=clock))


@pytest.mark.django_db(transaction=True, databases=["default"], available_apps=TASK_APPS)
def test_sharded_redis_walks_each_task_once_and_searches_every_shard(sharded, clock):
    """Held (Redis, 3 shards): 40 dead letters spread over the shards, tagged and indexed,
    found by tag and parameter on every shard, counted, retried 7 at a time: each once. The
    same confirmation twice, or another one counted later, starts one bulk action."""
    from tests.support.redis_support import index_problems

    service = sharded
    task_ids = [f"s-{n:02d}" for n in range(40)]
    service.submit_many(
        [
            TaskSubmitRequest(
                "demo.always_fails",
                {"customer_id": n % 2, "region": "eu"},
                task_id=t,
                queue=QUEUES[n % len(QUEUES)],
                retry_limit=0,
                tags=("sharded",),
            )
            for n, t in enumerate(task_ids)
        ]
    )
    layout = service.storage.layout  # type: ignore[attr-defined]
    assert len({layout.shard_of(queue) for queue in QUEUES}) >= 2  # spread over the shards
    while claims := service.storage.claim("setup", QUEUES, 100, LEASE):
        for claim in claims:
            started = service.storage.start(claim, LEASE)
            assert service.storage.fail(started, "boom", retryable=False) is not None
    filters = {**DEAD, "tag": "sharded", "parameter": {"customer_id": 1}}
    assert len(service.list_tasks(**filters)) == 20
    until = clock.now()
    assert bulk_actions.count_up_to(service, filters, None, until) == TaskCount(20)
    first, created = bulk_actions.start_bulk_action(
        service, "retry", filters, total=20, until=until, queue="ops"
    )
    again, created_again = bulk_actions.start_bulk_action(
        service, "retry", filters, total=20, until=until, queue="ops"
    )
    later, created_later = bulk_actions.start_bulk_action(
        service, "retry", filters, total=20, until=until + dt.timedelta(seconds=5), queue="ops"
    )
    assert (created, created_again, created_later) == (True, False, False)
    assert first.task_id == again.task_id == later.task_id
    state = walk(service, "retry", filters, until=until, chunk=7)
    assert (state.examined, state.changed) == (20, 20), state
    odd = task_ids[1::2]
    assert statuses(service, odd) == {"PENDING": 20}
    assert statuses(service, task_ids[0::2]) == {"FAILED": 20}
    assert index_problems(service.storage) == []


# -- B. the HTTP API's filters ---------------------------------------------------------------
@pytest.fixture(params=admin_params())
def api_service(request: pytest.FixtureRequest) -> Iterator[ReliableExecutor]:
    with api_executor(request.param, SEARCHABLE_PARAMETERS=list(KEYS)) as service:
        yield service


@pytest.fixture
def viewer(client: Client) -> Client:
    return login(client, "view_reliabletask")


def listed(client: Client, query: dict[str, str]) -> Any:
    return client.get(API, query)


def test_api_odd_and_huge_filter_values_answer_nothing_found_never_an_error(api_service, viewer):
    """Held: a tag or parameter value no task can have (NUL, a lone surrogate escaped in the
    JSON, 100,000 characters, past the tag's length, a digest-long indexed value) is a 200
    with no task, on every storage; the tasks stored are untouched."""
    api_service.submit("demo.echo", {"customer_id": 42}, task_id="one", tags=["t"])
    huge = "x" * 100_000
    for query in (
        {"tag": "a\x00b"},
        {"tag": huge},
        {"tag": "t" + "\N{EM DASH}" * 70},
        {"tag": "tag:t"},
        {"queue": "q\x00"},
        {"task_name": huge},
        {"parameter": json.dumps({"customer_id": "\ud800"})},
        {"parameter": json.dumps({"customer_id": "a\x00"})},
        {"parameter": json.dumps({"\x00": 1})},
        {"parameter": json.dumps({"customer_id": huge})},
        {"parameter": json.dumps({huge: 1})},
        {"parameter": json.dumps({"note": huge})},
        {"parameter": json.dumps({"customer_id": 2**200})},
    ):
        response = listed(viewer, query)
        assert response.status_code == 200, (str(query)[:80], response.content[:300])
        assert response.json()["tasks"] == [], str(query)[:80]
    assert ids(api_service.list_tasks()) == ["one"]
    found = listed(viewer, {"parameter": '{"customer_id": 42.0}', "tag": "t"})
    assert [t["task_id"] for t in found.json()["tasks"]] == ["one"]


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        '{"customer_id": NaN}',
        '{"customer_id": Infinity}',
        '{"customer_id": 1e999}',
        '{"customer_id": 1' + "0" * 5000 + "}",
        '{"customer_id": [42]}',
        '{"customer_id": {"a": 1}}',
    ],
    ids=["not-json", "nan", "infinity", "overflow", "5000-digits", "list", "object"],
)
def test_api_a_bad_parameter_filter_is_a_400_naming_parameter(api_service, viewer, text):
    """Held: each is a 400 whose field is "parameter"."""
    response = listed(viewer, {"parameter": text})
    assert response.status_code == 400, response.content[:300]
    assert response.json()["field"] == "parameter", response.json()


@pytest.fixture(params=admin_params(["default"]))
def sqlite_api(request: pytest.FixtureRequest) -> Iterator[ReliableExecutor]:
    """The API on SQLite: for what the API decides before any storage is asked."""
    with api_executor(request.param) as service:
        yield service


def test_api_a_bad_value_under_a_key_named_like_a_filter_is_blamed_on_parameter(sqlite_api, viewer):
    """DEFECT: api/tasks.py ``_list`` picks the 400's field as the first of LIST_FILTERS whose
    name the ValueError's text holds. A parameter filter's error quotes the key
    ("parameter['status'] is a dict ..."), so a key named "status", "tag", "queue" or
    "task_name" makes the 400 name that filter instead of "parameter". (Decided before any
    storage is asked: SQLite stands for all four.)"""
    fields = {}
    for key in ("status", "tag", "queue", "task_name"):
        response = listed(viewer, {"parameter": json.dumps({key: {"a": 1}})})
        assert response.status_code == 400, response.content[:300]
        fields[key] = response.json()["field"]
    assert fields == dict.fromkeys(fields, "parameter"), fields


def test_api_a_deeply_nested_parameter_filter_is_a_400_not_a_server_error(sqlite_api, viewer):
    """DEFECT: api/tasks.py ``query_parameter`` catches ValueError around json.loads, but a
    deeply nested text makes json.loads raise RecursionError: the request fails with a 500
    (the test client raises it) instead of a 400 naming ``parameter``. The submit body's
    parser (``json_object``) catches RecursionError; this one does not. (SQLite stands for
    all four: the storage is never asked.)"""
    response = listed(viewer, {"parameter": "[" * 100_000})
    assert response.status_code == 400, response.content[:300]
    assert response.json()["field"] == "parameter", response.json()


def test_a_huge_offset_or_page_is_a_400_or_an_empty_page_never_a_server_error(api_service, viewer):
    """DEFECT: an offset past any 64-bit integer reaches the storage, which raises: the API's
    ``GET tasks/?offset=`` (api/tasks.py query_int has no maximum for it) and the admin's
    list ``?page=`` (task_pages.Filters.from_query takes any page; the offset is
    (page - 1) * 100) answer a 500 (SQLite "datatype mismatch", PostgreSQL "bigint out of
    range", MariaDB a syntax error, Redis "value is not an integer or out of range"), where a
    200 with no task, or a 400 naming ``offset``, was expected. ``list_tasks`` itself checks
    only ``offset >= 0`` (service/listing.py plausible_filters)."""
    api_service.submit("demo.echo", {"customer_id": 42}, task_id="one", tags=["t"])
    answers = {}
    for name, query in (
        ("30 digits", {"offset": "9" * 30}),
        ("2**63", {"offset": str(2**63)}),
        ("2**63 with a tag", {"offset": str(2**63), "tag": "t"}),
        ("2**63 with a parameter", {"offset": str(2**63), "parameter": '{"customer_id": 42}'}),
    ):
        try:
            response = listed(viewer, query)
        except Exception as exc:  # the test client raises what the view raised: a 500
            answers[name] = f"500 {type(exc).__name__}"
            continue
        refused = response.status_code == 400 and response.json()["field"] == "offset"
        empty = response.status_code == 200 and response.json()["tasks"] == []
        ok = refused or empty
        answers[name] = "ok" if ok else f"{response.status_code} {response.content[:100]!r}"
    admin = login(Client(), "view_reliabletask")
    try:
        page = admin.get(LIST_URL, {"page": str(10**20)})
        answers["admin page 10**20"] = "ok" if page.status_code in (200, 302) else page.status_code
    except Exception as exc:
        answers["admin page 10**20"] = f"500 {type(exc).__name__}"
    wrong = "; ".join(f"{name}: {answer}" for name, answer in answers.items() if answer != "ok")
    assert not wrong, wrong
