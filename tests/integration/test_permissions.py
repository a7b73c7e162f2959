"""Who may do what: each admin page and action and each HTTP API endpoint (sessions) against each
role, with the outcome each cell must give and, where a role is refused, that the store is left
as it was. On SQLite and Redis, one storage of each kind: which role may see or do what is
decided before the storage is called, and what each action does to each database is the
contract suites' (CI time: the table is 1 588 cells on four storages)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.admin_support import (
    BATCH_FAILED,
    LIST_URL,
    POPULATED,
    SCHEDULES,
    admin_params,
    boom,
    detail_url,
    executor_on,
    fail_after_steps,
    finished_batch,
    populate,
    populate_schedules,
    run_one,
)
from tests.support.api_support import API, HOOK, api_executor, login, post_json
from tests.support.contract_support import HOOKS

APP = "django_reliable_executor"
VIEW_TASK, ADD_TASK, OPERATE_TASK = "view_reliabletask", "add_reliabletask", "operate_reliabletask"
VIEW_SCHEDULE, ADD_SCHEDULE = "view_reliableschedule", "add_reliableschedule"
CHANGE_SCHEDULE, DELETE_SCHEDULE = "change_reliableschedule", "delete_reliableschedule"
EVERY_PERMISSION = (
    VIEW_TASK,
    ADD_TASK,
    OPERATE_TASK,
    VIEW_SCHEDULE,
    ADD_SCHEDULE,
    CHANGE_SCHEDULE,
    DELETE_SCHEDULE,
)

# One storage of each kind (see the module docstring).
PERMISSION_BACKENDS = ["default", "redis"]


@dataclass(frozen=True)
class Role:
    """A caller: anonymous (``permissions`` None), or a user holding ``permissions``."""

    permissions: tuple[str, ...] | None
    staff: bool = True


ROLES = {
    "anonymous": Role(None),
    "staff": Role(()),  # staff, no permission at all
    "non_staff": Role(EVERY_PERMISSION, staff=False),
    "viewer": Role((VIEW_TASK, VIEW_SCHEDULE)),
    "operator": Role((VIEW_TASK, ADD_TASK, OPERATE_TASK, VIEW_SCHEDULE, CHANGE_SCHEDULE)),
    "operate_only": Role((OPERATE_TASK,)),  # may act on tasks but not see them
    "task_permissions": Role((VIEW_TASK, ADD_TASK, OPERATE_TASK)),  # nothing of schedules
    "schedule_adder": Role((ADD_SCHEDULE,)),
    "schedule_changer": Role((CHANGE_SCHEDULE,)),
    "schedule_deleter": Role((DELETE_SCHEDULE,)),
    "schedule_admin": Role((VIEW_SCHEDULE, CHANGE_SCHEDULE, DELETE_SCHEDULE)),
}


def log_in(client: Client, role: Role) -> Client:
    if role.permissions is not None:
        login(client, *role.permissions, staff=role.staff)
    return client


# -- the stores the cells act on -----------------------------------------------------------------
TASK_LIST = LIST_URL
SCHEDULE_LIST = reverse("admin:django_reliable_executor_reliableschedule_changelist")
BATCH = reverse("admin:django_reliable_executor_reliabletask_batch", args=[quote("imp/1")])
SCHEDULE_API = "/executor/api/schedules/"
QUEUE_API = "/executor/api/queues/"


def schedule_url(name: str, schedule_id: str) -> str:
    return reverse(f"admin:django_reliable_executor_reliableschedule_{name}", args=[schedule_id])


@contextlib.contextmanager
def admin_tasks(backend: str) -> Iterator[ReliableExecutor]:
    """The admin's POPULATED tasks."""
    with executor_on(backend) as service:
        populate(service)
        yield service


def admin_tasks_unchanged(service: ReliableExecutor) -> None:
    assert service.get_task("t-failed").status is TaskStatus.FAILED
    assert service.storage.task_events("t-created") == {}


@contextlib.contextmanager
def admin_steps(backend: str) -> Iterator[ReliableExecutor]:
    """The admin's POPULATED tasks and "t-steps", FAILED after storing three checkpoints."""
    with admin_tasks(backend) as service:
        fail_after_steps(service)
        yield service


def admin_steps_unchanged(service: ReliableExecutor) -> None:
    task = service.get_task("t-steps")
    assert task.status is TaskStatus.FAILED and len(task.steps) == 3


