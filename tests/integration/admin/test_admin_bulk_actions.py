"""Bulk actions over a whole filter (service/bulk_actions.py, admin/bulk_pages.py) on every
storage: a retry or cancel walked a small chunk at a time by the app's own task, started once
however often it is submitted, each task acted on once, its progress counted in the storage;
bad filters refused with nothing stored; the pages behind the admin's permissions."""

from __future__ import annotations

import datetime as dt
from html import unescape
from typing import Any

import pytest
from django.test import override_settings

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.states import DEAD_LETTER_STATUSES, TaskStatus
from django_reliable_executor.core.task_count import TaskCount
from django_reliable_executor.service import bulk_actions
from django_reliable_executor.service.bulk_walk import (
    BULK_ACTION,
    BulkAction,
    WalkState,
    act_chunk,
    plan_chunk,
    walk_chunk,
)
from django_reliable_executor.testing import run_tasks
from tests.support.admin_support import (
    BATCH_FAILED,
    LIST_URL,
    admin_params,
    executor_on,
    finished_batch,
    make_user,
)
from tests.support.contract_support import LEASE, claim_and_start, run_claims

DEAD = {"statuses": sorted(s.value for s in DEAD_LETTER_STATUSES)}
BULK_URL = LIST_URL + "bulk/"
# The bulk actions' own queue in these tests: run_tasks runs only it.
OPS = "ops"


def failed(service: Any, n: int, prefix: str, name: str = "demo.always_fails") -> list[str]:
    """``n`` tasks of queue "in" that ended FAILED (one attempt each), oldest first."""
    ids = [f"{prefix}{i:04d}" for i in range(n)]
    service.submit_many(
        [
            TaskSubmitRequest(name, {"i": i}, task_id=t, queue="in", retry_limit=0)
            for i, t in enumerate(ids)
        ]
    )
    run_claims(service, service.storage.claim("w1", ["in"], n, LEASE))
    return ids


def statuses(service: Any, ids: list[str]) -> dict[str, int]:
    found = service.storage.get_many(ids)
    counts: dict[str, int] = {}
    for task in found.values():
        counts[task.status.value] = counts.get(task.status.value, 0) + 1
    return counts


def start(service: Any, action: str, filters: dict, until: dt.datetime, **options: Any):
    total = bulk_actions.count_matching(service, filters, options.get("since"), until)
    return bulk_actions.start_bulk_action(
        service, action, filters, total=total, until=until, queue=OPS, chunk=40, **options
    )


@pytest.fixture(params=admin_params())
def service(request: pytest.FixtureRequest):
    with executor_on(request.param) as service:
        yield service


def test_a_retry_submitted_twice_retries_each_dead_letter_once(service):
    ids = failed(service, 100, "inv-", "demo.always_fails")
    others = failed(service, 5, "other-", "demo.flaky")  # dead letters of another name
    filters = {**DEAD, "task_name": "demo.always_fails"}
    until = service.clock.now()
    assert bulk_actions.count_matching(service, filters, None, until) == 100

    first, created = start(service, "retry", filters, until)
    again, created_again = start(service, "retry", filters, until)  # a double click
    # Another operator's confirmation (counted later) while the first has not finished.
    other, created_other = start(service, "retry", filters, until + dt.timedelta(seconds=5))
    assert (created, created_again, created_other) == (True, False, False)
    assert first.task_id == again.task_id == other.task_id
    assert [t.task_id for t in service.list_tasks(task_name=BULK_ACTION)] == [first.task_id]
    assert bulk_actions.bulk_status(service, first.task_id).waits_for is not None  # no worker

    ran = run_tasks(queues=[OPS])
    assert [t.task_id for t in ran] == [first.task_id]
    done = service.get_task(first.task_id)
    assert done.status is TaskStatus.COMPLETED, done.last_error
    assert done.result == {
        "action": "retry",
        "total": 100,
        "examined": 100,
        "changed": 100,
        "cancel_requested": 0,
        "skipped": {},
        "cut_short": False,
    }
    assert done.progress["current"] == 100 and done.progress["total"] == 100
    assert [s.name for s in done.steps] == [  # 40 a chunk, each planned then acted on
        f"{kind}-{n}" for n in range(1, 4) for kind in ("plan", "chunk")
    ]
    assert statuses(service, ids) == {"PENDING": 100}
    assert statuses(service, others) == {"FAILED": 5}

    # They fail again; the same confirmation submitted once more finds its task ended and
    # starts nothing: each was retried once.
    run_claims(service, service.storage.claim("w1", ["in"], 200, LEASE))
    assert statuses(service, ids) == {"FAILED": 100}
    _, created_late = start(service, "retry", filters, until)
    assert created_late is False
    assert run_tasks(queues=[OPS]) == []
    assert statuses(service, ids) == {"FAILED": 100}
    assert {service.get_task(i).attempts for i in ids} == {2}


