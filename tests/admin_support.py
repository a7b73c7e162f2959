"""Helpers of the admin tests: the store under test, users with permissions, a set of tasks in
every state, made through the service and the storage's real transitions."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_reliable_executor.execution import TaskRunner
from django_reliable_executor.service import ReliableExecutor, executor
from django_reliable_executor.states import TaskStatus
from tests.conftest import BACKENDS, REDIS_URL, TASK_APPS, delete_prefix, redis_client, require
from tests.contract_support import HOOKS, LEASE, claim_and_start, claim_one

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
def executor_on(backend: str) -> Iterator[ReliableExecutor]:
    """Point the module-level executor (the one the admin uses) at ``backend``: a database
    alias, or "redis" under a key prefix of its own, deleted afterwards."""
    require(backend)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    if backend == "redis":
        config = {"STORAGE": "redis", "REDIS_URL": REDIS_URL, "KEY_PREFIX": prefix}
    else:
        config = {"DATABASE_ALIAS": backend}
    try:
        with override_settings(RELIABLE_EXECUTOR=config):
            yield executor
    finally:
        if backend == "redis":
            client = redis_client()
            delete_prefix(client, prefix)
            client.close()


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
    return TaskRunner(service, LEASE).run(claim_one(service.storage, worker, queue))


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
