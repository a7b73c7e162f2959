"""The schedule pages' plain words, next fire times and last 24 hours, and "run now" (service,
admin and HTTP API) on every storage (SQLite, MariaDB, PostgreSQL, Redis), with real users:
the viewer sees, the operator (``change_reliableschedule``) acts."""

from __future__ import annotations

import datetime as dt
import re
import threading
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from django_reliable_executor.admin import schedule_pages
from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.exceptions import UnknownScheduleError
from django_reliable_executor.master.schedule_firing import ScheduleFiring
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.admin_support import (
    admin_params,
    executor_on,
    fire_schedule,
    make_user,
    message_texts,
    populate_schedules,
    run_one,
)
from tests.support.api_support import api_executor

LIST_URL = reverse("admin:django_reliable_executor_reliableschedule_changelist")
API = "/executor/api/schedules/"
UTC = dt.timezone.utc
VIEW, CHANGE = "view_reliableschedule", "change_reliableschedule"


def detail_url(schedule_id: str) -> str:
    return reverse(
        "admin:django_reliable_executor_reliableschedule_change", args=[quote(schedule_id)]
    )


@pytest.fixture(params=admin_params())
def service(request: pytest.FixtureRequest):
    """The module executor on the backend under test, holding the admin's SCHEDULES."""
    with executor_on(request.param) as service:
        service.fired = populate_schedules(service)
        yield service


@pytest.fixture
def viewer(client):
    client.force_login(make_user("viewer", VIEW))
    return client


@pytest.fixture
def operator(client):
    client.force_login(make_user("operator", VIEW, CHANGE))
    return client


def runs(service: ReliableExecutor, schedule_id: str) -> list[str]:
    return sorted(t.task_id for t in service.list_tasks(schedule_id=schedule_id, limit=1000))


def row_html(html: str, schedule_id: str) -> str:
    found = re.search(rf'<tr data-schedule-id="{re.escape(schedule_id)}"(.*?)</tr>', html, re.S)
    assert found is not None, schedule_id
    return found.group(1)


# -- what the pages show -----------------------------------------------------------------------
def test_list_and_detail_show_the_words_the_fire_times_and_the_last_24_hours(service, viewer):
    html = viewer.get(LIST_URL).content.decode()
    nightly = row_html(html, "b-nightly")
    assert "every day at 03:00 (Europe/Paris)" in nightly
    assert 'title="cron 0 3 * * * (Europe/Paris)"' in nightly  # the literal form under the mouse
    local = r'<span class="re-nowrap">\w{3} \d{4}-\d\d-\d\d</span> <span class="re-nowrap">'
    assert re.search(r'class="re-next-local">' + local + r"03:00 CES?T</span>", nightly)
    assert re.search(r'\d\d</span> <span class="re-nowrap">0[12]:00 UTC</span>', nightly)
    assert "every hour" in row_html(html, "a-hourly")
    # Each row's last 24 hours is an image of its own: the list reads no run.
    image = re.search(r'<img class="re-hours" src="([^"]+)"', row_html(html, "a-hourly"))
    assert image is not None
    svg = viewer.get(image[1])
    assert svg.status_code == 200 and svg["Content-Type"].startswith("image/svg+xml")
    # a-hourly: one run completed and one failed, both just now; the others none ended.
    assert 'data-completed="1" data-failed="1" data-skipped="0"' in svg.content.decode()
    assert svg.content.decode().count("<rect ") == 2
    nightly_svg = viewer.get(schedule_pages.activity_url("b-nightly")).content.decode()
    assert 'data-completed="0" data-failed="0"' in nightly_svg
    assert viewer.get(schedule_pages.activity_url("nope")).status_code == 404

    page = viewer.get(detail_url("b-nightly"))
    html = page.content.decode()
    assert '<span id="re-words">every day at 03:00 (Europe/Paris)</span>' in html
    upcoming = page.context["upcoming"]
    assert len(upcoming) == 5
    now = dt.datetime.now(UTC)
    assert now < upcoming[0].at <= now + dt.timedelta(days=1)
    for fire, following in zip(upcoming, upcoming[1:], strict=False):
        assert following.at - fire.at in (dt.timedelta(hours=h) for h in (23, 24, 25))
    for fire in upcoming:
        assert fire.local in html and fire.utc in html
        assert " 03:00 CE" in fire.local
    assert 'data-completed="0" data-failed="0" data-skipped="0"' in html
    hourly = viewer.get(detail_url("a-hourly")).context["activity"]
    assert (hourly.completed, hourly.failed, hourly.skipped, hourly.partial) == (1, 1, 0, False)
    assert hourly.hours[-1].completed == 1 and hourly.hours[-1].failed == 1