def test_a_cancel_over_a_tag_cancels_the_waiting_and_asks_the_running_to_stop(service):
    tagged = [
        TaskSubmitRequest(
            "demo.noop",
            task_id=f"imp-{i:03d}",
            queue="import",
            tags=("customer:42",),
            delay_millis=3_600_000,
        )
        for i in range(90)
    ]
    service.submit_many(
        [
            TaskSubmitRequest("demo.noop", task_id="run-1", queue="import", tags=("customer:42",)),
            *tagged,
            TaskSubmitRequest(
                "demo.noop",
                task_id="imp-43",
                queue="import",
                tags=("customer:43",),
                delay_millis=3_600_000,
            ),
        ]
    )
    claim_and_start(service.storage, queue="import")  # run-1: the only one due
    filters = {"queue": "import", "tag": "customer:42"}
    task, _ = start(service, "cancel", filters, service.clock.now())
    run_tasks(queues=[OPS])
    done = service.get_task(task.task_id)
    assert done.result["changed"] == 90 and done.result["cancel_requested"] == 1, done.result
    assert statuses(service, [r.task_id for r in tagged]) == {"CANCELLED": 90}
    running = service.get_task("run-1")
    assert running.status is TaskStatus.RUNNING and running.cancel_requested
    assert service.get_task("imp-43").status is TaskStatus.CREATED


def test_a_cancel_over_a_parameter_search_cancels_only_its_tasks(service):
    service.submit_many(
        [
            TaskSubmitRequest(
                "demo.echo",
                {"customer_id": 42 + i % 2, "n": i},
                task_id=f"p-{i:03d}",
                queue="p",
                delay_millis=3_600_000,
            )
            for i in range(60)
        ]
    )
    filters = {"queue": "p", "parameter": {"customer_id": 42}}
    assert bulk_actions.count_matching(service, filters) == 30
    task, _ = start(service, "cancel", filters, service.clock.now())
    run_tasks(queues=[OPS])
    assert service.get_task(task.task_id).result["changed"] == 30
    ids = [f"p-{i:03d}" for i in range(60)]
    assert statuses(service, ids[0::2]) == {"CANCELLED": 30}
    assert statuses(service, ids[1::2]) == {"CREATED": 30}


def test_a_bulk_retry_reopens_batch_members_and_skips_a_dependent_saying_why(service):
    with finished_batch(service):
        service.submit("demo.always_fails", None, task_id="dep-a", queue="dep", retry_limit=0)
        service.submit("demo.echo", None, task_id="dep-b", queue="dep", depends_on=["dep-a"])
        run_claims(service, service.storage.claim("w1", ["dep"], 5, LEASE))
        assert service.get_task("dep-b").status is TaskStatus.CANCELLED
        now = service.clock.now()
        members, _ = start(service, "retry", {**DEAD, "batch_id": "imp/1"}, now)
        dependents, _ = start(service, "retry", {"queue": "dep"}, now)
        run_tasks(queues=[OPS])
        assert service.get_task(members.task_id).result["changed"] == 2
        assert statuses(service, BATCH_FAILED) == {"PENDING": 2}
        batch = service.get_batch("imp/1")
        assert (batch.failed, batch.pending, batch.finished) == (0, 2, True)
        done = service.get_task(dependents.task_id).result
        assert done["changed"] == 1, done  # dep-a; dep-b (newer) came first: refused
        assert done["skipped"] == {"a dependency ended otherwise than COMPLETED": 1}
        assert service.get_task("dep-a").status is TaskStatus.PENDING