@contextlib.contextmanager
def admin_paused(backend: str) -> Iterator[ReliableExecutor]:
    """The admin's POPULATED tasks, queue "emails" paused."""
    with admin_tasks(backend) as service:
        service.pause_queue("emails")
        yield service


def admin_paused_unchanged(service: ReliableExecutor) -> None:
    assert service.paused_queues() == {"emails"}


@contextlib.contextmanager
def admin_batch(backend: str) -> Iterator[ReliableExecutor]:
    """The admin's POPULATED tasks and the finished batch "imp/1"."""
    with admin_tasks(backend) as service, finished_batch(service):
        yield service


def admin_batch_unchanged(service: ReliableExecutor) -> None:
    members = service.storage.get_many(BATCH_FAILED)
    assert {info.status for info in members.values()} == {TaskStatus.FAILED}


@contextlib.contextmanager
def admin_schedules(backend: str) -> Iterator[ReliableExecutor]:
    """The admin's SCHEDULES."""
    with executor_on(backend) as service:
        populate_schedules(service)
        yield service


def admin_schedules_unchanged(service: ReliableExecutor) -> None:
    schedule = service.get_schedule("a-hourly")
    assert schedule is not None and not schedule.paused


DEFINITION = {"schedule_id": "p1", "task_name": HOOK, "every": 60}


@contextlib.contextmanager
def api_store(backend: str) -> Iterator[ReliableExecutor]:
    """A task "t1" waiting a minute, a FAILED task "f1", "t-steps" FAILED after three steps,
    a task in queue "emails" and a schedule "p1"; nothing paused."""
    with api_executor(backend) as service:
        HOOKS["f1"] = boom
        try:
            service.submit(HOOK, task_id="f1", retry_limit=0)
            assert run_one(service) is TaskStatus.FAILED
        finally:
            HOOKS.pop("f1", None)
        fail_after_steps(service)
        service.submit(HOOK, task_id="t1", delay_millis=60_000)
        service.submit(HOOK, task_id="e1", queue="emails", delay_millis=60_000)
        service.schedule("p1", HOOK, every=60)
        service.before = service.get_schedule("p1")  # type: ignore[attr-defined]
        yield service


def api_store_unchanged(service: ReliableExecutor) -> None:
    assert service.get_task("t1").status is TaskStatus.CREATED
    assert service.storage.task_events("t1") == {}
    assert service.get_task("f1").status is TaskStatus.FAILED
    admin_steps_unchanged(service)
    assert service.paused_queues() == set()
    assert [s.schedule_id for s in service.list_schedules()] == ["p1"]
    assert service.get_schedule("p1") == service.before  # type: ignore[attr-defined]


# -- the admin's pages and actions -------------------------------------------------------------
@dataclass(frozen=True)
class Page:
    """One admin request: it needs every permission of ``needs``; a GET page shows each marker of
    ``buttons`` exactly when the user also holds the permission it maps to."""

    method: str
    url: str
    needs: tuple[str, ...]
    store: Callable[[str], Any]
    unchanged: Callable[[ReliableExecutor], None]
    data: dict[str, Any] = field(default_factory=dict)
    buttons: dict[str, str] = field(default_factory=dict)
    shown: Callable[[Any], None] | None = None  # more checks of the page an actor sees
    seen: Callable[[Any], None] | None = None  # more checks of the page anyone let in sees


def task_actions_shown(response: Any) -> None:
    page = response.content.decode()
    assert page.count('name="_selected_action"') == len(POPULATED)
    # Labelled as docs/admin.md names them.
    assert re.search(r'<option value="retry"[^>]*>Retry selected tasks</option>', page)
    assert re.search(r'<option value="cancel"[^>]*>Cancel selected tasks</option>', page)


def queues_shown(response: Any) -> None:
    assert {r.queue: r.paused for r in response.context["summary"]["queues"]}["emails"] is True


def schedule_actions_shown(response: Any) -> None:
    page = response.content.decode()
    assert page.count('name="_selected_action"') == len(SCHEDULES)
    assert '<option value="pause">' in page and '<option value="resume">' in page


