"""Helpers of the admin tests: the store under test, users with permissions, a set of tasks in
every state, made through the service and the storage's real transitions."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.messages import get_messages
from django.test import override_settings
from django.urls import reverse

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.progress import make_progress
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor, executor
from tests.conftest import (
    BACKENDS,
    IN_CI,
    REDIS_SHARDS,
    REDIS_URL,
    TASK_APPS,
    own_key_prefix,
    require,
)
from tests.support.contract_support import (
    HOOKS,
    LEASE,
    claim_and_start,
    claim_one,
    run_claim,
    run_claims,
)

# The task pages of the admin, shared by the admin test modules.
LIST_URL = reverse("admin:django_reliable_executor_reliabletask_changelist")


def detail_url(task_id: str) -> str:
    return reverse("admin:django_reliable_executor_reliabletask_change", args=[quote(task_id)])


# The admin needs the auth, session and admin apps (and their templates) beside the task apps.
ADMIN_APPS = [
    *TASK_APPS,
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]


def admin_params(backends: list[str] | None = None) -> list[Any]:
    """pytest params per backend; the admin's users and sessions live in "default" (SQLite)."""
    return [
        pytest.param(
            backend,
            id="sqlite" if backend == "default" else backend,
            marks=pytest.mark.django_db(
                transaction=True,
                databases=sorted({"default", "default" if backend == "redis" else backend}),
                available_apps=ADMIN_APPS,
            ),
        )
        for backend in (backends or BACKENDS)
    ]


@contextlib.contextmanager
def executor_on(backend: str, **extra: Any) -> Iterator[ReliableExecutor]:
    """Point the module-level executor (the one the admin uses) at ``backend``: a database
    alias, or "redis" under a key prefix of its own (in TEST_REDIS_SHARDS shards), deleted
    afterwards; ``extra``: more of its settings."""
    require(backend)
    with own_key_prefix(backend == "redis") as prefix:
        config: dict[str, Any]
        if backend == "redis":
            config = {"STORAGE": "redis", "REDIS_URL": REDIS_URL, "KEY_PREFIX": prefix}
            config["REDIS_SHARDS"] = REDIS_SHARDS
        else:
            config = {"DATABASE_ALIAS": backend}
        config.update(extra)
        with override_settings(RELIABLE_EXECUTOR=config):
            yield executor


def make_user(username: str, *permissions: str, superuser: bool = False) -> Any:
    """A staff user holding the given codenames of the task model (view/operate)."""
    from django.contrib.auth.models import Permission, User

    if superuser:
        return User.objects.create_superuser(username, f"{username}@example.com", "pw")
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(
            Permission.objects.get(
                content_type__app_label="django_reliable_executor", codename=codename
            )
        )
    return user


def run_one(
    service: ReliableExecutor, queue: str = "default", worker: str = "w1"
) -> TaskStatus | None:
    """Claim the one due task of ``queue`` and run it through the real TaskRunner."""
    return run_claim(service, claim_one(service.storage, worker, queue))


def boom(context: Any) -> Any:
    raise ValueError(f"boom in {context.task_id}")


# The tasks ``populate`` makes, oldest first: (task_id, status, queue).
POPULATED = [
    ("t-completed", TaskStatus.COMPLETED, "default"),
    ("t-failed", TaskStatus.FAILED, "default"),
    ("t-failed-emails", TaskStatus.FAILED, "emails"),
    ("t-running", TaskStatus.RUNNING, "default"),
    ("t-pending", TaskStatus.PENDING, "default"),
    ("t-cancelled", TaskStatus.CANCELLED, "default"),
    ("t-later", TaskStatus.CREATED, "emails"),
    ("t-created", TaskStatus.CREATED, "default"),
]
NEWEST_FIRST = [task_id for task_id, _, _ in reversed(POPULATED)]


def populate(service: ReliableExecutor) -> None:
    """One task in each state (see POPULATED), made in an order where each claim finds exactly
    the one task it is meant to take."""
    hook = "contract.hook"
    service.submit(hook, {"order": 1, "items": ["a", "b"]}, task_id="t-completed")
    HOOKS["t-completed"] = lambda context: {"charged": 12.5, "currency": "EUR"}
    assert run_one(service) is TaskStatus.COMPLETED
    for task_id, queue in (("t-failed", "default"), ("t-failed-emails", "emails")):
        service.submit(hook, {"order": 2}, task_id=task_id, retry_limit=0, queue=queue)
        HOOKS[task_id] = boom
        assert run_one(service, queue) is TaskStatus.FAILED
    service.submit(hook, None, task_id="t-running")
    claim_and_start(service.storage, worker="worker-a")
    service.submit(hook, None, task_id="t-pending", retry_limit=2, retry_interval=3_600_000)
    HOOKS["t-pending"] = boom
    assert run_one(service) is TaskStatus.PENDING
    service.submit(hook, None, task_id="t-cancelled", delay_millis=3_600_000)
    assert service.cancel_task("t-cancelled")
    service.submit(hook, None, task_id="t-later", delay_millis=3_600_000, queue="emails")
    service.submit(hook, {"x": 1}, task_id="t-created", priority=5)