def test_since_leaves_older_tasks_out_of_the_count_and_the_walk(service):
    ids = [f"s-{i:02d}" for i in range(30)]
    for task_id in ids:  # one by one: each its own creation time, oldest first
        service.submit("demo.echo", None, task_id=task_id, queue="s", delay_millis=3_600_000)
    since = service.get_task(ids[20]).created_at
    filters = {"queue": "s", "status": "CREATED"}
    assert bulk_actions.count_matching(service, filters, since) == 10
    task, _ = start(service, "cancel", filters, service.clock.now(), since=since)
    run_tasks(queues=[OPS])
    assert service.get_task(task.task_id).result["examined"] == 10
    assert statuses(service, ids[20:]) == {"CANCELLED": 10}
    assert statuses(service, ids[:20]) == {"CREATED": 20}


def test_the_storage_counts_a_filter_in_its_window_and_stops_at_the_cap(service):
    ids = [f"c-{i:02d}" for i in range(30)]
    for i, task_id in enumerate(ids):  # one by one: each its own creation time, oldest first
        tags = ["odd"] if i % 2 else []
        service.submit("demo.echo", {"i": i % 3}, task_id=task_id, queue="c", tags=tags)
    created = [service.get_task(i).created_at for i in ids]
    name = {"task_name": "demo.echo"}
    count = bulk_actions.count_up_to
    assert count(service, name, cap=100) == TaskCount(30, complete=True)
    assert count(service, name, cap=30) == TaskCount(30, complete=False)  # it stopped there
    assert count(service, name, cap=7).words() == "at least 7"
    # The window: since and until both included; an until before the newest ten (Redis reads
    # the indexes again, further, past the tasks newer than until).
    assert count(service, name, created[5], created[19], cap=100) == TaskCount(15)
    assert count(service, name, None, created[19], cap=12) == TaskCount(12, complete=False)
    assert count(service, name, None, created[19], cap=21) == TaskCount(20)
    # The list's own filters: a tag, a parameter, a status none has.
    assert count(service, {"tag": "odd"}, cap=100) == TaskCount(15)
    assert count(service, {"parameter": {"i": 1}, "queue": "c"}, cap=100) == TaskCount(10)
    assert count(service, {**name, "status": "FAILED"}, created[0], cap=100) == TaskCount(0)
    assert bulk_actions.count_matching(service, name, created[10]) == 20


def test_the_walk_acts_once_on_each_task_while_the_list_shifts_under_it(service):
    dead = failed(service, 40, "x-")
    completed = [f"ok-{i:03d}" for i in range(40)]  # newer: the walk meets them first
    service.submit_many(
        [TaskSubmitRequest("demo.echo", i, task_id=i, queue="in") for i in completed]
    )
    run_claims(service, service.storage.claim("w1", ["in"], 100, LEASE))
    until = service.clock.now()
    bulk = BulkAction("retry", {"queue": "in"}, None, until, 80, chunk=20)
    reports: list[int] = []
    state = WalkState()
    for _ in range(3):  # the 40 completed (skipped, still listed), then 20 dead letters
        state = walk_chunk(service, bulk, state, lambda s: reports.append(s.examined))
    assert (state.examined, state.changed, state.done) == (60, 20, False)
    # Meanwhile the completed ones are purged (every task before the walk's offset leaves
    # the list) and the 20 it retried fail again (listed again, where it went past them).
    assert service.purge_finished(until + dt.timedelta(hours=1), statuses=["COMPLETED"]) == 40
    run_claims(service, service.storage.claim("w1", ["in"], 100, LEASE))
    assert statuses(service, dead) == {"FAILED": 40}
    while not state.done:
        state = walk_chunk(service, bulk, state, lambda s: reports.append(s.examined))
    assert (state.examined, state.changed) == (80, 40), state
    assert state.skipped == {"COMPLETED cannot be retried": 40}
    assert reports[-1] == 80
    assert statuses(service, dead) == {"PENDING": 20, "FAILED": 20}  # each retried once


