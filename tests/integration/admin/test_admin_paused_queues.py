"""The admin summary's paused queues on every storage: each queue row says whether it is paused
and (for operators) has a pause or resume button; what viewers see and may do is in
tests/integration/test_permissions.py."""

from __future__ import annotations

from django.test import Client

from django_reliable_executor.core.states import TaskStatus
from tests.support.admin_support import LIST_URL, make_user, message_texts


def queue_rows(response):
    return {row.queue: row.paused for row in response.context["summary"]["queues"]}


def test_operators_pause_and_resume_a_queue_from_the_summary(service, operator):
    service.submit("contract.hook", None, task_id="e-now", queue="emails")
    page = operator.get(LIST_URL)
    assert queue_rows(page) == {"default": False, "emails": False}
    html = page.content.decode()
    assert 'aria-label="Pause queue emails"' in html and 'aria-label="Pause queue default"' in html
    assert 'id="re-paused-queues"' not in html

    response = operator.post(LIST_URL, {"queue_action": "pause", "queue": "emails"}, follow=True)
    assert message_texts(response) == [
        "Queue emails paused: no worker claims its tasks until it is resumed (running ones "
        "finish, new ones are accepted and wait)."
    ]
    assert service.paused_queues() == {"emails"}
    assert queue_rows(response) == {"default": False, "emails": True}
    html = response.content.decode()
    assert 'aria-label="Resume queue emails"' in html
    assert 'aria-label="Pause queue emails"' not in html
    assert "<strong>Paused queues:</strong> emails" in html
    # The waiting task of the paused queue stays waiting: no claim takes it.
    assert service.storage.claim("w1", ["emails"], 10, 60) == []

    again = operator.post(LIST_URL, {"queue_action": "pause", "queue": "emails"}, follow=True)
    assert message_texts(again) == ["Queue emails was paused already."]

    response = operator.post(LIST_URL, {"queue_action": "resume", "queue": "emails"}, follow=True)
    assert message_texts(response) == ["Queue emails resumed: workers claim its tasks again."]
    assert service.paused_queues() == set()
    assert [c.task_id for c in service.storage.claim("w1", ["emails"], 10, 60)] == ["e-now"]


def test_a_paused_queue_without_tasks_is_still_listed_to_resume_it(service, operator):
    service.submit("contract.hook", None, task_id="only", queue="reports")
    service.pause_queue("reports")
    service.cancel_task("only")
    service.purge_finished(service.clock.now().replace(year=2100), statuses=[TaskStatus.CANCELLED])
    page = operator.get(LIST_URL)
    assert queue_rows(page)["reports"] is True
    assert 'aria-label="Resume queue reports"' in page.content.decode()


def test_bad_or_unknown_queue_names_are_refused_with_the_rule(service, operator):
    response = operator.post(LIST_URL, {"queue_action": "pause", "queue": "mial"}, follow=True)
    assert message_texts(response) == [
        "Queue not changed: unknown queue 'mial': no registered handler, stored task, live "
        "worker or schedule uses it."
    ]
    response = operator.post(LIST_URL, {"queue_action": "pause", "queue": "a b"}, follow=True)
    assert message_texts(response)[0].startswith(
        "Queue not changed: queue must be 1..100 characters without whitespace or commas"
    )
    response = operator.post(LIST_URL, {"queue_action": "stop", "queue": "emails"}, follow=True)
    assert message_texts(response) == ["Choose pause or resume: no queue was changed."]
    assert service.paused_queues() == set()


def test_the_buttons_need_the_csrf_token(service):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(make_user("op", "view_reliabletask", "operate_reliabletask"))
    response = strict.post(LIST_URL, {"queue_action": "pause", "queue": "emails"})
    assert response.status_code == 403
    assert service.paused_queues() == set()