# The checkpoints ``fail_after_steps`` stores, in the order they finish: (name, result).
STEPS = [
    ("charge", {"id": "ch_1", "amount": 12.5}),
    ("invoice", {"number": "INV-7", "lines": ["x" * 40, "y" * 40]}),  # JSON past 80 characters
    ("email", None),
]


def fail_after_steps(service: ReliableExecutor, task_id: str = "t-steps") -> None:
    """Submit ``task_id`` to queue "steps" (POPULATED's due tasks are in other queues) and run
    it once: it stores the STEPS' checkpoints, then raises (no retry left: FAILED)."""
    service.submit("contract.hook", None, task_id=task_id, retry_limit=0, queue="steps")

    def handler(context: Any) -> Any:
        for name, result in STEPS:
            context.step(name, lambda result=result: result)
        raise ValueError("after the steps")

    HOOKS[task_id] = handler
    try:
        assert run_one(service, "steps") is TaskStatus.FAILED
    finally:
        HOOKS.pop(task_id, None)


def wait_for_event(
    service: ReliableExecutor, task_id: str = "t-waits", event: str = "approved"
) -> None:
    """Submit ``task_id`` to queue "waits" and run it once: it stores a step, then waits for
    ``event`` (PENDING, TaskInfo.waiting set); resumed, it returns the event's payload."""
    service.submit("contract.hook", None, task_id=task_id, queue="waits")

    def handler(context: Any) -> Any:
        context.step("charge", lambda: {"id": "ch_1"})
        return {"payload": context.wait_for_event(event)}

    HOOKS[task_id] = handler
    assert run_one(service, "waits") is TaskStatus.PENDING


# -- schedules --------------------------------------------------------------------------------
def fire_schedule(service: ReliableExecutor, schedule_id: str, planned: dt.datetime) -> str:
    """Store the fire of ``schedule_id`` at ``planned`` as the master's round does (through the
    storage's ``fire_schedules``), leaving its next run as it was. Returns the task id."""
    from django_reliable_executor.master.schedule_firing import fire_task
    from django_reliable_executor.schedules.records import ScheduleFire

    schedule = service.get_schedule(schedule_id)
    assert schedule is not None
    now = service.clock.now()
    task = fire_task(schedule, planned, now)
    fire = ScheduleFire(
        schedule_id=schedule_id,
        expected_next_run_at=schedule.next_run_at,
        next_run_at=schedule.next_run_at,
        tasks=(task,),
        last_run_at=planned,
        last_task_id=task.task_id,
    )
    assert [t.task_id for t in service.storage.fire_schedules([fire], now)] == [task.task_id]
    return task.task_id


# The schedules ``populate_schedules`` makes, by id: (paused, status of the last fire's task).
SCHEDULES = {
    "a-hourly": (False, TaskStatus.FAILED),
    "b-nightly": (False, TaskStatus.CREATED),
    "c-paused": (True, None),
    "d-weekly": (False, TaskStatus.COMPLETED),
}


def populate_schedules(service: ReliableExecutor) -> dict[str, list[str]]:
    """The SCHEDULES, each in a queue of its own, fired at planned times in the past; returns
    each one's fired task ids, newest first. a-hourly fired twice: COMPLETED then FAILED."""
    hook = "contract.hook"
    hour = dt.timedelta(hours=1)
    base = service.clock.now().replace(microsecond=0) - 3 * hour
    service.schedule(
        "a-hourly",
        hook,
        {"report": "hourly", "formats": ["pdf", "csv"]},
        every=3600,
        queue="sched-a",
        retry_limit=0,
    )
    service.schedule(
        "b-nightly", hook, {"n": 2}, cron="0 3 * * *", timezone="Europe/Paris", queue="sched-b"
    )
    service.schedule("c-paused", hook, None, every=60, queue="sched-c")
    assert service.pause_schedule("c-paused") is not None
    service.schedule("d-weekly", "demo.echo", {"w": 1}, every=7 * 86400, queue="sched-d")
    fired: dict[str, list[str]] = {name: [] for name in SCHEDULES}
    first = fire_schedule(service, "a-hourly", base)
    assert run_one(service, "sched-a") is TaskStatus.COMPLETED
    second = fire_schedule(service, "a-hourly", base + hour)
    HOOKS[second] = boom
    assert run_one(service, "sched-a") is TaskStatus.FAILED
    fired["a-hourly"] = [second, first]
    fired["b-nightly"] = [fire_schedule(service, "b-nightly", base + 2 * hour)]
    fired["d-weekly"] = [fire_schedule(service, "d-weekly", base)]
    assert run_one(service, "sched-d") is TaskStatus.COMPLETED
    # A task of the same name that no schedule fired: never listed as a fire.
    service.submit(hook, None, task_id="a-hourly-by-hand", queue="elsewhere")
    return fired