def test_a_chunk_whose_checkpoint_was_lost_is_acted_on_again_from_its_stored_plan(service):
    """The walk's worker dies after a chunk's retries but before its checkpoint. The retried
    tasks have left the dead-letters filter, so a new listing would never meet them again:
    the chunk acts again on its stored plan, finds them retried and skips them, and the walk
    ends having examined every task it counted (docs/admin.md: the chunk under way is walked
    again)."""
    dead = failed(service, 30, "plan-")
    until = service.clock.now()
    bulk = BulkAction("retry", {**DEAD, "queue": "in"}, None, until, 30, chunk=20)
    stored = WalkState()  # the last checkpoint: before the chunk
    plan = plan_chunk(service, bulk, stored)  # stored as the chunk's first step
    assert len(plan.new) == 20
    lost = act_chunk(service, bulk, WalkState.from_json(stored.to_json()), plan, lambda s: None)
    assert lost.changed == 20  # and then the worker died: this state was never stored
    state = act_chunk(service, bulk, WalkState.from_json(stored.to_json()), plan, lambda s: None)
    while not state.done:
        state = walk_chunk(service, bulk, state, lambda s: None)
    assert (state.examined, state.changed) == (30, 10), state
    assert state.skipped == {"PENDING cannot be retried": 20}
    assert statuses(service, dead) == {"PENDING": 30}
    attempts = {task.attempts for task in service.storage.get_many(dead).values()}
    assert attempts == {1}  # each retried once: none ran again


def test_a_chunk_walked_again_after_a_lost_worker_retries_nothing_twice(service):
    """The walk's worker dies after a chunk's retries but before its checkpoint: the chunk is
    walked again from the last stored state, by which time the tasks it retried have run and
    failed again. They ended after the count, so they are left alone, not retried twice."""
    dead = failed(service, 30, "lost-")
    until = service.clock.now()
    bulk = BulkAction("retry", {"queue": "in"}, None, until, 30, chunk=20)
    stored = WalkState()  # the last checkpoint: before the chunk
    lost = walk_chunk(service, bulk, WalkState.from_json(stored.to_json()), lambda s: None)
    assert lost.changed == 20
    run_claims(service, service.storage.claim("w1", ["in"], 100, LEASE))  # they fail again
    assert statuses(service, dead) == {"FAILED": 30}
    state = WalkState.from_json(stored.to_json())
    while not state.done:
        state = walk_chunk(service, bulk, state, lambda s: None)
    assert (state.examined, state.changed) == (30, 10), state
    assert state.skipped == {"ended after the count": 20}
    attempts = {task.task_id: task.attempts for task in service.storage.get_many(dead).values()}
    assert sorted(attempts.values()) == [1] * 10 + [2] * 20  # none retried twice
    assert statuses(service, dead) == {"PENDING": 10, "FAILED": 20}


def test_bad_filters_are_refused_naming_them_and_nothing_is_stored(service):
    until = service.clock.now()
    for filters, words in (
        ({"status": "DEAD"}, "unknown status 'DEAD'"),
        ({"colour": "red"}, "unknown filter 'colour'"),
        ({"statuses": "FAILED"}, "statuses must be a collection"),
        ({"task_name": 42}, "task_name"),
    ):
        with pytest.raises(ValueError, match=words):
            bulk_actions.start_bulk_action(service, "retry", filters, total=1, until=until)
    with pytest.raises(ValueError, match="unknown bulk action 'delete'"):
        bulk_actions.start_bulk_action(service, "delete", DEAD, total=1, until=until)
    with pytest.raises(ValueError, match="until must be an aware datetime"):
        bulk_actions.start_bulk_action(
            service, "retry", DEAD, total=1, until=dt.datetime(2026, 1, 1)
        )
    assert service.list_tasks() == []


# -- the pages ----------------------------------------------------------------------------------
@pytest.fixture(params=admin_params(["default"]))
def sqlite_service(request: pytest.FixtureRequest):
    with executor_on(request.param) as service:
        yield service


def test_a_viewer_sees_the_count_but_cannot_start_and_an_operator_can(sqlite_service, client):
    service = sqlite_service
    failed(service, 3, "v-")
    client.force_login(make_user("viewer", "view_reliabletask"))
    listed = client.get(LIST_URL, {"status": "dead"}).content.decode()
    assert f'href="{BULK_URL}?status=dead&amp;action=retry"' in listed
    page = client.get(BULK_URL, {"action": "retry", "status": "dead"})
    assert page.status_code == 200
    text = page.content.decode()
    assert (
        'data-total="3"' in text and "re-bulk-view-only" in text and "re-bulk-confirm" not in text
    )
    posted = client.post(
        BULK_URL,
        {
            "action": "retry",
            "status": "dead",
            "total": "3",
            "until": service.clock.now().isoformat(),
        },
    )
    assert posted.status_code == 403
    assert service.list_tasks(task_name=BULK_ACTION) == []

    client.force_login(make_user("operator", "view_reliabletask", "operate_reliabletask"))
    page = client.get(BULK_URL, {"action": "retry", "status": "dead"})
    assert "re-bulk-confirm" in page.content.decode()
    form = {"action": "retry", "status": "dead", "total": "3", "until": page.context["until"]}
    first = client.post(BULK_URL, form)
    second = client.post(BULK_URL, form)
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"]
    bulk = service.list_tasks(task_name=BULK_ACTION)
    assert len(bulk) == 1 and bulk[0].parameter["filters"] == DEAD
    status_page = client.get(first["Location"]).content.decode()
    assert "Waiting for a worker: no worker is running" in status_page
    # The viewer sees it but cannot stop it.
    client.force_login(make_user("viewer2", "view_reliabletask"))
    assert client.get(first["Location"]).status_code == 200
    assert client.post(first["Location"]).status_code == 403


