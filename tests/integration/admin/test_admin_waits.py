"""A waiting task (a durable wait) on its admin page, on every storage: what it waits for and
until when, its attempts and resumptions, and the operators' "Send event" form, which resumes
it; a viewer sees the wait but no form, and a post without the operate permission is refused."""

from __future__ import annotations

from django_reliable_executor.core.states import TaskStatus
from tests.support.admin_support import detail_url, message_texts, run_one, wait_for_event
from tests.support.contract_support import HOOKS


def test_the_page_says_what_a_waiting_task_waits_for(service, viewer):
    wait_for_event(service)
    response = viewer.get(detail_url("t-waits"))
    assert response.status_code == 200
    waiting = response.context["waiting"]
    assert (waiting["kind"], waiting["event"], waiting["until"]) == ("event", "approved", None)
    html = response.content.decode()
    assert 'id="re-waiting"' in html and "event <code>approved</code>" in html
    assert "when its event arrives" in html
    assert "resumed 1 time" in html
    assert 'id="re-send-event"' not in html  # a viewer cannot send one
    # The wait's record is in the step timeline, after the step before it.
    assert [r.name for r in response.context["steps"]] == ["charge", "approved"]


def test_an_operator_sends_the_event_and_the_task_resumes_with_its_payload(service, operator):
    wait_for_event(service)
    html = operator.get(detail_url("t-waits")).content.decode()
    assert 'id="re-send-event"' in html and 'value="approved"' in html
    response = operator.post(
        detail_url("t-waits"),
        {"action": "send_event", "event": "approved", "payload": '{"by": "ann"}'},
    )
    assert response.status_code == 302 and response["Location"] == detail_url("t-waits")
    assert message_texts(response)[-1] == "Event 'approved' sent."
    try:
        assert run_one(service, "waits") is TaskStatus.COMPLETED
    finally:
        HOOKS.pop("t-waits", None)
    task = service.get_task("t-waits")
    assert task.result == {"payload": {"by": "ann"}} and task.waiting is None


def test_a_bad_payload_or_name_is_refused_and_nothing_is_stored(service, operator):
    wait_for_event(service)
    for form, said in (
        ({"event": "approved", "payload": "{not json"}, "the payload is not JSON"),
        ({"event": "", "payload": ""}, "event name must be a non-empty string"),
    ):
        response = operator.post(detail_url("t-waits"), {"action": "send_event", **form})
        assert said in message_texts(response)[-1]
    assert service.storage.task_events("t-waits") == {}
    assert service.get_task("t-waits").status is TaskStatus.PENDING


def test_an_event_to_an_ended_task_is_not_sent_and_says_why(service, operator):
    response = operator.post(
        detail_url("t-failed"), {"action": "send_event", "event": "x", "payload": "1"}
    )
    assert message_texts(response)[-1] == "Event 'x' not sent: the task has ended (or is gone)."
    assert service.storage.task_events("t-failed") == {}


def test_a_viewer_cannot_send_an_event(service, viewer):
    wait_for_event(service)
    response = viewer.post(
        detail_url("t-waits"), {"action": "send_event", "event": "approved", "payload": "1"}
    )
    assert response.status_code == 403
    assert service.storage.task_events("t-waits") == {}