TASKS = {"store": admin_tasks, "unchanged": admin_tasks_unchanged}
STEPPED = {"store": admin_steps, "unchanged": admin_steps_unchanged}
PAUSED = {"store": admin_paused, "unchanged": admin_paused_unchanged}
BATCHES = {"store": admin_batch, "unchanged": admin_batch_unchanged}
SCHEDULE_PAGES = {"store": admin_schedules, "unchanged": admin_schedules_unchanged}
LIST_BUTTONS = {'name="_selected_action"': OPERATE_TASK, 'name="action"': OPERATE_TASK}
RETRY = {"action": "retry", "_selected_action": ["t-failed"]}
PAUSE = {"action": "pause", "_selected_action": ["a-hourly"]}

PAGES = {
    "task_list": Page(
        "GET", TASK_LIST, (VIEW_TASK,), **TASKS, buttons=LIST_BUTTONS, shown=task_actions_shown
    ),
    "task_summary_queues": Page(
        "GET",
        TASK_LIST,
        (VIEW_TASK,),
        **PAUSED,
        buttons={'name="queue_action"': OPERATE_TASK},
        seen=queues_shown,
    ),
    "task_detail": Page(
        "GET",
        detail_url("t-failed"),
        (VIEW_TASK,),
        **TASKS,
        buttons={'id="re-retry"': OPERATE_TASK},
    ),
    "task_list_retry": Page("POST", TASK_LIST, (VIEW_TASK, OPERATE_TASK), **TASKS, data=RETRY),
    "dead_letters_retry": Page(
        "POST", TASK_LIST + "?status=dead", (VIEW_TASK, OPERATE_TASK), **TASKS, data=RETRY
    ),
    "task_detail_retry": Page(
        "POST", detail_url("t-failed"), (VIEW_TASK, OPERATE_TASK), **TASKS, data={"action": "retry"}
    ),
    "task_detail_send_event": Page(
        "POST",
        detail_url("t-created"),
        (VIEW_TASK, OPERATE_TASK),
        **TASKS,
        data={"action": "send_event", "event": "go", "payload": "1"},
    ),
    "task_detail_events": Page(
        "GET",
        detail_url("t-created"),
        (VIEW_TASK,),
        **TASKS,
        buttons={'id="re-send-event"': OPERATE_TASK},
    ),
    "task_detail_steps": Page(
        "GET",
        detail_url("t-steps"),
        (VIEW_TASK,),
        **STEPPED,
        buttons={"re-retry-from-step": OPERATE_TASK, 'id="re-steps"': VIEW_TASK},
    ),
    "task_detail_retry_from_step": Page(
        "POST",
        detail_url("t-steps"),
        (VIEW_TASK, OPERATE_TASK),
        **STEPPED,
        data={"action": "retry_from_step", "step": "invoice"},
    ),
    # The live stack's endpoint (JSON): reading a request's answer is viewing.
    "task_stack": Page(
        "GET",
        reverse("admin:django_reliable_executor_reliabletask_stack", args=["t-created"])
        + "?request=0",
        (VIEW_TASK,),
        **TASKS,
    ),
    "queue_resume": Page(
        "POST",
        TASK_LIST,
        (VIEW_TASK, OPERATE_TASK),
        **PAUSED,
        data={"queue_action": "resume", "queue": "emails"},
    ),
    "batch": Page(
        "GET", BATCH, (VIEW_TASK,), **BATCHES, buttons={'id="re-retry-failed"': OPERATE_TASK}
    ),
    "batch_retry_failed": Page(
        "POST", BATCH, (VIEW_TASK, OPERATE_TASK), **BATCHES, data={"action": "retry_failed"}
    ),
    "schedule_list": Page(
        "GET",
        SCHEDULE_LIST,
        (VIEW_SCHEDULE,),
        **SCHEDULE_PAGES,
        buttons={'name="_selected_action"': CHANGE_SCHEDULE, 'name="action"': CHANGE_SCHEDULE},
        shown=schedule_actions_shown,
    ),
    "schedule_detail": Page(
        "GET",
        schedule_url("change", "a-hourly"),
        (VIEW_SCHEDULE,),
        **SCHEDULE_PAGES,
        buttons={
            'id="re-pause"': CHANGE_SCHEDULE,
            'id="re-run-now"': CHANGE_SCHEDULE,
            'id="re-delete"': DELETE_SCHEDULE,
        },
    ),
    "schedule_list_pause": Page(
        "POST", SCHEDULE_LIST, (VIEW_SCHEDULE, CHANGE_SCHEDULE), **SCHEDULE_PAGES, data=PAUSE
    ),
    "schedule_detail_pause": Page(
        "POST",
        schedule_url("change", "a-hourly"),
        (VIEW_SCHEDULE, CHANGE_SCHEDULE),
        **SCHEDULE_PAGES,
        data={"action": "pause"},
    ),
    "schedule_delete_page": Page(
        "GET",
        schedule_url("delete", "a-hourly"),
        (VIEW_SCHEDULE, DELETE_SCHEDULE),
        **SCHEDULE_PAGES,
    ),
    "schedule_delete": Page(
        "POST",
        schedule_url("delete", "a-hourly"),
        (VIEW_SCHEDULE, DELETE_SCHEDULE),
        **SCHEDULE_PAGES,
    ),
}