def test_past_its_cap_the_confirmation_says_at_least(sqlite_service, operator, monkeypatch):
    from django_reliable_executor.admin.tasks import ReliableTaskAdmin

    failed(sqlite_service, 3, "cap-")
    query = {"action": "retry", "status": "dead", "task_name": "demo.always_fails"}
    monkeypatch.setattr(ReliableTaskAdmin, "bulk_count_cap", 2)
    text = unescape(operator.get(BULK_URL, query).content.decode())
    assert "Retry at least 2 tasks?" in text and 'data-total="2"' in text
    assert "Yes, retry at least 2 tasks" in text and "Counting stopped there" in text
    monkeypatch.setattr(ReliableTaskAdmin, "bulk_count_cap", 4)
    text = unescape(operator.get(BULK_URL, query).content.decode())
    assert "Retry at least" not in text and "Yes, retry 3 tasks" in text


def test_the_page_refuses_a_filter_the_list_would_drop(sqlite_service, operator):
    response = operator.get(BULK_URL, {"action": "retry", "status": "DEAD-ish"}, follow=True)
    assert "Nothing was started: unknown status 'DEAD-ish'." in unescape(response.content.decode())
    response = operator.post(BULK_URL, {"action": "purge", "status": "dead"}, follow=True)
    assert "choose an action: retry or cancel, not 'purge'" in unescape(response.content.decode())
    assert sqlite_service.list_tasks() == []


def test_since_with_an_offset_is_taken_in_utc_and_an_extreme_one_is_refused(
    sqlite_service, operator
):
    query = {"action": "retry", "status": "dead", "since": "2026-01-01T10:00:00+02:00"}
    page = unescape(operator.get(BULK_URL, query).content.decode())
    assert "submitted since 2026-01-01 08:00:00 UTC" in page
    for extreme in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        response = operator.get(BULK_URL, {**query, "since": extreme}, follow=True)
        assert response.status_code == 200
        assert "Nothing was started: submitted since: out of range" in unescape(
            response.content.decode()
        )
    assert sqlite_service.list_tasks() == []


def test_times_labelled_utc_are_shown_in_utc_whatever_the_time_zone(sqlite_service, operator):
    query = {"action": "retry", "status": "dead", "since": "2026-01-01 08:00"}
    with override_settings(TIME_ZONE="Asia/Tokyo"):  # UTC+9
        page = operator.get(BULK_URL, query)
    text = page.content.decode()
    # "Count again" sends this field back, read as UTC: it must not shift by 9 hours.
    assert 'name="since" id="re-since" value="2026-01-01 08:00:00"' in text
    assert 'name="since" value="2026-01-01T08:00:00+00:00"' in text
    counted = page.context["counted_at"].astimezone(dt.UTC)
    assert f"Counted at {counted:%Y-%m-%d %H:%M:%S} UTC" in text


def test_the_list_offers_cancel_all_only_where_a_cancel_can_change_a_task(sqlite_service, operator):
    sqlite_service.submit("demo.echo", None, task_id="waiting")
    offered = {
        query: 'id="re-bulk-cancel"' in operator.get(LIST_URL, {"status": query}).content.decode()
        for query in ("dead", "FAILED", "COMPLETED", "CANCELLED", "PENDING", "RUNNING")
    }
    assert offered == {
        "dead": False,
        "FAILED": False,
        "COMPLETED": False,
        "CANCELLED": False,
        "PENDING": True,
        "RUNNING": True,
    }
    by_queue = operator.get(LIST_URL, {"queue": "default"}).content.decode()
    assert 'id="re-bulk-cancel"' in by_queue and 'id="re-bulk-retry"' in by_queue