def test_overlap_skips_are_counted_per_hour_by_the_masters_round(service, viewer):
    """The master's round that skips a run by overlap counts it in its hour; the page draws it."""
    start = dt.datetime.now(UTC).replace(microsecond=0) - dt.timedelta(seconds=30)
    service.schedule("e-skip", "contract.hook", every=10, start_at=start, overlap="skip")
    clock = FakeClock(dt.datetime.now(UTC) + dt.timedelta(seconds=10))  # its next run is due
    master = ScheduleFiring(ReliableExecutor(service.storage, clock=clock))
    (fired,) = [t for t in master.fire_due()[0] if t.task_id.startswith("e-skip@")]
    for _ in range(3):  # its run stays CREATED (no worker): the next ones are skipped
        clock.advance(10)
        assert [t for t in master.fire_due()[0] if t.task_id.startswith("e-skip@")] == []
    assert service.get_schedule("e-skip").overlap_skipped == 3
    hour = clock.now().replace(minute=0, second=0, microsecond=0)
    counted = service.storage.schedule_skips("e-skip", hour - dt.timedelta(hours=1))
    assert sum(counted.values()) == 3 and set(counted) <= {hour - dt.timedelta(hours=1), hour}
    assert service.storage.schedule_skips("a-hourly", hour) == {}
    page = viewer.get(detail_url("e-skip"))
    assert page.context["activity"].skipped == 3
    assert 'data-completed="0" data-failed="0" data-skipped="3"' in page.content.decode()
    assert "3 skipped (overlap)" in page.content.decode()
    assert runs(service, "e-skip") == [fired.task_id]
    # Counters older than a day are dropped with the next skip; zero counts store nothing.
    storage = service.storage
    now = dt.datetime.now(UTC)
    old = now - dt.timedelta(hours=30)
    storage.add_schedule_skips([("x", 2), ("y", 0)], old)
    storage.add_schedule_skips([("x", 1)], now)
    hour = now.replace(minute=0, second=0, microsecond=0)
    assert storage.schedule_skips("x", old - dt.timedelta(hours=1)) == {hour: 1}
    assert storage.schedule_skips("y", old) == {}


# -- run now: the service --------------------------------------------------------------------
def test_run_now_fires_one_run_beside_the_planned_ones(service):
    before = service.get_schedule("b-nightly")
    existing = runs(service, "b-nightly")
    task_id = service.run_schedule_now("b-nightly")
    assert re.fullmatch(r"b-nightly@\d{8}T\d{6}(\.\d{6})?Z", task_id)
    task = service.get_task(task_id)
    assert task.status is TaskStatus.CREATED and task.queue == "sched-b"
    assert task.parameter == {"n": 2}
    assert abs(task.run_at - dt.datetime.now(UTC)) < dt.timedelta(seconds=30)
    assert service.get_schedule("b-nightly") == before  # next run, last fire: untouched
    assert runs(service, "b-nightly") == sorted([*existing, task_id])
    # Pressed again while it waits: the same run, nothing more stored.
    assert service.run_schedule_now("b-nightly") == task_id
    assert runs(service, "b-nightly") == sorted([*existing, task_id])
    # Once it has run, a new press fires a new run.
    assert service.cancel_task(service.fired["b-nightly"][0])  # the planned fire, still due
    assert run_one(service, "sched-b") is TaskStatus.COMPLETED
    again = service.run_schedule_now("b-nightly")
    assert again != task_id and service.get_task(again).status is TaskStatus.CREATED
    # A paused schedule runs too (pausing stops the planned fires only).
    assert service.get_task(service.run_schedule_now("c-paused")).queue == "sched-c"
    assert service.get_schedule("c-paused").paused
    # An unknown id: a clear error, nothing stored.
    count = sum(service.count_by_status().values())
    with pytest.raises(UnknownScheduleError, match="no schedule 'nope'") as raised:
        service.run_schedule_now("nope")
    assert raised.value.field == "schedule_id"
    assert sum(service.count_by_status().values()) == count


def test_callers_at_once_get_one_run(service):
    results: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def press() -> None:
        try:
            barrier.wait()
            results.append(service.run_schedule_now("d-weekly"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=press) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(results)) == 1
    assert runs(service, "d-weekly") == sorted([*service.fired["d-weekly"], results[0]])