def admin_outcome(page: Page, role: Role) -> str:
    """The admin sends anonymous and non-staff users to its login page; staff need the page's
    permissions (a POST: the view permission too) or get 403."""
    if role.permissions is None or not role.staff:
        return "login"
    return "allowed" if set(page.needs) <= set(role.permissions) else "403"


@pytest.mark.parametrize("backend", admin_params(PERMISSION_BACKENDS))
@pytest.mark.parametrize("role_name", list(ROLES))
@pytest.mark.parametrize("page_name", list(PAGES))
def test_admin(backend: str, page_name: str, role_name: str, client: Client) -> None:
    page, role = PAGES[page_name], ROLES[role_name]
    with page.store(backend) as service:
        log_in(client, role)
        if page.method == "GET":
            response = client.get(page.url)
        else:
            response = client.post(page.url, page.data)
        outcome = admin_outcome(page, role)
        if outcome == "login":
            assert response.status_code == 302 and "/login/" in response["Location"]
        elif outcome == "403":
            assert response.status_code == 403
        elif page.method == "GET":
            assert response.status_code == 200
            html = response.content.decode()
            for marker, permission in page.buttons.items():
                assert (marker in html) is (permission in (role.permissions or ())), marker
            if page.seen is not None:
                page.seen(response)
            if page.shown is not None and all(p in role.permissions for p in page.buttons.values()):
                page.shown(response)
        else:
            assert response.status_code == 302 and "/login/" not in response["Location"]
        if outcome != "allowed" or page.method == "GET":
            page.unchanged(service)


# -- the HTTP API's endpoints (sessions) --------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    """One API request; a staff session needs ``permission`` (of the app) for it."""

    method: str
    path: str
    permission: str
    status: int = 200  # what a permitted caller gets
    data: dict[str, Any] | None = None
    answered: Callable[[Any, ReliableExecutor, Role], None] | None = None  # checks of that answer


def schedule_ids(response: Any, service: ReliableExecutor, role: Role) -> None:
    assert [s["schedule_id"] for s in response.json()["schedules"]] == ["p1"]


def deleted(schedule_id: str) -> Callable[[Any, ReliableExecutor, Role], None]:
    def check(response: Any, service: ReliableExecutor, role: Role) -> None:
        assert response.json() == {"deleted": True, "schedule_id": schedule_id}
        assert service.get_schedule(schedule_id) is None

    return check


def paused_p1(response: Any, service: ReliableExecutor, role: Role) -> None:
    answer = response.json()
    if VIEW_SCHEDULE in (role.permissions or ()):
        assert (answer["schedule_id"], answer["paused"]) == ("p1", True)
    else:
        # Changing a schedule is no permission to read it: its id and pause only.
        assert answer == {"schedule_id": "p1", "paused": True}
    assert service.get_schedule("p1").paused


