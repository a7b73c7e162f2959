"""The admin's batch page on every storage (SQLite, MariaDB, PostgreSQL, Redis), through Django's
test client with real users and permissions: counts, progress, links to the members by status,
the callbacks, the task list's batch filter, and the bulk retry of the failed members."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.messages import get_messages
from django.urls import reverse

from django_reliable_executor.core.states import TaskStatus
from tests.support.admin_support import (
    BATCH_FAILED,
    BATCH_MEMBERS,
    LIST_URL,
    detail_url,
    finished_batch,
    make_user,
)
from tests.support.contract_support import HOOKS, LEASE, run_claims

MEMBERS = BATCH_MEMBERS
FAILED = BATCH_FAILED


def batch_url(batch_id: str) -> str:
    return reverse("admin:django_reliable_executor_reliabletask_batch", args=[quote(batch_id)])


def run_all(service: Any) -> None:
    run_claims(service, service.storage.claim("w1", ["batch"], 50, LEASE))


def statuses(service: Any, task_ids: list[str]) -> dict[str, TaskStatus]:
    return {task_id: info.status for task_id, info in service.storage.get_many(task_ids).items()}


def message_texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def listed(response: Any) -> list[str]:
    return sorted(row.task.task_id for row in response.context["rows"])


@pytest.fixture
def service(service):
    """The module executor on the backend under test: the admin's usual tasks and the finished
    batch "imp/1" of ``finished_batch`` (tests/support/admin_support.py): the folder's
    ``service`` (tests/integration/admin/conftest.py), with the batch added."""
    with finished_batch(service):
        yield service


def test_batch_page_shows_counts_progress_and_callbacks(service, viewer):
    response = viewer.get(batch_url("imp/1"))
    assert response.status_code == 200
    counts = {label: count for label, count, _ in response.context["counts"]}
    assert counts == {"Total": 4, "Completed": 1, "Failed": 2, "Cancelled": 1, "Pending": 0}
    assert response.context["percent"] == 100
    content = response.content.decode()
    assert '<progress max="100" value="100"' in content
    assert 'data-count="failed"><a href=' in content
    shown = {c.role: (c.task_id, c.status) for c in response.context["callbacks"]}
    assert shown["on_complete"][0] == "cb-done"
    assert shown["on_complete"][1] in (TaskStatus.CREATED, TaskStatus.PENDING)
    assert shown["on_success"] == ("cb-ok", None)  # never submitted: a member failed
    assert f'href="{detail_url("cb-done")}"' in content


def test_count_links_list_the_members_of_each_status(service, viewer):
    links = {label: url for label, _, url in viewer.get(batch_url("imp/1")).context["counts"]}
    assert "batch_id=imp%2F1" in links["Failed"] and "status=dead" in links["Failed"]
    assert listed(viewer.get(links["Failed"])) == sorted(FAILED)
    assert listed(viewer.get(links["Completed"])) == ["m-ok"]
    assert listed(viewer.get(links["Cancelled"])) == ["m-cancel"]
    # The whole batch: its members and its callback (which carries its id), no other task.
    assert listed(viewer.get(links["Total"])) == sorted([*MEMBERS, "cb-done"])


def test_task_list_batch_filter_in_the_sidebar_and_without_a_total(service, viewer):
    response = viewer.get(LIST_URL, {"batch_id": "imp/1", "status": "FAILED"})
    assert listed(response) == sorted(FAILED)
    assert response.context["total"] is None
    titles = [choice["title"] for choice in response.context["filter_choices"]]
    assert "batch id" in titles
    assert listed(viewer.get(LIST_URL, {"batch_id": "nope"})) == []


def test_a_task_page_links_to_its_batch(service, viewer):
    content = viewer.get(detail_url("m-ok")).content.decode()
    assert f'href="{batch_url("imp/1")}"' in content
    assert batch_url("imp/1") not in viewer.get(detail_url("t-completed")).content.decode()


def test_an_unknown_batch_goes_back_to_the_list(service, viewer):
    response = viewer.get(batch_url("nope"), follow=True)
    assert response.redirect_chain[-1][0] == LIST_URL
    assert message_texts(response) == ["No batch has the id 'nope'."]


def test_bulk_retry_moves_exactly_the_failed_members_back_to_pending(service, operator):
    assert b'id="re-retry-failed"' in operator.get(batch_url("imp/1")).content
    before = statuses(service, [*MEMBERS, "cb-done", "t-failed", "t-failed-emails"])
    response = operator.post(batch_url("imp/1"), {"action": "retry_failed"}, follow=True)
    assert response.redirect_chain[-1][0] == batch_url("imp/1")
    assert message_texts(response) == [
        "2 tasks retried. The batch stays finished: its callbacks do not run again."
    ]
    after = statuses(service, [*MEMBERS, "cb-done", "t-failed", "t-failed-emails"])
    changed = {task_id for task_id in after if after[task_id] != before[task_id]}
    assert changed == set(FAILED)
    assert {after[task_id] for task_id in FAILED} == {TaskStatus.PENDING}
    batch = service.get_batch("imp/1")
    assert (batch.failed, batch.pending, batch.finished) == (0, 2, True)

    # They now succeed: counted again, and the finished batch fires no callback a second time.
    for task_id in FAILED:
        HOOKS.pop(task_id)
    run_all(service)
    batch = service.get_batch("imp/1")
    assert (batch.completed, batch.failed, batch.pending) == (3, 0, 0)
    assert statuses(service, ["cb-done", "cb-ok"]) == {"cb-done": TaskStatus.COMPLETED}
    again = operator.post(batch_url("imp/1"), {"action": "retry_failed"}, follow=True)
    assert message_texts(again) == ["No failed member to retry."]


def test_bulk_retry_needs_the_csrf_token(service):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(make_user("op", "view_reliabletask", "operate_reliabletask"))
    assert strict.post(batch_url("imp/1"), {"action": "retry_failed"}).status_code == 403
    assert set(statuses(service, FAILED).values()) == {TaskStatus.FAILED}