def test_run_now_in_the_second_of_a_planned_fire_leaves_that_fire_alone(service):
    """Run now at the very instant of a planned run: its id is a microsecond later, so the
    planned fire is stored (once) as well, and nothing else moves."""
    schedule = service.get_schedule("a-hourly")
    planned = schedule.next_run_at
    clocked = ReliableExecutor(service.storage, clock=FakeClock(planned))
    task_id = clocked.run_schedule_now("a-hourly")
    assert task_id == f"a-hourly@{planned:%Y%m%dT%H%M%S}.{planned.microsecond + 1:06d}Z"
    assert service.get_schedule("a-hourly") == schedule
    fire_id = fire_schedule(service, "a-hourly", planned)  # asserts it was newly stored
    assert fire_id != task_id
    assert service.get_task(fire_id).status is TaskStatus.CREATED
    assert clocked.run_schedule_now("a-hourly") == task_id  # still the one run by hand
    late = ReliableExecutor(service.storage, clock=FakeClock(planned + dt.timedelta(seconds=0.5)))
    assert late.run_schedule_now("a-hourly") == task_id


# -- run now: the admin ----------------------------------------------------------------------
def test_the_viewer_sees_no_run_now_and_may_not_post_it(service, viewer, monkeypatch):
    before = runs(service, "b-nightly")
    page = viewer.get(detail_url("b-nightly")).content.decode()
    assert 'id="re-run-now"' not in page and 'value="run_now"' not in page
    assert 'value="run_now"' not in viewer.get(LIST_URL).content.decode()
    assert viewer.post(detail_url("b-nightly"), {"action": "run_now"}).status_code == 403
    response = viewer.post(LIST_URL, {"action": "run_now", "_selected_action": ["b-nightly"]})
    assert response.status_code == 403
    assert runs(service, "b-nightly") == before
    # The list reads no run: each row's image does, and needs the view permission too.
    listed: list[Any] = []
    monkeypatch.setattr(service, "list_tasks", lambda *a, **k: listed.append(k) or [])
    assert viewer.get(LIST_URL).status_code == 200
    assert listed == []  # a page of 100 schedules costs no read of their runs
    viewer.get(schedule_pages.activity_url("a-hourly"))
    assert len(listed) == 1 and listed[0]["limit"] == 200  # one bounded read per image
    other = Client()
    other.force_login(make_user("nobody", "change_reliableschedule"))
    assert other.get(schedule_pages.activity_url("a-hourly")).status_code == 403


def test_the_operator_runs_now_and_a_second_press_gives_the_same_run(service, operator):
    before = runs(service, "b-nightly")
    page = operator.get(detail_url("b-nightly")).content.decode()
    assert 'id="re-run-now"' in page
    response = operator.post(detail_url("b-nightly"), {"action": "run_now"})
    assert response.status_code == 302 and response["Location"] == detail_url("b-nightly")
    (new,) = set(runs(service, "b-nightly")) - set(before)
    assert message_texts(response) == [f"1 schedule fired now. Task: {new}."]
    again = operator.post(detail_url("b-nightly"), {"action": "run_now"})
    assert message_texts(again)[-1] == (
        f"0 schedules fired now; 1 skipped: 1 run by hand earlier, not finished yet. Task: {new}."
    )
    assert runs(service, "b-nightly") == sorted([*before, new])
    # The list's action, several at once; unknown ids are skipped.
    response = operator.post(
        LIST_URL, {"action": "run_now", "_selected_action": ["b-nightly", "d-weekly", "nope"]}
    )
    text = message_texts(response)[-1]
    assert text.startswith("1 schedule fired now; 2 skipped: 1 not found, 1 run by hand earlier")
    assert len(runs(service, "d-weekly")) == len(service.fired["d-weekly"]) + 1


# -- run now: the HTTP API -------------------------------------------------------------------
@pytest.mark.parametrize("backend", admin_params())
def test_the_api_runs_now_with_clear_errors(backend):
    with api_executor(backend) as service:
        service.schedule("p1", "contract.hook", every=60)
        operator = Client()
        operator.force_login(make_user("api-op", VIEW, CHANGE))
        response = operator.post(f"{API}p1/run/")
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["schedule_id"] == "p1" and body["task_id"].startswith("p1@")
        assert service.get_task(body["task_id"]).status is TaskStatus.CREATED
        assert operator.post(f"{API}p1/run/").json()["task_id"] == body["task_id"]
        missing = operator.post(f"{API}nope/run/")
        assert missing.status_code == 404
        assert missing.json()["error"] == "no schedule 'nope'"
        assert operator.get(f"{API}p1/run/").status_code == 405
        viewer = Client()
        viewer.force_login(make_user("api-viewer", VIEW))
        assert viewer.post(f"{API}p1/run/").status_code == 403
        assert runs(service, "p1") == [body["task_id"]]