ENDPOINTS = {
    "task_get": Endpoint("GET", f"{API}t1/", VIEW_TASK),
    "task_submit": Endpoint("POST", API, ADD_TASK, 201, {"task_name": HOOK}),
    "task_cancel": Endpoint("POST", f"{API}t1/cancel/", OPERATE_TASK),
    "task_retry": Endpoint("POST", f"{API}f1/retry/", OPERATE_TASK),
    "task_retry_from_step": Endpoint(
        "POST",
        f"{API}t-steps/retry/",
        OPERATE_TASK,
        data={"from_step": "invoice"},
        answered=lambda response, service, role: (
            None
            if [s.name for s in service.get_task("t-steps").steps] == ["charge"]
            else pytest.fail(response.content)
        ),
    ),
    "task_event": Endpoint(
        "POST",
        f"{API}t1/events/go/",
        OPERATE_TASK,
        data={"payload": {"n": 1}},
        answered=lambda response, service, role: (
            None
            if service.storage.task_events("t1") == {"go": {"n": 1}}
            else pytest.fail(response.content)
        ),
    ),
    "queues_paused": Endpoint("GET", f"{QUEUE_API}paused/", VIEW_TASK),
    "queue_pause": Endpoint("POST", f"{QUEUE_API}emails/pause/", OPERATE_TASK),
    "queue_resume": Endpoint("POST", f"{QUEUE_API}emails/resume/", OPERATE_TASK),
    "schedule_list": Endpoint("GET", SCHEDULE_API, VIEW_SCHEDULE, answered=schedule_ids),
    "schedule_get": Endpoint(
        "GET",
        f"{SCHEDULE_API}p1/",
        VIEW_SCHEDULE,
        answered=lambda response, *_: (
            None if response.json()["schedule_id"] == "p1" else pytest.fail(response.content)
        ),
    ),
    "schedule_redefine": Endpoint(
        "POST",
        SCHEDULE_API,
        ADD_SCHEDULE,
        data={**DEFINITION, "every": 30},
        answered=lambda response, *_: (
            None if response.json()["every"] == 30 else pytest.fail(response.content)
        ),
    ),
    "schedule_define": Endpoint(
        "POST", SCHEDULE_API, ADD_SCHEDULE, 201, data={**DEFINITION, "schedule_id": "p2"}
    ),
    "schedule_pause": Endpoint(
        "POST", f"{SCHEDULE_API}p1/pause/", CHANGE_SCHEDULE, answered=paused_p1
    ),
    "schedule_resume": Endpoint(
        "POST",
        f"{SCHEDULE_API}p1/resume/",
        CHANGE_SCHEDULE,
        answered=lambda response, *_: (
            None if response.json()["paused"] is False else pytest.fail(response.content)
        ),
    ),
    "schedule_delete": Endpoint(
        "DELETE", f"{SCHEDULE_API}p1/", DELETE_SCHEDULE, answered=deleted("p1")
    ),
    "schedule_post_delete": Endpoint(
        "POST", f"{SCHEDULE_API}p1/delete/", DELETE_SCHEDULE, answered=deleted("p1")
    ),
}


def api_outcome(endpoint: Endpoint, role: Role) -> int:
    """The API answers anonymous callers 401; a session needs a staff user holding the
    endpoint's permission, else 403."""
    if role.permissions is None:
        return 401
    if role.staff and endpoint.permission in role.permissions:
        return endpoint.status
    return 403


@pytest.mark.parametrize("backend", admin_params(PERMISSION_BACKENDS))
@pytest.mark.parametrize("role_name", list(ROLES))
@pytest.mark.parametrize("endpoint_name", list(ENDPOINTS))
def test_api(backend: str, endpoint_name: str, role_name: str, client: Client) -> None:
    endpoint, role = ENDPOINTS[endpoint_name], ROLES[role_name]
    with api_store(backend) as service:
        log_in(client, role)
        if endpoint.method == "GET":
            response = client.get(endpoint.path)
        elif endpoint.method == "DELETE":
            response = client.delete(endpoint.path)
        else:
            response = post_json(client, endpoint.path, endpoint.data)
        expected = api_outcome(endpoint, role)
        assert response.status_code == expected, response.content
        if expected == 401:
            assert "authentication required" in response.json()["error"]
            assert response["WWW-Authenticate"] == "Executor-HMAC-SHA256"
        elif expected == 403:
            assert f"{APP}.{endpoint.permission}" in response.json()["error"]
        elif endpoint.answered is not None:
            endpoint.answered(response, service, role)
        if expected in (401, 403) or endpoint.method == "GET":
            api_store_unchanged(service)


@pytest.mark.parametrize("backend", admin_params(PERMISSION_BACKENDS))
def test_a_get_of_a_queue_action_is_405_even_for_a_viewer(backend: str, client: Client) -> None:
    with api_store(backend):
        viewer = login(client, VIEW_TASK)
        assert viewer.get(f"{QUEUE_API}emails/pause/").status_code == 405