BATCH_MEMBERS = ["m-ok", "m-fail", "m-timeout-like", "m-cancel"]
BATCH_FAILED = ["m-fail", "m-timeout-like"]


def batch_member(task_id: str, **options: Any) -> TaskSubmitRequest:
    """A task of the batch's own queue (the admin's usual tasks are in "default" and "emails")."""
    return TaskSubmitRequest("contract.hook", None, task_id=task_id, queue="batch", **options)


@contextlib.contextmanager
def finished_batch(service: ReliableExecutor) -> Iterator[ReliableExecutor]:
    """Add a finished batch "imp/1" (an odd id) of one completed, two failed and one cancelled
    member, whose on_complete callback "cb-done" waits to run (on_success "cb-ok" never is
    submitted); the failing hooks are removed afterwards."""
    service.submit_batch(
        [batch_member(i, retry_limit=0) for i in BATCH_MEMBERS],
        batch_id="imp/1",
        on_complete=batch_member("cb-done"),
        on_success=batch_member("cb-ok"),
    )
    for task_id in BATCH_FAILED:
        HOOKS[task_id] = boom
    try:
        assert service.cancel_task("m-cancel")
        run_claims(service, service.storage.claim("w1", ["batch"], 50, LEASE))
        assert service.get_batch("imp/1").finished
        yield service
    finally:
        for task_id in BATCH_FAILED:
            HOOKS.pop(task_id, None)


def message_texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"

LIST_PATH = "/admin/django_reliable_executor/reliabletask/"


def showcase(service: ReliableExecutor) -> None:
    """Tasks an operator would meet, run through the demo's real handlers where they finish."""
    service.submit(
        "demo.process_order", {"order_id": 1041, "amount": 59.9}, task_id="order-1041-pay"
    )
    assert run_one(service, worker="web-1:4242") is TaskStatus.COMPLETED
    service.submit(
        "demo.echo",
        {"to": "ada@example.com", "template": "receipt", "order_id": 1041},
        task_id="email-receipt-1041",
        queue="emails",
    )
    assert run_one(service, "emails", "web-2:5150") is TaskStatus.COMPLETED
    service.submit(
        "demo.process_order", {"order_id": 1042, "amount": -5.0}, task_id="order-1042-pay"
    )
    assert run_one(service, worker="web-1:4242") is TaskStatus.FAILED  # PaymentDeclined
    service.submit(
        "demo.always_fails",
        {"week": "2024-W18"},
        task_id="report-2024-w18",
        queue="reports",
        retry_limit=0,
    )
    assert run_one(service, "reports", "web-1:4242") is TaskStatus.FAILED
    service.submit(
        "demo.flaky",
        {"fail_times": 3},
        task_id="sync-inventory-17",
        retry_limit=5,
        retry_interval=600_000,
        retry_backoff="exponential",
    )
    assert run_one(service, worker="web-1:4242") is TaskStatus.PENDING
    service.submit("demo.slow", {"seconds": 30}, task_id="export-customers", priority=5)
    exporting = claim_and_start(service.storage, worker="web-1:4242")
    report = make_progress(1840, 5000, "customers exported", service.clock.now())
    assert service.storage.record_progress([(exporting, report)]) == 1
    service.submit(
        "demo.echo", {"order_id": 1040}, task_id="order-1040-refund", delay_millis=60_000
    )
    assert service.cancel_task("order-1040-refund")
    service.submit(
        "demo.echo",
        {"to": "grace@example.com", "template": "welcome"},
        task_id="email-welcome-88",
        queue="emails",
        delay_millis=600_000,
    )
    service.submit(
        "demo.process_order", {"order_id": 1044, "amount": 18.0}, task_id="order-1044-pay"
    )
    storage = service.storage
    storage.worker_seen(
        "web-1:4242", {"hostname": "web-1", "pid": 4242, "queues": ["default", "reports"]}
    )
    storage.worker_seen("web-2:5150", {"hostname": "web-2", "pid": 5150, "queues": ["emails"]})
    assert storage.acquire_lock("master", "web-1:4242", 60)


CHROMIUM = os.environ.get("RE_CHROMIUM", "/usr/bin/chromium")


def require_browser() -> Any:
    """The Playwright entry point; skips locally, fails under CI, without it or the browser."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "the playwright package (pip install -e '.[test]')"
    else:
        if os.path.exists(CHROMIUM):
            return sync_playwright
        missing = f"Chromium at {CHROMIUM} (apt-get install chromium)"
    if IN_CI:
        pytest.fail(f"browser test needs {missing}")
    pytest.skip(f"browser test needs {missing}")
