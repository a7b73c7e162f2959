"""Durable waits through the HTTP API, on every storage: a waiting task's JSON says what it
waits for and how often it was resumed, and ``POST tasks/<id>/events/<name>/`` sends it an
event (JSON body ``{"payload": ...}``, or none), session and signed requests alike: 404 for an
unknown task, 409 for an ended one, 400 for a body or payload that cannot be one."""

from __future__ import annotations

import pytest

from django_reliable_executor.core.states import TaskStatus
from tests.support.admin_support import run_one, wait_for_event
from tests.support.api_support import API, post_json, signed_post
from tests.support.contract_support import HOOKS


def test_a_waiting_task_s_json_says_what_it_waits_for(service, operator):
    wait_for_event(service)
    task = operator.get(f"{API}t-waits/").json()
    assert task["status"] == "PENDING" and task["attempts"] == 0 and task["resumptions"] == 1
    assert task["waiting"] == {
        "kind": "event",
        "name": "approved",
        "until": None,
        "event": "approved",
        "task_ids": [],
    }


def test_an_event_resumes_the_task_with_its_payload(service, operator):
    wait_for_event(service)
    response = post_json(operator, f"{API}t-waits/events/approved/", {"payload": [1, "a"]})
    assert response.status_code == 200, response.content
    assert response.json()["sent"] is True
    try:
        assert run_one(service, "waits") is TaskStatus.COMPLETED
    finally:
        HOOKS.pop("t-waits", None)
    assert service.get_task("t-waits").result == {"payload": [1, "a"]}


def test_an_event_without_a_body_has_a_null_payload_and_a_second_keeps_the_first(service, operator):
    wait_for_event(service)
    assert operator.post(f"{API}t-waits/events/approved/").status_code == 200
    again = post_json(operator, f"{API}t-waits/events/approved/", {"payload": 2})
    assert again.status_code == 200
    assert service.storage.task_events("t-waits") == {"approved": None}


def test_a_signed_event(service, client):
    wait_for_event(service)
    response = signed_post(client, f"{API}t-waits/events/approved/", {"payload": "ok"})
    assert response.status_code == 200, response.content
    assert service.storage.task_events("t-waits") == {"approved": "ok"}


def test_an_unknown_task_is_404_and_an_ended_one_409(service, operator):
    assert post_json(operator, f"{API}nobody/events/go/", {}).status_code == 404
    service.submit("contract.hook", None, task_id="over", queue="waits")
    assert run_one(service, "waits") is TaskStatus.COMPLETED
    response = post_json(operator, f"{API}over/events/go/", {"payload": 1})
    assert response.status_code == 409
    assert response.json()["error"] == "task 'over' has ended: event 'go' not sent"
    assert service.storage.task_events("over") == {}


@pytest.mark.parametrize(
    "body, field",
    [
        (b"[1]", None),
        (b'{"payload": 1, "other": 2}', "other"),
        (b"{not json", None),
        (b'{"payload": "a\\u0000b"}', "payload"),
    ],
)
def test_a_bad_body_is_400_and_stores_nothing(service, operator, body, field):
    wait_for_event(service)
    response = operator.post(
        f"{API}t-waits/events/approved/", body, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert service.storage.task_events("t-waits") == {}
    assert service.get_task("t-waits").status is TaskStatus.PENDING
