"""Durable steps through the HTTP API, on every storage: a task's JSON lists its steps, and
``POST tasks/<id>/retry/`` with ``{"from_step": name}`` retries it from that step (session and
signed requests alike); an unknown step is 409 naming it, a bad body 400."""

from __future__ import annotations

import pytest

from django_reliable_executor.core.states import TaskStatus
from tests.support.admin_support import STEPS, fail_after_steps
from tests.support.api_support import API, post_json, signed_post

ALL = [name for name, _ in STEPS]


def step_names(service, task_id="t-steps"):
    return [step.name for step in service.get_task(task_id).steps]


def test_the_task_json_lists_its_steps_in_finishing_order(service, operator):
    fail_after_steps(service)
    steps = operator.get(f"{API}t-steps/").json()["steps"]
    assert [step["name"] for step in steps] == ALL
    assert all(step["finished_at"] for step in steps)


def test_retry_from_a_step_discards_it_and_the_later_ones(service, operator):
    fail_after_steps(service)
    response = post_json(operator, f"{API}t-steps/retry/", {"from_step": "invoice"})
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["retried"] is True and answer["task"]["status"] == "PENDING"
    assert [step["name"] for step in answer["task"]["steps"]] == ["charge"]
    assert step_names(service) == ["charge"]


def test_retry_from_a_step_sent_as_a_form(service, operator):
    fail_after_steps(service)
    response = operator.post(f"{API}t-steps/retry/", {"from_step": "email"})  # multipart
    assert response.status_code == 200, response.content
    assert step_names(service) == ["charge", "invoice"]


def test_a_bare_form_post_retries_keeping_every_step(service, operator):
    fail_after_steps(service)
    response = operator.post(f"{API}t-steps/retry/")  # an empty multipart form
    assert response.status_code == 200, response.content
    assert step_names(service) == ALL


def test_a_signed_retry_from_a_step(service, client):
    fail_after_steps(service)
    response = signed_post(client, f"{API}t-steps/retry/", {"from_step": "email"})
    assert response.status_code == 200, response.content
    assert step_names(service) == ["charge", "invoice"]


@pytest.mark.parametrize("body", [None, {}, {"from_step": None}])
def test_a_retry_without_from_step_keeps_every_step(service, operator, body):
    fail_after_steps(service)
    response = post_json(operator, f"{API}t-steps/retry/", body)
    assert response.status_code == 200, response.content
    assert step_names(service) == ALL


def test_retry_from_an_unknown_step_is_409_naming_it_and_changes_nothing(service, operator):
    fail_after_steps(service)
    response = post_json(operator, f"{API}t-steps/retry/", {"from_step": "nope"})
    assert response.status_code == 409
    answer = response.json()
    assert answer["field"] == "from_step"
    assert "no checkpoint of step 'nope'" in answer["error"]
    assert "'charge', 'invoice', 'email'" in answer["error"]  # the steps it has
    assert answer["task"]["status"] == "FAILED"
    assert service.get_task("t-steps").status is TaskStatus.FAILED
    assert step_names(service) == ALL


def test_retry_from_a_step_of_a_task_that_cannot_be_retried_is_409(service, operator):
    fail_after_steps(service)
    assert service.retry_task("t-steps")
    response = post_json(operator, f"{API}t-steps/retry/", {"from_step": "charge"})
    assert response.status_code == 409
    assert response.json()["error"] == "task 't-steps' not retried: PENDING cannot be retried"
    assert step_names(service) == ALL


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"from_step": ""}, "from_step", "non-empty string"),
        ({"from_step": 3}, "from_step", "not int"),
        ({"from_step": "x" * 300}, "from_step", "at most"),
        ({"step": "charge"}, "step", "unknown field 'step'"),
        ([1], None, "must be a JSON object"),
        (b"{", None, "not valid JSON"),
    ],
)
def test_a_retry_body_that_names_no_step_is_400(service, operator, body, field, words):
    fail_after_steps(service)
    response = post_json(operator, f"{API}t-steps/retry/", body)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field and words in response.json()["error"]
    assert service.get_task("t-steps").status is TaskStatus.FAILED


def test_retry_from_a_step_of_an_unknown_task_is_404(service, operator):
    response = post_json(operator, f"{API}nope/retry/", {"from_step": "charge"})
    assert response.status_code == 404
