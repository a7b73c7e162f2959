"""The HTTP API on every storage: the per-key cap's ``concurrency_key``, the rate limit's
``rate_key`` and debounce's options are fields of a submit like the others (a bad value is 400
naming the field and stores nothing), both keys are answered in the task, and a debounced
submit's answer says whether it joined a waiting task."""

from __future__ import annotations

import json

import pytest

from tests.support.api_support import API, HOOK


def post(client, **fields):
    body = json.dumps({"task_name": HOOK, **fields})
    return client.post(API, body.encode(), content_type="application/json")


def test_the_concurrency_key_is_stored_and_answered(service, operator):
    response = post(operator, concurrency_key="customer:42")
    assert response.status_code == 201, response.content
    assert response.json()["concurrency_key"] == "customer:42"
    [task] = service.list_tasks()
    assert task.concurrency_key == "customer:42"


def test_the_rate_key_is_stored_and_answered(service, operator):
    response = post(operator, rate_key="customer:42")
    assert response.status_code == 201, response.content
    answered = response.json()
    assert (answered["rate_key"], answered["concurrency_key"]) == ("customer:42", None)
    [task] = service.list_tasks()
    assert task.rate_key == "customer:42"
    assert operator.get(f"{API}{task.task_id}/").json()["rate_key"] == "customer:42"
    assert post(operator).json()["rate_key"] is None


def test_submits_of_a_fair_name_are_claimed_in_turn(service, operator):
    """demo.fair (fairness="round_robin") through the API: A's three, then B's one; B's
    task shares A's first round."""
    for key in ("A", "A", "A", "B"):
        body = json.dumps(
            {"task_name": "demo.fair", "task_parameter": {"tenant": key}, "concurrency_key": key}
        )
        response = operator.post(API, body.encode(), content_type="application/json")
        assert response.status_code == 201, response.content
    claims = [c for i in range(4) for c in service.storage.claim(f"w{i}", ["default"], 1, 60)]
    assert [c.task.parameter["tenant"] for c in claims] == ["A", "B", "A", "A"]


def test_a_debounced_submit_joins_the_waiting_task(service, operator):
    first = post(operator, task_parameter=1, debounce=30, unique_key="doc:1")
    assert first.status_code == 201, first.content
    assert first.json()["debounced"] is False
    again = post(operator, task_parameter=2, debounce=30, unique_key="doc:1")
    assert again.status_code == 201, again.content
    body = again.json()
    assert (body["task_id"], body["debounced"], body["parameter"]) == (
        first.json()["task_id"],
        True,
        2,
    )
    [task] = service.list_tasks()
    assert task.parameter == 2


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"concurrency_key": ""}, "concurrency_key"),
        ({"concurrency_key": 7}, "concurrency_key"),
        ({"debounce": -1}, "debounce"),
        ({"debounce": "soon"}, "debounce"),
        ({"debounce_max_wait": 5}, "debounce_max_wait"),
        ({"debounce": 10, "debounce_max_wait": 1}, "debounce_max_wait"),
        ({"debounce": 10, "unique_for": 60}, "unique_for"),
        ({"debounce": 10, "delay_millis": 100}, "delay_millis"),
        ({"fairness": "round_robin"}, "fairness"),  # the handler's, not a submit's
    ],
)
def test_a_bad_flow_control_field_is_400_and_stores_nothing(service, operator, fields, field):
    response = post(operator, **fields)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert service.list_tasks() == []
