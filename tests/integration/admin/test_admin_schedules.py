"""The admin's schedule pages on every storage (SQLite, MariaDB, PostgreSQL, Redis), through
Django's test client with real users and permissions: list with the last fire's task status,
counts, state filter, pagination, detail with the last fires, pause/resume (action and
buttons), delete with confirmation, who may do what, and the 503 page."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.messages import get_messages
from django.test import Client, override_settings
from django.urls import reverse

from django_reliable_executor.admin import schedule_pages
from django_reliable_executor.core.states import TaskStatus
from tests.support.admin_support import (
    SCHEDULES,
    admin_params,
    executor_on,
    make_user,
    populate_schedules,
)

LIST_URL = reverse("admin:django_reliable_executor_reliableschedule_changelist")
IDS = sorted(SCHEDULES)


def detail_url(schedule_id: str) -> str:
    return reverse(
        "admin:django_reliable_executor_reliableschedule_change", args=[quote(schedule_id)]
    )


def delete_url(schedule_id: str) -> str:
    return reverse(
        "admin:django_reliable_executor_reliableschedule_delete", args=[quote(schedule_id)]
    )


def task_url(task_id: str) -> str:
    return reverse("admin:django_reliable_executor_reliabletask_change", args=[quote(task_id)])


@pytest.fixture(params=admin_params())
def service(request: pytest.FixtureRequest):
    """The module executor on the backend under test, holding the SCHEDULES."""
    with executor_on(request.param) as service:
        service.fired = populate_schedules(service)
        yield service


@pytest.fixture
def viewer(client):
    client.force_login(make_user("viewer", "view_reliableschedule"))
    return client


@pytest.fixture
def pauser(client):
    client.force_login(make_user("pauser", "view_reliableschedule", "change_reliableschedule"))
    return client


@pytest.fixture
def admin_user(client):
    client.force_login(
        make_user(
            "sched-admin",
            "view_reliableschedule",
            "change_reliableschedule",
            "delete_reliableschedule",
        )
    )
    return client


def listed(response: Any) -> list[str]:
    return [row.schedule.schedule_id for row in response.context["rows"]]


def message_texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def paused(service: Any, schedule_id: str) -> bool:
    return service.get_schedule(schedule_id).paused


def row_html(html: str, schedule_id: str) -> str:
    found = re.search(rf'<tr data-schedule-id="{re.escape(schedule_id)}"(.*?)</tr>', html, re.S)
    assert found is not None, schedule_id
    return found.group(1)


# -- the list ---------------------------------------------------------------------------------
def test_list_shows_schedules_by_id_with_the_last_fire_and_its_task_status(service, viewer):
    response = viewer.get(LIST_URL)
    assert response.status_code == 200
    assert listed(response) == IDS
    html = response.content.decode()
    for schedule_id, (is_paused, last_status) in SCHEDULES.items():
        row = row_html(html, schedule_id)
        assert f'data-paused="{"true" if is_paused else "false"}"' in row
        assert ('<span class="re-paused">paused</span>' in row) == is_paused
        assert f'href="{detail_url(schedule_id)}"' in row
        if last_status is None:
            assert "never fired" in row and "data-last-status" not in row
        else:
            assert f'data-last-status="{last_status.value}"' in row
            assert f"re-status-{last_status.value.lower()}" in row  # colour-coded
            last = service.fired[schedule_id][0]
            assert f'href="{task_url(last)}"' in row  # links to the last fire's task
    rows = {r.schedule.schedule_id: r for r in response.context["rows"]}
    assert rows["a-hourly"].timing == service.get_schedule("a-hourly").describe()
    assert "0 3 * * *" in rows["b-nightly"].timing
    assert rows["b-nightly"].schedule.queue == "sched-b"
    assert rows["a-hourly"].next_run_in.startswith("in ")
    assert rows["a-hourly"].last_task.status is TaskStatus.FAILED
    # The last fire shows the planned time, in UTC.
    planned = service.get_schedule("a-hourly").last_run_at
    # (The date and the time are kept whole: the line may break only between them.)
    utc = planned.astimezone(dt.timezone.utc)
    assert (
        f'<span class="re-nowrap">{utc:%Y-%m-%d}</span> '
        f'<span class="re-nowrap">{utc:%H:%M:%S}</span>' in row_html(html, "a-hourly")
    )
    assert '<span class="re-origin">api</span>' in html
    summary = response.context["summary"]
    assert summary["counts"] == {"active": 3, "paused": 1, "total": 4}
    assert "Schedules 1&ndash;4 of 4, by id." in html
    assert response.context["next_url"] is None and response.context["previous_url"] is None


def test_the_last_fires_tasks_are_read_in_one_call(service, viewer, monkeypatch):
    storage = service.storage
    calls: list[list[str]] = []
    get_many = storage.get_many

    def counting(task_ids):
        calls.append(list(task_ids))
        return get_many(task_ids)

    monkeypatch.setattr(storage, "get_many", counting)
    assert viewer.get(LIST_URL).status_code == 200
    last_ids = sorted(ids[0] for ids in service.fired.values() if ids)
    assert calls == [last_ids]


def test_a_purged_last_fire_says_task_gone(service, viewer, monkeypatch):
    storage = service.storage
    monkeypatch.setattr(storage, "get_many", lambda task_ids: {})
    html = viewer.get(LIST_URL).content.decode()
    assert "task gone" in row_html(html, "a-hourly")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=active", ["a-hourly", "b-nightly", "d-weekly"]),
        ("state=paused", ["c-paused"]),
        ("state=other", IDS),  # an unknown value is no filter
    ],
)
def test_state_filter(service, viewer, query, expected):
    response = viewer.get(f"{LIST_URL}?{query}")
    assert response.status_code == 200
    assert listed(response) == expected
    links = response.context["summary"]["state_links"]
    assert [(link["label"], link["count"]) for link in links] == [
        ("All", None),
        ("Active", 3),
        ("Paused", 1),
    ]


def test_pages_walk_every_schedule_once_without_counting(service, viewer, monkeypatch):
    monkeypatch.setattr(schedule_pages, "PAGE_SIZE", 3)
    first = viewer.get(LIST_URL)
    assert listed(first) == IDS[:3]
    assert first.context["next_url"] == "?page=2" and first.context["previous_url"] is None
    second = viewer.get(LIST_URL + "?page=2")
    assert listed(second) == IDS[3:]
    assert second.context["next_url"] is None and second.context["previous_url"] == "?"
    assert "Schedules 4&ndash;4 of 4" in second.content.decode()
    assert listed(viewer.get(LIST_URL + "?page=9")) == []
    assert listed(viewer.get(LIST_URL + "?page=bad")) == IDS[:3]
    # Past any offset a storage takes (a 64-bit LIMIT): a bad value too, never a 500.
    assert listed(viewer.get(LIST_URL + "?page=" + "9" * 20)) == IDS[:3]
    # A filter is kept from page to page.
    monkeypatch.setattr(schedule_pages, "PAGE_SIZE", 2)
    active = viewer.get(LIST_URL + "?state=active")
    assert listed(active) == ["a-hourly", "b-nightly"]
    assert active.context["next_url"] == "?state=active&page=2"
    assert listed(viewer.get(LIST_URL + "?state=active&page=2")) == ["d-weekly"]


def test_the_list_reads_one_more_than_a_page(service, viewer, monkeypatch):
    monkeypatch.setattr(schedule_pages, "PAGE_SIZE", 2)
    seen: list[dict[str, Any]] = []
    list_schedules = service.list_schedules

    def spy(**kwargs):
        seen.append(kwargs)
        return list_schedules(**kwargs)

    monkeypatch.setattr(service, "list_schedules", spy)
    viewer.get(LIST_URL + "?state=paused&page=3")
    assert seen == [{"limit": 3, "offset": 4, "paused": True}]


@pytest.mark.parametrize("backend", admin_params())
def test_empty_store(backend, viewer):
    with executor_on(backend):
        response = viewer.get(LIST_URL)
    assert response.status_code == 200
    assert "No schedules yet." in response.content.decode()
    assert response.context["summary"]["counts"] == {"active": 0, "paused": 0, "total": 0}


# -- detail -----------------------------------------------------------------------------------
def test_detail_shows_every_field_pretty_json_and_the_last_fires(service, viewer):
    response = viewer.get(detail_url("a-hourly"))
    assert response.status_code == 200
    html = response.content.decode()
    schedule = service.get_schedule("a-hourly")
    assert "&quot;formats&quot;: [\n    &quot;pdf&quot;,\n    &quot;csv&quot;\n  ]" in html
    assert schedule.describe() in html
    for text in ("contract.hook", "sched-a", "skip", "up to 0", "api", schedule.timezone):
        assert text in html
    utc = schedule.next_run_at.astimezone(dt.timezone.utc)
    assert utc.strftime("%Y-%m-%d %H:%M:%S") in html
    # The last fires, newest first, with their status and a link; not the task made by hand.
    fires = response.context["fires"]
    assert [f.task.task_id for f in fires] == service.fired["a-hourly"]
    assert [f.task.status for f in fires] == [TaskStatus.FAILED, TaskStatus.COMPLETED]
    for fire in fires:
        assert f'href="{task_url(fire.task.task_id)}"' in html
    assert "a-hourly-by-hand" not in html
    assert re.search(r'id="re-last-task"><a href="[^"]+">a-hourly@\d{8}T\d{6}Z</a>', html)
    assert "re-status-failed" in html


def test_detail_of_a_cron_schedule_and_a_never_fired_one(service, viewer):
    cron = viewer.get(detail_url("b-nightly")).content.decode()
    assert "<code>0 3 * * *</code>" in cron and "Europe/Paris" in cron
    never = viewer.get(detail_url("c-paused"))
    assert never.context["fires"] == []
    html = never.content.decode()
    assert "never fired" in html and "No task of this schedule is stored" in html
    assert '<span class="re-paused">paused</span>' in html


def test_detail_shows_the_overlap_policy_and_the_runs_skipped(service, viewer):
    from django_reliable_executor.schedules.planning import fire_task
    from django_reliable_executor.schedules.records import ScheduleFire

    # b-nightly's last fire is still CREATED: with overlap="skip" its next fire is skipped.
    service.schedule(
        "b-nightly",
        "contract.hook",
        {"n": 2},
        cron="0 3 * * *",
        timezone="Europe/Paris",
        queue="sched-b",
        overlap="skip",
    )
    schedule = service.get_schedule("b-nightly")
    now = service.clock.now()
    task = fire_task(schedule, schedule.next_run_at, now)
    planned = ScheduleFire(
        "b-nightly",
        schedule.next_run_at,
        schedule.next_run_at + dt.timedelta(days=1),
        (task,),
        task.run_at,
        task.task_id,
        overlap="skip",
    )
    assert service.storage.fire_schedules([planned], now) == []
    html = viewer.get(detail_url("b-nightly")).content.decode()
    assert 'id="re-overlap">skip' in html
    assert 'id="re-overlap-skipped">1 run, latest at' in html
    other = viewer.get(detail_url("a-hourly")).content.decode()
    assert 'id="re-overlap">allow' in other
    assert 'id="re-overlap-skipped"><span class="re-muted">none' in other


def test_detail_of_an_unknown_schedule_goes_back_to_the_list(service, viewer):
    response = viewer.get(detail_url("missing"))
    assert response.status_code == 302 and response["Location"] == LIST_URL
    assert message_texts(response) == ["No schedule has the id 'missing'."]
    bare = viewer.get(LIST_URL + "a-hourly/")
    assert bare.status_code == 302 and bare["Location"] == detail_url("a-hourly")


# -- pause and resume -------------------------------------------------------------------------
def test_pause_and_resume_selected_say_what_changed_and_what_was_skipped(service, pauser):
    selected = ["a-hourly", "b-nightly", "c-paused", "nope"]
    response = pauser.post(
        LIST_URL + "?state=active", {"action": "pause", "_selected_action": selected}
    )
    assert response.status_code == 302 and response["Location"] == LIST_URL + "?state=active"
    assert message_texts(response) == [
        "2 schedules paused; 2 skipped: 1 already paused, 1 not found."
    ]
    assert paused(service, "a-hourly") and paused(service, "b-nightly")
    assert not paused(service, "d-weekly")
    assert service.count_schedules() == {"active": 1, "paused": 3}
    response = pauser.post(
        LIST_URL, {"action": "resume", "_selected_action": ["a-hourly", "d-weekly"]}
    )
    (message,) = [m for m in get_messages(response.wsgi_request)][-1:]
    assert str(message) == "1 schedule resumed; 1 skipped: 1 already active."
    assert message.level_tag == "warning"
    assert not paused(service, "a-hourly")


def test_all_changed_is_a_success_message(service, pauser):
    response = pauser.post(LIST_URL, {"action": "resume", "_selected_action": ["c-paused"]})
    (message,) = list(get_messages(response.wsgi_request))
    assert (str(message), message.level_tag) == ("1 schedule resumed.", "success")


def test_action_without_selection_or_unknown_action_changes_nothing(service, pauser):
    response = pauser.post(LIST_URL, {"action": "pause"})
    assert message_texts(response) == ["Select the schedules to act on first: nothing was changed."]
    response = pauser.post(LIST_URL, {"action": "drop", "_selected_action": ["a-hourly"]})
    assert message_texts(response)[-1] == "Choose an action: pause or resume or run_now."
    assert not paused(service, "a-hourly")


def test_detail_buttons_pause_and_resume(service, pauser):
    page = pauser.get(detail_url("a-hourly")).content.decode()
    assert 'id="re-pause"' in page and 'id="re-resume"' not in page
    assert 'id="re-delete"' not in page  # no delete permission
    response = pauser.post(detail_url("a-hourly"), {"action": "pause"})
    assert response.status_code == 302 and response["Location"] == detail_url("a-hourly")
    assert message_texts(response) == ["1 schedule paused."]
    assert paused(service, "a-hourly")
    page = pauser.get(detail_url("a-hourly")).content.decode()
    assert 'id="re-resume"' in page and 'id="re-pause"' not in page
    response = pauser.post(detail_url("a-hourly"), {"action": "resume"})
    assert message_texts(response)[-1] == "1 schedule resumed."
    assert not paused(service, "a-hourly")


# -- delete -----------------------------------------------------------------------------------
def test_delete_asks_for_confirmation_then_deletes_and_keeps_the_tasks(service, admin_user):
    page = admin_user.get(detail_url("a-hourly")).content.decode()
    assert f'href="{delete_url("a-hourly")}"' in page
    confirm = admin_user.get(delete_url("a-hourly"))
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "Delete the schedule <strong>a-hourly</strong>" in html
    assert 'name="csrfmiddlewaretoken"' in html and 'id="re-delete-confirm"' in html
    assert service.get_schedule("a-hourly") is not None  # nothing deleted by the GET
    response = admin_user.post(delete_url("a-hourly"))
    assert response.status_code == 302 and response["Location"] == LIST_URL
    assert message_texts(response) == ["Schedule 'a-hourly' deleted; the tasks it fired stay."]
    assert service.get_schedule("a-hourly") is None
    assert all(service.get_task(t) is not None for t in service.fired["a-hourly"])
    assert listed(admin_user.get(LIST_URL)) == ["b-nightly", "c-paused", "d-weekly"]
    # Again: nothing left to delete.
    again = admin_user.post(delete_url("a-hourly"))
    assert again.status_code == 302
    assert message_texts(again)[-1] == "No schedule has the id 'a-hourly'."


# -- the superuser (every role's cells: tests/integration/test_permissions.py) ----------------
def test_the_admin_index_lists_the_schedules_and_superusers_do_everything(service, client):
    client.force_login(make_user("root", superuser=True))
    index = client.get(reverse("admin:index")).content.decode()
    assert LIST_URL in index and "Reliable schedules" in index
    assert LIST_URL + "add/" not in index
    page = client.get(detail_url("d-weekly")).content.decode()
    assert 'id="re-pause"' in page and 'id="re-delete"' in page
    assert message_texts(client.post(detail_url("d-weekly"), {"action": "pause"})) == [
        "1 schedule paused."
    ]
    client.post(delete_url("d-weekly"))
    assert service.get_schedule("d-weekly") is None


@pytest.mark.parametrize("backend", admin_params(["default"]))
def test_actions_need_the_csrf_token(backend):
    with executor_on(backend) as service:
        service.schedule("s", "contract.hook", every=60)
        strict = Client(enforce_csrf_checks=True)
        strict.force_login(
            make_user(
                "op", "view_reliableschedule", "change_reliableschedule", "delete_reliableschedule"
            )
        )
        response = strict.post(LIST_URL, {"action": "pause", "_selected_action": ["s"]})
        assert response.status_code == 403
        assert strict.post(delete_url("s")).status_code == 403
        assert not paused(service, "s")


@pytest.mark.parametrize("backend", admin_params(["default"]))
def test_an_unreachable_redis_gives_a_503_page_not_a_crash(backend, admin_user):
    down = {"STORAGE": "redis", "REDIS_URL": "redis://127.0.0.1:9/0", "KEY_PREFIX": "test-down"}
    with override_settings(RELIABLE_EXECUTOR=down):
        for url in (LIST_URL, detail_url("s-1"), delete_url("s-1")):
            response = admin_user.get(url)
            assert response.status_code == 503, url
            assert "The schedule storage cannot be reached" in response.content.decode()
        response = admin_user.post(LIST_URL, {"action": "pause", "_selected_action": ["a", "b"]})
        assert response.status_code == 302
        assert message_texts(response)[-1].startswith(
            "0 schedules paused; 2 skipped: 2 not attempted. Stopped: Redis at"
        )
        assert admin_user.post(delete_url("s-1")).status_code == 503


# -- pure parts -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "now"), (5, "in 5 s"), (-5, "5 s late"), (185, "in 3 min 5 s"), (-7200, "2 h 0 min late")],
)
def test_relative(seconds, text):
    now = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    assert schedule_pages.relative(now + dt.timedelta(seconds=seconds), now) == text


def test_pretty_json_is_what_the_page_shows():
    assert schedule_pages.task_pages.pretty_json({"b": 1, "a": [1]}) == json.dumps(
        {"a": [1], "b": 1}, indent=2
    )


TASK_LIST_URL = reverse("admin:django_reliable_executor_reliabletask_changelist")


def listed_ids(response) -> set[str]:
    return {row.task.task_id for row in response.context["rows"]}


def test_the_task_list_hides_schedule_runs_or_shows_one_schedule_s(service, client):
    """Schedules flood the task list: ``?origin=`` leaves their runs out or lists only them,
    and a schedule's page links to the list of its runs (``?schedule=``)."""
    client.force_login(make_user("both", "view_reliabletask", "view_reliableschedule"))
    runs = {task_id for fired in service.fired.values() for task_id in fired}
    every = listed_ids(client.get(TASK_LIST_URL))
    assert runs < every and "a-hourly-by-hand" in every
    submitted = client.get(TASK_LIST_URL, {"origin": "submitted"})
    assert listed_ids(submitted) == every - runs
    assert submitted.context["total"] is None  # no counter tells schedule runs apart
    html = submitted.content.decode()
    assert "By origin" in html and 'class="selected"><a href="?origin=submitted">Submitted' in html
    assert listed_ids(client.get(TASK_LIST_URL, {"origin": "schedules"})) == runs
    detail = client.get(detail_url("a-hourly")).content.decode()
    link = re.search(r'id="re-all-runs" href="([^"]+)"', detail)
    assert link is not None and link[1] == TASK_LIST_URL + "?schedule=a-hourly"
    one = client.get(link[1])
    assert listed_ids(one) == set(service.fired["a-hourly"])
    assert "By schedule" in one.content.decode()  # the chosen schedule, with "All" to leave it
    assert listed_ids(client.get(TASK_LIST_URL, {"origin": "bogus"})) == every  # dropped
