"""A task's durable steps on its admin page: the timeline of its checkpoints with the start of
each result, and the operators' "Retry from this step" button, on every storage."""

from __future__ import annotations

import re

from django_reliable_executor.core.states import TaskStatus
from tests.support.admin_support import STEPS, detail_url, fail_after_steps, message_texts


def step_names(service, task_id="t-steps"):
    return [step.name for step in service.get_task(task_id).steps]


def test_the_page_shows_each_step_with_its_finish_time_and_the_start_of_its_result(service, viewer):
    fail_after_steps(service)
    response = viewer.get(detail_url("t-steps"))
    assert response.status_code == 200
    rows = response.context["steps"]
    assert [r.name for r in rows] == [name for name, _ in STEPS]
    assert [r.finished_at for r in rows] == [
        s.finished_at for s in service.get_task("t-steps").steps
    ]
    charge, invoice, email = rows
    assert (charge.result, charge.result_cut) == ('{"amount": 12.5, "id": "ch_1"}', False)
    assert invoice.result_cut and len(invoice.result) == 80
    assert invoice.result.startswith('{"lines": ["xxxx') and invoice.result.endswith("\u2026")
    assert (email.result, email.result_cut) == ("null", False)
    html = response.content.decode()
    assert 'id="re-steps"' in html and "<code>invoice</code>" in html
    assert "re-retry-from-step" not in html  # a viewer cannot retry


def test_a_task_without_steps_has_no_timeline(service, viewer):
    response = viewer.get(detail_url("t-failed"))
    assert response.context["steps"] == []
    assert 'id="re-steps"' not in response.content.decode()


def test_an_operator_sees_a_retry_button_per_step_only_on_a_task_that_can_be_retried(
    service, operator
):
    fail_after_steps(service)
    html = operator.get(detail_url("t-steps")).content.decode()
    posted = re.findall(r'name="step" value="([^"]*)"', html)
    assert posted == [name for name, _ in STEPS]
    assert html.count("Retry from this step") == len(STEPS)
    assert service.retry_task("t-steps")  # PENDING now: no retry applies
    html = operator.get(detail_url("t-steps")).content.decode()
    assert 'id="re-steps"' in html and "re-retry-from-step" not in html


def test_retry_from_a_step_discards_it_and_the_later_ones_and_says_so(service, operator):
    fail_after_steps(service)
    response = operator.post(
        detail_url("t-steps"), {"action": "retry_from_step", "step": "invoice"}
    )
    assert response.status_code == 302 and response["Location"] == detail_url("t-steps")
    assert message_texts(response)[-1] == "1 task retried from step 'invoice'."
    assert service.get_task("t-steps").status is TaskStatus.PENDING
    assert step_names(service) == ["charge"]


def test_retry_from_an_unknown_step_changes_nothing_and_says_why(service, operator):
    fail_after_steps(service)
    response = operator.post(detail_url("t-steps"), {"action": "retry_from_step", "step": "nope"})
    assert message_texts(response)[-1] == (
        "0 tasks retried from step 'nope'; 1 skipped: 1 no checkpoint of step 'nope'."
    )
    assert service.get_task("t-steps").status is TaskStatus.FAILED
    assert step_names(service) == [name for name, _ in STEPS]


def test_retry_from_a_step_of_a_task_that_cannot_be_retried_changes_nothing(service, operator):
    fail_after_steps(service)
    assert service.retry_task("t-steps")
    response = operator.post(detail_url("t-steps"), {"action": "retry_from_step", "step": "charge"})
    assert message_texts(response)[-1] == (
        "0 tasks retried from step 'charge'; 1 skipped: 1 PENDING cannot be retried."
    )
    assert step_names(service) == [name for name, _ in STEPS]


def test_retry_from_a_step_with_no_step_named_is_refused(service, operator):
    fail_after_steps(service)
    response = operator.post(detail_url("t-steps"), {"action": "retry_from_step"})
    assert message_texts(response)[-1] == (
        "0 tasks retried from step ''; 1 skipped: 1 from_step must be a non-empty string."
    )
    assert service.get_task("t-steps").status is TaskStatus.FAILED


def test_a_viewer_cannot_retry_from_a_step(service, viewer):
    fail_after_steps(service)
    response = viewer.post(detail_url("t-steps"), {"action": "retry_from_step", "step": "charge"})
    assert response.status_code == 403
    assert service.get_task("t-steps").status is TaskStatus.FAILED
    assert step_names(service) == [name for name, _ in STEPS]
